"""An ablation grid on a warm fleet against one of its children alone (docs/fleet.md, "An ablation
grid on the fleet"): `rlfleet fleet up` once with N replicas (on a GPU host one GPU each, its warm
trainer beside it), then one grid point alone (`rlfleet rl --fleet`), then the `ablation` flow over
N points of `trainer.lr`, whose children run at once, one replica each; each once every replica's
warm controller and warm trainer wait ready again. Each wall is timed from its
command's start to its end; the figure is the grid's wall over the child's alone (goal <= 1.3).

    python benchmarks/fleet_ablation.py --out benchmarks/results/fleet_ablation_cpu_2core.json
    python benchmarks/fleet_ablation.py --gpus 0,1,2,3 --model /tmp/models/smollm2 \
        --job examples/smollm2/rl.toml --steps 20 --logs /tmp/abl_logs --out fleet_ablation_h200x4.json

On a CPU box the replicas share its cores, so the ratio there says only that the path runs.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path

from common import ROOT, command, free_port, rlfleet_cmd, start_fleet, steps, table, tiny_model, write

GRID = """
import json, sys
from rlfleet.fleet.api import use_fleet_api
use_fleet_api(sys.argv[1])  # the fleet's Prefect API, as `rlfleet rl --fleet` uses it
from rlfleet.config.loader import load
from rlfleet.config.models import RLConfig
from rlfleet.flows.ablation import ablation
rows = ablation(base=load(RLConfig, sys.argv[3:]), grid=json.loads(sys.argv[2]))
print("ROWS", json.dumps(rows))
"""


def all_warm(name: str, n: int, fleet: subprocess.Popen, limit_s: float = 600.0) -> float:
    """Seconds until every replica slot's warm controller and warm trainer wait ready (a fresh one
    starts after each run, and a GPU trainer compiles first): both figures are a warm fleet's."""
    from rlfleet.fleet.keeper import warm

    t0 = time.time()
    while not all(all(w.values()) for w in warm(name, n)):
        if fleet.poll() is not None or time.time() - t0 > limit_s:
            raise RuntimeError(f"fleet {name} not all warm after {time.time() - t0:.0f} s: {warm(name, n)}")
        time.sleep(0.5)
    return time.time() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument(
        "--gpus", help="CUDA devices, one replica and its warm trainer on each (default: the CPU)"
    )
    ap.add_argument(
        "--replicas", type=int, default=2, help="on the CPU: the fleet's replicas and grid points"
    )
    ap.add_argument("--model", help="the base model (default: the tiny one, made here)")
    ap.add_argument("--job", default=str(ROOT / "examples" / "tiny" / "rl.toml"))
    ap.add_argument("--fleet-config", help="default: fleet.toml beside --job")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--logs", help="a directory to keep the fleet's, the runs' and the children's logs in")
    ap.add_argument("--out", required=True)
    a, extra = ap.parse_known_args()  # any other `--section.key value`: every run's, as `rlfleet rl` takes it
    gpus = a.gpus.split(",") if a.gpus else []
    n = len(gpus) or a.replicas
    fleet_toml = Path(a.fleet_config or Path(a.job).parent / "fleet.toml")
    name = tomllib.loads(fleet_toml.read_text())["name"]
    lr = tomllib.loads(Path(a.job).read_text()).get("trainer", {}).get("lr", 1e-5)
    grid = {"trainer.lr": [lr * f for f in (1, 2, 0.5, 4, 0.25, 8, 0.125, 16)[:n]]}
    gpu_args = ["--inference.gpu-memory-utilization", "0.45"] if gpus else []
    with tempfile.TemporaryDirectory() as tmp_s:
        tmp = Path(tmp_s)
        model = Path(a.model) if a.model else tiny_model(tmp)
        os.environ["RLFLEET_FLEET_DIR"] = str(tmp / "fleets")  # the fleet's, read here too (all_warm)
        env = os.environ | {"PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
        env.pop("PREFECT_API_URL", None)  # the fleet's own
        if gpus:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(gpus)
        up = ["--model.path", str(model), "--inference.num-replicas", str(n)]
        up += ["--inference.port", str(free_port()), "--api-port", str(free_port())]
        if gpus:  # a replica on each GPU, its warm trainer beside it
            ids = json.dumps([str(i) for i in range(n)])
            up += ["--gpu-ids", ids, "--trainer-gpu-ids", ids, *gpu_args]
        run = ["@", a.job, "--model.path", str(model), "--max-steps", str(a.steps), "--fleet", name]
        run += ["--wandb.mode", "disabled", *gpu_args, *extra]
        run += ["--deployment.num-train-gpus", "1"] if gpus else []
        fleet, fleet_up_s = start_fleet(fleet_toml, up, env, tmp / "fleet.log")
        try:
            fleet_up_s += all_warm(name, n, fleet)
            print(f"fleet {name} up and warm, {n} replicas: {fleet_up_s:.1f} s", flush=True)
            alone_out = tmp / "alone"
            point = ["--trainer.lr", str(grid["trainer.lr"][0])]
            cmd = rlfleet_cmd("rl", *run, "--output-dir", str(alone_out), *point)
            _, start, alone_wall = command(cmd, tmp / "alone.log", env)
            alone = {"wall_s": alone_wall, "first_step_s": steps(alone_out)[0]["finished_at"] - start}
            alone["then_warm_again_s"] = all_warm(name, n, fleet)
            print("alone", alone, flush=True)
            grid_argv = [
                sys.executable,
                "-c",
                GRID,
                name,
                json.dumps(grid),
                *run,
                "--output-dir",
                str(tmp / "grid"),
            ]
            _, start, grid_wall = command(grid_argv, tmp / "grid.log", env)
            rows = json.loads((tmp / "grid.log").read_text().split("ROWS ", 1)[1].splitlines()[0])
            children = []
            for row in rows:
                child = {k: row.get(k) for k in ("point", "state", "median_step_s", "tokens_per_s")}
                if recs := steps(row["output_dir"]) if row.get("output_dir") else []:
                    child |= {
                        "first_step_s": recs[0]["finished_at"] - start,
                        "end_s": recs[-1]["finished_at"] - start,
                    }
                children.append(child)
            print("grid", grid_wall, children, flush=True)
        finally:
            fleet.terminate()
            fleet.wait(120)
            if a.logs:
                logs = Path(a.logs)
                logs.mkdir(parents=True, exist_ok=True)
                for log in [*tmp.glob("*.log"), *(tmp / "grid" / "ablation").glob("*.log")]:
                    shutil.copy(log, logs / log.name)
                shutil.copytree(tmp / "fleets" / name / "logs", logs / "fleet_logs", dirs_exist_ok=True)
    write(
        a.out,
        {
            "job": f"{a.job}, {a.steps} steps, on fleet {name} ({fleet_toml})",
            "gpus": gpus,
            "replicas": n,
            "grid": grid,
            "extra": extra,
            "loadavg_at_end": os.getloadavg(),
            "fleet_up_s": fleet_up_s,
            "alone": alone,
            "grid_wall_s": grid_wall,
            "children": children,
            "grid_over_alone": grid_wall / alone_wall,
        },
    )
    table(
        "wall from the command's start (s)",
        ["run", "wall", "first step"],
        [["one child alone", alone_wall, alone["first_step_s"]]]
        + [[f"grid: {c['point']}", c.get("end_s"), c.get("first_step_s")] for c in children]
        + [[f"grid of {n} / alone", grid_wall / alone_wall, ""]],
    )


if __name__ == "__main__":
    main()
