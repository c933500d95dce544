"""What `rlfleet runs status` prints, from the run store alone, and the per-step JSON records it reads."""

from __future__ import annotations

from rlfleet.procs import pid_alive
from rlfleet.store import RunStore, run_store
from rlfleet.trainer.files import latest_checkpoint
from rlfleet.trainer.resume import resume_step


def step_records(store: RunStore) -> list[dict]:
    """The flow's per-step records (`steps/step_N.json`), in step order."""
    return [store.read_json(f"steps/step_{s}.json") for s in store.json_steps("steps")]


def status(output_dir: str) -> dict:
    """What `rlfleet runs status` prints: finished steps, the resume point, and what is running."""
    store = run_store(output_dir)
    ckpt = latest_checkpoint(store)
    running = {}
    if (store.local_dir / "run").is_dir():
        for pidfile in sorted((store.local_dir / "run").glob("*.pid")):
            pid = pid_alive(pidfile)
            running[pidfile.stem] = pid
    return {
        "output_dir": store.url,
        "steps_done": spans(r["step"] for r in step_records(store)),
        "trained_steps": spans(store.json_steps("metrics")),
        "rollouts": spans(store.complete_steps("rollouts")),
        "batches": spans(store.complete_steps("batches")),
        "weights": spans(store.complete_steps("weights")),
        "checkpoints": spans(store.complete_steps("checkpoints")),
        "resume_checkpoint": None if ckpt is None else ckpt["step"],
        "resume_step": resume_step(store),
        "processes": {name: ("running" if pid else "stale pidfile") for name, pid in running.items()},
        "pids": {name: pid for name, pid in running.items() if pid},
        "summary": store.exists("summary.json"),
    }


def spans(steps) -> str:
    """[0, 1, 2, 5, 7, 8] -> "0-2,5,7-8"."""
    out: list[list[int]] = []
    for s in sorted(steps):
        if out and s == out[-1][1] + 1:
            out[-1][1] = s
        else:
            out.append([s, s])
    return ",".join(f"{a}" if a == b else f"{a}-{b}" for a, b in out)
