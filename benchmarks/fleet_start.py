"""Start-up with and without a warm fleet (docs/fleet.md): command start -> step 0's end of the tiny
job, `rlfleet rl` as a user starts it, cold (it starts its own vLLM, trainer and Prefect server)
against attached to a fleet that `rlfleet fleet up` started once before the first run (its replica,
warm trainer and Prefect server). On a CPU box, paired and alternated per repetition so that the
load of the moment hits both. Then an eval of a checkpoint, cold and on the fleet.

With --gpus (one GPU that vLLM and the trainer share, or two: vLLM on the first, the trainer on the
second) the cold runs come first, then the fleet holds those GPUs (its replica, its warm trainer)
for the attached runs: a run that names no fleet may not use a fleet's GPUs. An attached run that
starts the moment another ended is counted apart (`fleet_right_after_a_run`): the fleet's fresh
warm controller and warm trainer are still starting then.

    python benchmarks/fleet_start.py --reps 3 --out benchmarks/results/fleet_start_cpu_2core.json
    python benchmarks/fleet_start.py --gpus 0 --reps 2 --out fleet_start_gpu.json
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from common import (
    ROOT,
    command,
    free_port,
    machine,
    median,
    rlfleet_cmd,
    start_fleet,
    steps,
    table,
    tiny_model,
    write,
)

JOB = ROOT / "examples" / "tiny" / "rl.toml"


def first_step(
    model: Path, out: Path, port: int, fleet: str | None, env: dict[str, str], extra: list[str]
) -> dict[str, Any]:
    argv = ["@", str(JOB), "--model.path", str(model), "--output-dir", str(out), "--max-steps", "2"]
    argv += [
        "--inference.port",
        str(port),
        "--wandb.mode",
        "disabled",
        *(["--fleet", fleet] if fleet else []),
        *extra,
    ]
    _, t0, wall = command(rlfleet_cmd("rl", *argv), out.parent / f"{out.name}.log", env)
    rec = steps(out)[0]
    return {"first_step_s": rec["finished_at"] - t0, "wall_s": wall, "step0": rec["phase_seconds"]}


def wait_asleep(port: int, fleet: subprocess.Popen, limit_s: float = 60.0) -> float | None:
    """A GPU fleet puts an idle replica to sleep about once a second (rlfleet/fleet/rest.py): seconds
    until it sleeps, None if it did not within `limit_s` (the run then finds it awake)."""
    from rlfleet.fleet.rest import asleep

    t0 = time.time()
    while time.time() - t0 < limit_s and fleet.poll() is None:
        if asleep([f"http://127.0.0.1:{port}"]) == [True]:
            return time.time() - t0
        time.sleep(0.5)
    return None


def woke_s(log: Path) -> float | None:
    """What the run said it took to wake its fleet replica (logged above 0.5 s)."""
    found = re.findall(r"woke its replica in ([0-9.]+) s", log.read_text(errors="replace"))
    return float(found[-1]) if found else None


def eval_wall(model: Path, run: Path, port: int, fleet: str | None, env: dict[str, str]) -> float:
    """Command start -> end of `rlfleet eval` of the run's latest checkpoint (32 greedy answers)."""
    argv = ["eval", "--output-dir", str(run), "--model.path", str(model), "--checkpoint", "latest"]
    argv += ["--eval.num-examples", "32", "--inference.max-model-len", "256"]
    argv += ["--fleet", fleet] if fleet else ["--inference.port", str(port)]
    return command(rlfleet_cmd(*argv), run.parent / f"{run.name}_eval_{fleet or 'cold'}.log", env)[2]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument(
        "--gpus", help="CUDA devices: 0 (shared) or 0,1 (vLLM on the first, the trainer on the second)"
    )
    ap.add_argument("--logs", help="a directory to keep the fleet's and each run's log in")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    gpus = a.gpus.split(",") if a.gpus else []
    if len(gpus) > 2:
        ap.error("--gpus: one device (shared) or two (vLLM's, the trainer's)")
    d = "--deployment."
    cold_args = [f"{d}num-inference-gpus", "1", f"{d}num-train-gpus", "1"] if gpus else []
    fleet_args = [f"{d}num-train-gpus", "1"] if gpus else []
    runs: dict[str, list[dict[str, Any]]] = {"cold": [], "fleet": []}
    with tempfile.TemporaryDirectory() as tmp_s:
        tmp = Path(tmp_s)
        model, port = tiny_model(tmp), free_port()
        env = os.environ | {
            "RLFLEET_FLEET_DIR": str(tmp / "fleets"),
            "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        }
        if gpus:  # every cold run before the fleet holds the GPUs; on a CPU box they alternate
            env["CUDA_VISIBLE_DEVICES"] = ",".join(gpus)
            for i in range(a.reps):
                runs["cold"].append(first_step(model, tmp / f"cold_{i}", free_port(), None, env, cold_args))
                print("cold", runs["cold"][-1], flush=True)
        up = ["--model.path", str(model), "--inference.port", str(port), "--api-port", str(free_port())]
        if gpus:  # the ids as CUDA_VISIBLE_DEVICES names them: the replica's first, the trainer's last
            up += ["--gpu-ids", f'["{gpus[0]}"]', "--trainer-gpu-ids", f'["{gpus[-1]}"]']
            up += ["--inference.gpu-memory-utilization", "0.45"] if len(gpus) == 1 else []
        fleet, fleet_up_s = start_fleet(ROOT / "examples" / "tiny" / "fleet.toml", up, env, tmp / "fleet.log")
        try:
            pairs = (
                [("fleet", i) for i in range(a.reps)]
                if gpus
                else [
                    (v, i)
                    for i in range(a.reps)
                    for v in (("cold", "fleet") if i % 2 == 0 else ("fleet", "cold"))
                ]
            )
            runs["fleet_right_after_a_run"] = []
            for n, (v, i) in enumerate(pairs):
                p, name = (free_port(), None) if v == "cold" else (port, "tiny")
                rested = wait_asleep(port, fleet) if gpus and v == "fleet" else None
                run = first_step(
                    model, tmp / f"{v}_{i}", p, name, env, cold_args if v == "cold" else fleet_args
                )
                if gpus and v == "fleet":  # the replica rested asleep before the run, which woke it
                    run |= {"asleep_after_s": rested, "woke_s": woke_s(tmp / f"{v}_{i}.log")}
                key = "fleet_right_after_a_run" if v == "fleet" and n and pairs[n - 1][0] == "fleet" else v
                runs[key].append(run)
                print(key, run, flush=True)
            evals = {
                v: eval_wall(model, tmp / "fleet_0", free_port(), "tiny" if v == "fleet" else None, env)
                for v in (("fleet",) if gpus else ("cold", "fleet"))
            }
            print("eval", evals, flush=True)
        finally:
            fleet.terminate()
            fleet.wait(120)
            if a.logs:
                Path(a.logs).mkdir(parents=True, exist_ok=True)
                for log in tmp.glob("*.log"):
                    shutil.copy(log, Path(a.logs) / log.name)
    med = {v: median([r["first_step_s"] for r in rs]) for v, rs in runs.items() if rs}
    write(
        a.out,
        {
            "job": "examples/tiny/rl.toml, 2 steps, `rlfleet rl` (cold) or `rlfleet rl --fleet tiny`",
            "gpus": gpus,
            "env": machine() | {"loadavg": os.getloadavg()},
            "fleet_up_s": fleet_up_s,
            "median_first_step_s": med,
            "cold_over_fleet": med["cold"] / med["fleet"],
            "eval_wall_s": evals,
            "runs": runs,
        },
    )
    table(
        "command start -> step 0's end (s)",
        ["variant", "median", "tries"],
        [[v, med[v], ", ".join(f"{r['first_step_s']:.1f}" for r in rs)] for v, rs in runs.items() if rs],
    )


if __name__ == "__main__":
    main()
