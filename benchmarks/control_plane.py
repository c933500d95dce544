"""Control-plane overhead of flow `rl`: step wall time minus the time inside inference, training
and broadcast, absolute and as a share of the step, plus where that remainder goes.

Runs the real flow (k = 0, sequential, so the phases do not overlap) on the tiny model with the
real vLLM CPU server and the long-lived trainer. Per step (the first is left out: it starts the
trainer) the flow records its phases' walls and the time spent inside:
  inference: `sample_seconds` (the rollout's HTTP sampling against vLLM)
  training:  the trainer's own `step_seconds` (load batch, forward/backward/AdamW, publish weights)
  broadcast: verify the published weights + pause/reload/resume on vLLM
Then a no-op task is timed the way the flow calls tasks (policy options, persisted result,
step cache key) and with no persistence and no cache, to price one Prefect task.

    python benchmarks/control_plane.py --steps 8 --out benchmarks/results/control_plane_cpu_2core.json
    python benchmarks/control_plane.py --steps 8 --batch-size 128 --out benchmarks/results/control_plane_cpu_2core_b128.json
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

from common import median, rl_config, run_rl, table, tiny_model, write
from prefect import flow, task
from prefect.cache_policies import NO_CACHE

from rlfleet.config.models import RLConfig
from rlfleet.tasks.rl import retry_options, step_key


@task(name="noop", cache_key_fn=step_key)
def noop(cfg: RLConfig, step: int) -> dict[str, Any]:
    return {"step": step}


@flow(name="noop-tasks")
def noop_flow(cfg: RLConfig, n: int, persisted: bool) -> list[float]:
    opts = dict(retry_options(cfg), refresh_cache=True) if persisted else {"cache_policy": NO_CACHE}
    out = []
    for step in range(n):
        t0 = time.perf_counter()
        noop.with_options(**opts)(cfg, step)
        out.append(time.perf_counter() - t0)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--noop-tasks", type=int, default=40)
    ap.add_argument("--batch-size", type=int, default=32, help="prompts per step: longer steps, same tasks")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp_s:
        tmp = Path(tmp_s)
        cfg = rl_config(
            tiny_model(tmp),
            tmp / "run",
            "--max-steps",
            str(a.steps),
            "--orchestrator.batch-size",
            str(a.batch_size),
        )
        records, wall = run_rl(cfg)
        noop_cfg = rl_config(Path(cfg.model.path), tmp / "noop")
        noop_persisted = noop_flow(noop_cfg, a.noop_tasks, True)[1:]
        noop_bare = noop_flow(noop_cfg, a.noop_tasks, False)[1:]
    steps = []
    for r in records[1:]:
        ph = r["phase_seconds"]
        inside = r["sample_seconds"] + r["trainer_seconds"] + r["broadcast_seconds"]
        steps.append(
            {
                "step": r["step"],
                "step_s": r["step_seconds"],
                "inference_s": r["sample_seconds"],
                "training_s": r["trainer_seconds"],
                "broadcast_s": r["broadcast_seconds"],
                "overhead_s": r["step_seconds"] - inside,
                "overhead_share": (r["step_seconds"] - inside) / r["step_seconds"],
                # where the overhead goes
                "rollout_outside_vllm_s": ph["rollout"] - r["sample_seconds"],
                "train_task_outside_trainer_s": ph["train"] - r["trainer_seconds"],
                "broadcast_task_outside_s": ph["broadcast"] - r["broadcast_seconds"],
                "flow_between_tasks_s": r["step_seconds"] - sum(ph.values()),
            }
        )
    med = {k: median([s[k] for s in steps]) for k in steps[0] if k != "step"}
    results = {
        "steps": len(records),
        "batch_size": a.batch_size,
        "flow_wall_s": wall,
        "median": med,
        "per_step": steps,
        "noop_task_s": {"persisted_cached": median(noop_persisted), "no_cache_no_persist": median(noop_bare)},
        "tasks_per_step": 3,
    }
    write(a.out, results)
    rows = [[k, v, v / med["step_s"]] for k, v in med.items() if k.endswith("_s")]
    rows.append(["noop task, persisted + cache key", median(noop_persisted), "-"])
    rows.append(["noop task, no cache, no persist", median(noop_bare), "-"])
    table(
        f"control-plane overhead per step (median of {len(steps)} steps, k=0, batch {a.batch_size} x 8)",
        ["", "s", "share of step"],
        rows,
    )


if __name__ == "__main__":
    main()
