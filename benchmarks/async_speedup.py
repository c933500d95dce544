"""Async k=1 vs k=0: steps per minute of flow `rl` on a config where rollout and training take
about the same time, both runs in one process, one after the other, on the same machine.

Steps per minute = 60 x (steps after warm-up) / (their summed step wall times); the first
`--warmup` steps (trainer start, first compile of everything) are left out. Each run's median
time inside vLLM sampling and inside the trainer is reported, to show the two are comparable.
Without --pin each level runs as a user's config would: k=0 unpinned, k>0 with the flow's own
core split (`config/gpu_defaults.split_cpus`: vLLM on the first half of the cores, the trainer on the
rest). --pin pins k=0 the same way too (vLLM's OpenMP threads on CPU 0, one trainer thread on CPU 1).
--hidden/--layers/--heads pick the model shape: training cost grows with the FLOPs, vLLM's CPU
sampling of a tiny model mostly with per-token overheads, so a wider model balances the two.

    python benchmarks/async_speedup.py --steps 10 --out benchmarks/results/async_speedup_cpu_2core.json
    python benchmarks/async_speedup.py --steps 10 --out gpu.json --deployment.num-inference-gpus 1 --deployment.num-train-gpus 1
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from common import CpuSampler, median, rl_config, run_rl, table, tiny_model, write


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--pin", action="store_true")
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--heads", type=int, default=2)
    ap.add_argument("--levels", default="0,1")
    ap.add_argument("--out", required=True)
    a, overrides = ap.parse_known_args()  # anything else is an rl config override (e.g. GPU placement)
    extra = ["--orchestrator.batch-size", str(a.batch_size), *overrides]
    if a.pin:
        extra += [
            "--inference.cpu-threads-bind",
            '"0"',
            "--trainer.num-threads",
            "1",
            "--trainer.cpu-affinity",
            "[1]",
        ]
    shape = {"hidden": a.hidden, "layers": a.layers, "heads": a.heads}
    results = {
        "config": {"steps": a.steps, "warmup": a.warmup, "pin": a.pin, "model": shape, "args": extra},
        "runs": {},
    }
    with tempfile.TemporaryDirectory() as tmp_s:
        tmp = Path(tmp_s)
        model = tiny_model(tmp, hidden=a.hidden, layers=a.layers, heads=a.heads)
        for k in (int(x) for x in a.levels.split(",")):
            cfg = rl_config(
                model,
                tmp / f"k{k}",
                "--max-steps",
                str(a.steps),
                "--orchestrator.max-async-level",
                str(k),
                *extra,
            )
            with CpuSampler() as cpu:
                records, wall = run_rl(cfg)
            timed = records[a.warmup :]
            secs = sum(r["step_seconds"] for r in timed)
            results["runs"][k] = {
                "steps_per_min": 60 * len(timed) / secs,
                "median_step_s": median([r["step_seconds"] for r in timed]),
                "median_sample_s": median([r["sample_seconds"] for r in timed]),
                "median_trainer_s": median([r["trainer_seconds"] for r in timed]),
                "median_broadcast_s": median([r["broadcast_seconds"] for r in timed]),
                "max_staleness": max(r["max_staleness"] for r in records),
                # all processes on the box, steady-state steps only: the headroom overlap can use
                "busy_cpus": cpu.busy_cpus(records[a.warmup - 1]["finished_at"], records[-1]["finished_at"]),
                "flow_wall_s": wall,
                "last3_reward": sum(r["mean_reward"] for r in records[-3:]) / 3,
                "mean_clip_frac": sum(r["clip_frac"] for r in records) / len(records),
                "mean_mask_frac": sum(r["mask_frac"] for r in records) / len(records),
                "records": records,
            }
            print(k, {x: v for x, v in results["runs"][k].items() if x != "records"}, flush=True)
    runs = results["runs"]
    if 0 in runs and 1 in runs:
        results["speedup_k1_over_k0"] = runs[1]["steps_per_min"] / runs[0]["steps_per_min"]
    write(a.out, results)
    table(
        f"async off-policy, model {a.hidden}x{a.layers}, {a.steps} steps ({a.warmup} warm-up left out){' pinned' if a.pin else ''}",
        [
            "k",
            "steps/min",
            "step s",
            "sampling s",
            "trainer s",
            "broadcast s",
            "busy CPUs",
            "staleness",
            "x k=0",
        ],
        [
            [
                k,
                r["steps_per_min"],
                r["median_step_s"],
                r["median_sample_s"],
                r["median_trainer_s"],
                r["median_broadcast_s"],
                r["busy_cpus"],
                r["max_staleness"],
                r["steps_per_min"] / runs[0]["steps_per_min"] if 0 in runs else "-",
            ]
            for k, r in runs.items()
        ],
    )


if __name__ == "__main__":
    main()
