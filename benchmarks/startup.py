"""Start-up on a CPU box: command start -> the first finished RL step, and vLLM's own start.

Job: the tiny CPU run (examples/tiny/rl.toml, `--max-steps` 2) as its own command, so imports,
Prefect's temporary server, vLLM and the trainer all count. Variants, rotated per repetition:
  cli:              `rlfleet rl` as `make run` starts it (vLLM started before Prefect and the flow)
  flow:             the flow called from Python (`rl(config=...)`, as a deployment or a test runs
                    it): vLLM starts inside the flow
  cli_no_bytecode:  `rlfleet rl` with no compiled bytecode to read (an empty PYTHONPYCACHEPREFIX and
                    PYTHONDONTWRITEBYTECODE=1): what a uv install without --compile-bytecode gave
  cli_cold_vllm:    `rlfleet rl` with an empty vLLM cache (VLLM_CACHE_ROOT): a host's first run,
                    where vLLM inspects the model's class before its engine starts
Then one vLLM replica alone (`launch_replicas`, as the flow starts it), ready seconds, with and
without bytecode and with vLLM's V1 multiprocessing on and off (rlfleet sets it off on a CPU).

    python benchmarks/startup.py --reps 2 --out benchmarks/results/startup_cpu_2core.json
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from common import ROOT, free_port, median, table, write

JOB = ROOT / "examples" / "tiny" / "rl.toml"
VARIANTS = ("cli", "flow", "cli_no_bytecode", "cli_cold_vllm")
FLOW = (
    "import sys; from rlfleet.config.loader import load; from rlfleet.config.models import RLConfig; "
    "from rlfleet.flows.rl import rl; rl(config=load(RLConfig, sys.argv[1:]))"
)


def no_bytecode(tmp: Path) -> dict[str, str]:
    empty = tmp / "no-pyc"
    empty.mkdir(exist_ok=True)
    return {"PYTHONPYCACHEPREFIX": str(empty), "PYTHONDONTWRITEBYTECODE": "1"}


def first_step(variant: str, model: Path, tmp: Path, i: int) -> dict[str, Any]:
    """One run of the job; seconds from the command's start to vLLM ready and to step 0's end."""
    from rlfleet.store import RunStore
    from rlfleet.store.records import read_steps

    out = tmp / f"{variant}_{i}"
    argv = ["@", str(JOB), "--model.path", str(model), "--output-dir", str(out), "--max-steps", "2"]
    argv += ["--inference.port", str(free_port()), "--wandb.mode", "disabled"]
    exe = [sys.executable, "-m", "rlfleet.cli", "rl"] if variant != "flow" else [sys.executable, "-c", FLOW]
    env = os.environ | {  # as the CLI sets (rlfleet/cli.py `main`)
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "180",
        "HF_HUB_OFFLINE": "1",
    }
    env |= no_bytecode(tmp) if variant == "cli_no_bytecode" else {}
    env |= {"VLLM_CACHE_ROOT": str(tmp / f"vllm_cache_{i}")} if variant == "cli_cold_vllm" else {}
    log = tmp / f"{variant}_{i}.log"
    t0 = time.time()
    with log.open("w") as f:
        rc = subprocess.run([*exe, *argv], cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, env=env).returncode
    wall = time.time() - t0
    if rc:
        raise RuntimeError(f"{variant} exited {rc}:\n" + "\n".join(log.read_text().splitlines()[-30:]))
    (rec, *_) = read_steps(RunStore(str(out)))
    line = next(ln for ln in log.read_text().splitlines() if "ready in" in ln)
    return {
        "first_step_s": rec["finished_at"] - t0,
        "vllm_ready_in_s": float(line.split("ready in ")[1].split(" s")[0]),
        "wall_s": wall,
    }


def vllm_alone(variant: str, model: Path, tmp: Path, i: int) -> float:
    """Seconds until one replica answers /health (and its KV cache is up)."""
    code = (
        "import sys, time; from common import rl_config; import rlfleet.inference.server as s\n"
        "if sys.argv[3] == '1': s.replica_env = (lambda f: lambda c, r: f(c, r) | "
        "{'VLLM_ENABLE_V1_MULTIPROCESSING': '1'})(s.replica_env)\n"
        "cfg = rl_config(__import__('pathlib').Path(sys.argv[1]), __import__('pathlib').Path(sys.argv[2]))\n"
        "t = time.perf_counter(); reps = s.launch_replicas(cfg.inference_job([]))\n"
        "print('READY', time.perf_counter() - t); s.stop_replicas(reps)"
    )
    env = os.environ | (no_bytecode(tmp) if "no_bytecode" in variant else {})
    mp = "1" if "mp_on" in variant else "0"
    out = subprocess.run(
        [sys.executable, "-c", code, str(model), str(tmp / f"alone_{variant}_{i}"), mp],
        cwd=ROOT / "benchmarks",
        capture_output=True,
        text=True,
        env=env,
        check=True,
    ).stdout
    return float(next(ln for ln in out.splitlines() if ln.startswith("READY")).split()[1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--variants", default=",".join(VARIANTS), help=f"a subset of {VARIANTS}")
    ap.add_argument("--no-alone", action="store_true", help="skip the replica-alone timings")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    from common import tiny_model

    runs: dict[str, list[dict[str, Any]]] = {v: [] for v in a.variants.split(",")}
    if set(runs) - set(VARIANTS):
        sys.exit(f"--variants: unknown {sorted(set(runs) - set(VARIANTS))}; known: {VARIANTS}")
    alone: dict[str, list[float]] = (
        {} if a.no_alone else {v: [] for v in ("bytecode", "no_bytecode", "bytecode_mp_on")}
    )
    with tempfile.TemporaryDirectory() as tmp_s:
        tmp = Path(tmp_s)
        model = tiny_model(tmp)
        for i in range(a.reps):
            order = list(runs)[i % len(runs) :] + list(runs)[: i % len(runs)]
            for v in order:
                runs[v].append(first_step(v, model, tmp, i))
                print(v, runs[v][-1], flush=True)
            for v in alone:
                alone[v].append(vllm_alone(v, model, tmp, i))
                print("vllm alone", v, alone[v][-1], flush=True)
    keys = ("first_step_s", "vllm_ready_in_s", "wall_s")
    med = {v: {k: median([r[k] for r in rs]) for k in keys} for v, rs in runs.items()}
    write(
        a.out,
        {
            "job": "examples/tiny/rl.toml, 2 steps",
            "median": med,
            "runs": runs,
            "vllm_alone_ready_s": {v: {"median": median(xs), "tries": xs} for v, xs in alone.items()},
        },
    )
    table("start-up (median s)", ["variant", *keys], [[v, *(m[k] for k in keys)] for v, m in med.items()])
    table("one vLLM replica alone", ["variant", "ready s"], [[v, median(xs)] for v, xs in alone.items()])


if __name__ == "__main__":
    main()
