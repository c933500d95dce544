"""The RL loop on one GPU, per model shape and weight transport: reward, step time, weight sync.

Each (shape, transport) pair runs flow `rl` on the repeat task with vLLM and the trainer sharing
GPU 0, one after the other in this process. Weight sync per step = the trainer's publish (save
files, or copy into the cuda_ipc buffer) + the controller's broadcast (find the weights, pause,
load on the replica, resume), medians after `--warmup` steps. vLLM's start time and KV cache come
from the replica's log. Shapes are random-init Llamas with the tiny character tokenizer padded to
`vocab` (so nothing comes from a hub): `05b` and `15b` have Qwen2-0.5B's and -1.5B's bodies.

    python benchmarks/gpu_loop.py --shapes tiny,05b --transports filesystem,cuda_ipc \\
        --out benchmarks/results/gpu_loop_h100.json -- --wandb.mode disabled
    python benchmarks/gpu_loop.py --shapes 05b --transports cuda_ipc --levels 0,1 --out ...  # async
    python benchmarks/gpu_loop.py --shapes 05b --transports nccl --kill-trainer-at 12 --out ...
    python benchmarks/gpu_loop.py --shapes moe,moe_dense --transports cuda_ipc --steps 10 --out ...
    python benchmarks/gpu_loop.py --shapes 15b --transports cuda_ipc --out ... -- --trainer.lora.rank 16

`moe` is a small Qwen3-MoE (8 experts, top-2, every layer sparse) and `moe_dense` the Llama with
the same parameters per token (SHAPES says how); with both in the JSON, `moe_vs_dense` holds the
ratios of their step, trainer, sampling and sync medians. A MoE run also has the trainer's router
load balance (`router_median`, `router_last`: rlfleet/trainer/router.py's router/* metrics).
Each run records its model's parameters (`params`: total, and active per token).

On two visible GPUs vLLM takes GPU 0 and the trainer GPU 1 (nccl sends between them).
`--kill-trainer-at N` SIGKILLs the trainer's process group once it reports step N done (an nccl
trainer is then sending step N's weights) and records how long the run took to train step N+1;
`--kill-replica-at N` does the same to vLLM replica 0 (relaunched, then brought to the served
weights: cuda_ipc maps the trainer's buffer again, nccl regroups).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from common import median, rl_config, run_rl, table_of, tiny_model, trainer_metrics, write

from rlfleet.store import RunDir, layout
from rlfleet.trainer.shapes import BODIES

SHAPES: dict[str, dict[str, Any]] = {"tiny": {}, **BODIES}  # make_tiny_model's keywords
COLS = {"first3_reward": "reward first-3", "last3_reward": "last-3", "median_step_s": "step s"}
COLS |= {"steps_per_min": "steps/min", "median_sync_s": "sync s", "median_sample_s": "sampling s"}
COLS |= {"median_trainer_s": "trainer s", "kv_cache_tokens": "KV tokens"}
ROUTER = {"router/max_vio": "max_vio", "router/load_cv": "load_cv", "router/dead_experts": "dead experts"}
ROUTER |= {"router/tokens": "tokens/layer", "active_m": "active M", "total_m": "total M"}
MOE_X = {"median_step_s_x": "step s", "median_trainer_s_x": "trainer s", "median_sample_s_x": "sampling s"}
MOE_X |= {"median_sync_s_x": "sync s", "active_m_moe": "active M moe", "active_m_dense": "dense"}


def param_counts(model: Path) -> dict[str, int]:
    """The model's parameters, and those one token uses (a MoE's experts count top_k / experts)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.from_pretrained(model)
    with torch.device("meta"):
        lm = AutoModelForCausalLM.from_config(cfg)
    total = sum(p.numel() for p in lm.parameters())
    experts = sum(p.numel() for n, p in lm.named_parameters() if ".experts." in n)
    n, k = getattr(cfg, "num_experts", 0) or 0, getattr(cfg, "num_experts_per_tok", 0) or 0
    return {"total": total, "active": total - experts + (experts * k // n if n else experts)}


def router_balance(records: list[dict[str, Any]]) -> dict[str, Any]:
    """A MoE run's router load balance: each router/* metric's median over the steps, and the last
    step's; {} for a dense model."""
    steps = [r["router"] for r in records if r.get("router")]
    if not steps:
        return {}
    keys = sorted({k for s in steps for k in s})
    return {
        "router_median": {k: median([s[k] for s in steps if k in s]) for k in keys},
        "router_last": steps[-1],
    }


def moe_vs_dense(runs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Per `moe/...` run with its `moe_dense/...` twin: moe's medians over the dense model's."""
    out = {}
    for key, moe in runs.items():
        dense = runs.get("moe_dense/" + key.removeprefix("moe/")) if key.startswith("moe/") else None
        if dense is None:
            continue
        x = {
            f"{m}_x": moe[m] / dense[m] if dense[m] else float("nan")
            for m in ("median_step_s", "median_trainer_s", "median_sample_s", "median_sync_s")
        }
        x["steps_per_min"] = {"moe": moe["steps_per_min"], "dense": dense["steps_per_min"]}
        x["params"] = {"moe": moe["params"], "dense": dense["params"]}
        out[key.removeprefix("moe/")] = x
    return out


def sync_times(out: Path, records: list[dict[str, Any]]) -> list[float]:
    """Per step: the trainer's publish + the controller's broadcast."""
    publish = {m["step"]: m.get("publish_seconds", 0.0) for m in trainer_metrics(out)}
    return [publish.get(r["step"], 0.0) + r["broadcast_seconds"] for r in records]


def steady_steps_per_min(timed: list[dict[str, Any]]) -> float:
    """From finish times (k>0 overlaps steps, so step_seconds do not add up), leaving out the last
    step, which also writes the end-of-run checkpoint (7-25 s at 0.5B-1.5B)."""
    t = timed[:-1]
    return 60 * (len(t) - 1) / (t[-1]["finished_at"] - t[0]["finished_at"])


def vllm_start(out: Path) -> dict[str, Any]:
    """KV cache size, and vLLM's own timing lines of its start (weights, compile, graph capture)."""
    log = RunDir(out).replica_log(0).read_text(errors="replace")
    kv = re.findall(r"KV cache size: ([\d,]+) tokens", log)
    timing = re.compile(r"took [\d.]+ ?s|takes [\d.]+ ?s|finished in [\d.]+ ?s|took [\d.]+ seconds")
    lines = [ln.split("] ", 1)[-1] for ln in log.splitlines() if timing.search(ln)]
    return {"kv_cache_tokens": int(kv[-1].replace(",", "")) if kv else None, "vllm_start_lines": lines[:30]}


def checkpoint_seconds(out: Path) -> dict[int, float]:
    """Seconds each checkpoint step's trainer spent on its checkpoint (the copy; the write is
    in the background, except the last step's)."""
    return {m["step"]: m["checkpoint_seconds"] for m in trainer_metrics(out) if "checkpoint_seconds" in m}


class Killer(threading.Thread):
    """SIGKILL a process group of the run (its pidfile under run/: `trainer` or `inference_0`)
    once `metrics/step_N.json` exists; remember when."""

    def __init__(self, out: Path, step: int, target: str):
        super().__init__(daemon=True)
        self.out, self.step, self.target, self.killed_at = out, step, target, None

    def run(self) -> None:
        while not (self.out / layout.step_json(layout.METRICS, self.step)).exists():
            time.sleep(0.01)
        os.killpg(int(RunDir(self.out).pidfile(self.target).read_text().split()[0]), signal.SIGKILL)
        self.killed_at = time.time()

    def report(self) -> dict[str, Any]:
        """Seconds from the kill to step N+1 trained and finished, and the run's recoveries."""
        done = json.loads((self.out / layout.SUMMARY).read_text())
        after = {r["step"]: r for r in done["steps"]}.get(self.step + 1, {})
        trained = (self.out / layout.step_json(layout.METRICS, self.step + 1)).stat().st_mtime
        return {
            "killed": self.target,
            "killed_after_step": self.step,
            "kill_to_next_trained_s": trained - self.killed_at,
            "kill_to_next_finished_s": after.get("finished_at", float("nan")) - self.killed_at,
            "recoveries": done["recoveries"],
        }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="tiny,05b")
    ap.add_argument("--transports", default="filesystem,cuda_ipc")
    ap.add_argument("--levels", default="0", help="orchestrator.max_async_level values to run")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--out", required=True)
    ap.add_argument("--work", help="keep models and run dirs here (default: a temp dir, removed)")
    ap.add_argument("--kill-trainer-at", type=int, help="SIGKILL the trainer once step N is done")
    ap.add_argument("--kill-replica-at", type=int, help="SIGKILL vLLM replica 0 once step N is done")
    a, overrides = ap.parse_known_args()
    overrides = [o for o in overrides if o != "--"]
    gpu = ["--deployment.num-inference-gpus", "1", "--deployment.num-train-gpus", "1"]
    results: dict[str, Any] = {
        "config": {"steps": a.steps, "warmup": a.warmup, "args": overrides},
        "runs": {},
    }
    with tempfile.TemporaryDirectory() as tmp_s:
        tmp = Path(a.work or tmp_s)
        for shape in a.shapes.split(","):
            model = tiny_model(tmp / shape, **SHAPES[shape])
            params = param_counts(model)
            for transport, level in [
                (t, int(k)) for t in a.transports.split(",") for k in a.levels.split(",")
            ]:
                key = f"{shape}/{transport}" + (f"/k{level}" if level else "")
                out = tmp / key.replace("/", "_")
                args = ["--max-steps", str(a.steps), "--weights.transport", transport, *gpu]
                args += ["--orchestrator.max-async-level", str(level), *overrides]
                cfg = rl_config(model, out, *args)
                killer = None
                if a.kill_trainer_at is not None:
                    killer = Killer(out, a.kill_trainer_at, "trainer")
                elif a.kill_replica_at is not None:
                    killer = Killer(out, a.kill_replica_at, "inference_0")
                if killer:
                    key += f"/kill{'' if killer.target == 'trainer' else '_replica'}{killer.step}"
                    killer.start()
                t0 = time.perf_counter()
                records, wall = run_rl(cfg)
                timed = records[a.warmup :]
                sync = sync_times(out, timed)
                run = {
                    "shape": SHAPES[shape],
                    "params": params,
                    "transport": transport,
                    "max_async_level": level,
                    "first3_reward": sum(r["mean_reward"] for r in records[:3]) / 3,
                    "last3_reward": sum(r["mean_reward"] for r in records[-3:]) / 3,
                    "median_step_s": median([r["step_seconds"] for r in timed]),
                    "steps_per_min": steady_steps_per_min(timed),
                    "median_sync_s": median(sync),
                    "median_broadcast_s": median([r["broadcast_seconds"] for r in timed]),
                    "median_sample_s": median([r["sample_seconds"] for r in timed]),
                    "median_trainer_s": median([r["trainer_seconds"] for r in timed]),
                    "flow_wall_s": wall,
                    "command_wall_s": time.perf_counter() - t0,
                    "checkpoint_s": checkpoint_seconds(out),
                    **vllm_start(out),
                    **router_balance(timed),
                    **({"kill": killer.report()} if killer else {}),
                    "records": records,
                }
                results["runs"][key] = run
                if pairs := moe_vs_dense(results["runs"]):
                    results["moe_vs_dense"] = pairs
                print(key, {k: v for k, v in run.items() if k != "records"}, flush=True)
                write(a.out, results)  # after every run: a later failure keeps what was measured
    runs = results["runs"]
    table_of(
        f"RL loop on one GPU, {a.steps} steps ({a.warmup} warm-up left out of the medians)", COLS, runs, "run"
    )
    for r in runs.values():  # the router's medians and the parameters, in millions, as columns
        r |= {f"router/{k}": v for k, v in r.get("router_median", {}).items()}
        r |= {"active_m": r["params"]["active"] / 1e6, "total_m": r["params"]["total"] / 1e6}
    if routed := {k: r for k, r in runs.items() if "router_median" in r}:
        table_of(
            "MoE router load balance (medians over the timed steps; rlfleet/trainer/router.py)",
            ROUTER,
            routed,
            "run",
        )
    for x in results.get("moe_vs_dense", {}).values():
        x |= {
            "active_m_moe": x["params"]["moe"]["active"] / 1e6,
            "active_m_dense": x["params"]["dense"]["active"] / 1e6,
        }
    if pairs := results.get("moe_vs_dense"):
        table_of(
            "MoE over the dense model of equal active parameters (ratios of medians)", MOE_X, pairs, "run"
        )


if __name__ == "__main__":
    main()
