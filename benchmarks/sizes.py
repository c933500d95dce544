"""The model sizes users bring, in the RL loop on one GPU: what the memory plan chose
(rlfleet/config/memory.py), whether it held (no run may fail for memory once started), the trainer's
peak memory, trained tokens/s and in-loop MFU.

One row a call, written to its JSON when it ends (or fails): the model is a random-init copy of
the real config (`rlfleet model NAME`, nothing from a hub), sampled to its max_tokens on the
`repeat` task, so every rollout is as long as the job allows.

    python benchmarks/sizes.py --model qwen3-8b --mode lora --out sizes_8b_lora.json
    python benchmarks/sizes.py --model qwen3-4b --mode full --max-tokens 4096 --out ...
    python benchmarks/sizes.py --model-path models/tiny --mode full --out ... -- --inference.max-model-len 256

Arguments after `--` are rl overrides.
"""

from __future__ import annotations

import argparse
import json
import re
import signal
import time
from pathlib import Path
from typing import Any

from common import median, rl_config, run_rl, steps, trainer_metrics, write

from rlfleet.store import layout
from rlfleet.trainer.shapes import make_shape_model


def trainer_lines(out: Path) -> list[str]:
    """The trainer log's sizing and checkpointing lines: what the first-batch probe confirmed."""
    logs = sorted((out / "logs").rglob("trainer*.log"))
    keep = re.compile(r"micro-batches:|activation checkpointing turned on|OutOfMemory|out of memory")
    return [ln for f in logs for ln in f.read_text(errors="replace").splitlines() if keep.search(ln)]


def row(out: Path, records: list[dict[str, Any]], wall: float, warmup: int) -> dict[str, Any]:
    metrics = trainer_metrics(out)
    timed, timed_steps = metrics[warmup:] or metrics, records[warmup:] or records
    placement = json.loads((out / layout.PLACEMENT).read_text())
    return {
        "placement": placement["describe"],
        "memory_plan": placement.get("memory", ""),
        "trainer_sizing": trainer_lines(out),
        "steps": len(records),
        "peak_memory_gib": max((m.get("peak_memory_gib", 0.0) for m in metrics), default=None),
        "train_tokens_per_s": median([m["train_tokens_per_s"] for m in timed if "train_tokens_per_s" in m]),
        "mfu": median([m["mfu"] for m in timed if "mfu" in m]),
        "activation_checkpointing": sorted({m.get("activation_checkpointing") for m in metrics} - {None}),
        "median_step_s": median([r["step_seconds"] for r in timed_steps]),
        "median_trainer_s": median([r["trainer_seconds"] for r in timed_steps]),
        "median_sample_s": median([r["sample_seconds"] for r in timed_steps]),
        "flow_wall_s": wall,
    }


def stop(*_: object) -> None:
    raise TimeoutError("the row's time limit (SIGTERM)")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", help="a name of rlfleet/trainer/shapes.py (REAL or BODIES)")
    ap.add_argument("--model-path", help="an existing model directory instead")
    ap.add_argument("--mode", choices=["full", "lora"], default="full")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--max-tokens", type=int, default=1024)
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--work", default="/tmp/sizes")
    ap.add_argument("--out", required=True)
    a, overrides = ap.parse_known_args()
    overrides = [o for o in overrides if o != "--"]
    work = Path(a.work)
    model = Path(a.model_path) if a.model_path else work / "models" / a.model
    t0 = time.perf_counter()
    if not (model / "config.json").exists():
        import torch

        make_shape_model(a.model, model, device="cuda" if torch.cuda.is_available() else "cpu")
    made_s = time.perf_counter() - t0
    name = a.model or model.name
    out = work / "runs" / f"{name}_{a.mode}"
    args = ["--max-steps", str(a.steps), "--model.dtype", "bfloat16"]
    args += ["--deployment.num-inference-gpus", "1", "--deployment.num-train-gpus", "1"]
    args += ["--orchestrator.batch-size", str(a.prompts), "--orchestrator.group-size", str(a.group)]
    args += ["--orchestrator.max-tokens", str(a.max_tokens), "--orchestrator.micro-batch-size", "null"]
    args += ["--inference.max-model-len", str(a.max_tokens + 256), "--trainer.lr", "1e-5"]
    args += ["--trainer.lora.rank", "16"] if a.mode == "lora" else []
    result: dict[str, Any] = {"model": name, "mode": a.mode, "job": vars(a) | {"overrides": overrides}}
    result["model_made_s"] = made_s
    signal.signal(signal.SIGTERM, stop)  # `timeout`: the steps done so far are still a result
    try:
        records, wall = run_rl(rl_config(model, out, *args, *overrides))
        result |= {"ok": True, **row(out, records, wall, a.warmup)}
    except Exception as e:  # noqa: BLE001 - a row that fails is a result: what the plan said and why it failed
        result |= {"ok": False, "error": f"{type(e).__name__}: {e}"[:2000]}
        try:
            result |= row(out, steps(out), float("nan"), a.warmup)
        except Exception:  # noqa: BLE001 - it failed before its placement or first step
            result["trainer_sizing"] = trainer_lines(out) if out.exists() else []
    write(a.out, result)
    print(json.dumps({k: v for k, v in result.items() if k != "job"}, indent=1))


if __name__ == "__main__":
    main()
