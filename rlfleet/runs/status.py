"""What `rlfleet runs status` prints, from the run store alone."""

from __future__ import annotations

from rlfleet.procs import pid_alive
from rlfleet.store import RunDir, layout, run_store
from rlfleet.store.records import read_steps
from rlfleet.trainer.files import latest_checkpoint
from rlfleet.trainer.resume import resume_step


def status(output_dir: str) -> dict:
    """What `rlfleet runs status` prints: finished steps, the resume point, and what is running."""
    store = run_store(output_dir)
    ckpt = latest_checkpoint(store)
    running = {pidfile.stem: pid_alive(pidfile) for pidfile in RunDir(store.local_dir).pidfiles()}
    return {
        "output_dir": store.url,
        "steps_done": spans(r["step"] for r in read_steps(store)),
        "trained_steps": spans(store.json_steps(layout.METRICS)),
        "rollouts": spans(store.complete_steps(layout.ROLLOUTS)),
        "batches": spans(store.complete_steps(layout.BATCHES)),
        "weights": spans(store.complete_steps(layout.WEIGHTS)),
        "checkpoints": spans(store.complete_steps(layout.CHECKPOINTS)),
        "resume_checkpoint": None if ckpt is None else ckpt["step"],
        "resume_step": resume_step(store),
        "processes": {name: ("running" if pid else "stale pidfile") for name, pid in running.items()},
        "pids": {name: pid for name, pid in running.items() if pid},
        "summary": store.exists(layout.SUMMARY),
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
