"""What the chaos soak (benchmarks/chaos.py) reads of a running `rlfleet rl` run, from its
directory, its pidfiles and /proc: its parts' processes, its steps, and the moments a fault is
timed to (a weight load, a checkpoint write)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import httpx
import psutil
from faults import victim

from rlfleet.procs import pid_alive
from rlfleet.store import RunStore, layout
from rlfleet.weights.tickets import served_step


class RunView:
    def __init__(self, out: Path, port: int, max_steps: int):
        self.out, self.port, self.max_steps = out, port, max_steps
        self.store = RunStore(out)

    def names(self, kind: str, prefix: str) -> list[str]:
        """Entries of `<out>/<kind>/` starting with `prefix`: cheap enough to poll every 10 ms."""
        try:
            return [n for n in os.listdir(self.out / kind) if n.startswith(prefix)]
        except OSError:
            return []

    def steps_done(self) -> int:
        return len(self.names(layout.STEPS, "step_"))

    def stepped_since(self, t: float) -> bool:
        """A step record was written after wall time `t` (a new step, or one a rerun redid)."""
        steps = [
            s for n in self.names(layout.STEPS, "step_") if (s := layout.step_of(n, ".json")) is not None
        ]
        try:
            return bool(steps) and (self.out / layout.step_json(layout.STEPS, max(steps))).stat().st_mtime > t
        except OSError:
            return False

    def finished(self) -> bool:
        """The last step is trained and the summary written (whether every step has its record
        is for the end checks to say)."""
        last = self.out / layout.step_json(layout.METRICS, self.max_steps - 1)
        return last.exists() and self.store.exists(layout.SUMMARY)

    def part(self, part: str) -> psutil.Process | None:
        """The process of a part other than the controller (Prefect's server, the trainer or its
        guard, replica 0's guard, API server or engine core), None while it is not running."""
        try:
            if part == "prefect_server":
                pid = pid_alive(self.out / "run/prefect_server.pid")
                return None if pid is None else psutil.Process(pid)
            return victim(self.out, part)
        except (LookupError, psutil.Error):
            return None

    def started(self, part: str, p: psutil.Process) -> bool:
        """The trainer has its model (`TRAINER_UP` since it began); a replica answers /health."""
        if part == "trainer":
            up = self.out / layout.TRAINER_UP
            try:
                return up.exists() and json.loads(up.read_text())["at"] >= p.create_time()
            except (OSError, ValueError, KeyError):
                return False
        try:
            return httpx.get(f"http://127.0.0.1:{self.port}/health", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def loading(self) -> bool:
        """The newest published weights are not served yet: the broadcast is loading them."""
        steps = [s for n in self.names(layout.WEIGHTS, "step_") if (s := layout.step_of(n)) is not None]
        if (
            not steps
            or not (self.out / layout.step_dir(layout.WEIGHTS, max(steps)) / layout.MANIFEST).exists()
        ):
            return False
        try:
            served = served_step(self.store)
        except (OSError, ValueError):  # being rewritten
            return False
        return served is not None and max(steps) > served

    def checkpoints(self) -> list[int]:
        """Complete checkpoints: none yet, and a rerun resumes from the base model."""
        return self.store.complete_steps(layout.CHECKPOINTS)

    def checkpointing(self) -> bool:
        return bool(self.names(layout.CHECKPOINTS, ".tmp-step_"))

    def stall_dirs(self) -> list[Path]:
        return sorted((self.out / layout.STALLS).glob("*/summary.txt"))

    def leftovers(self) -> list[psutil.Process]:
        """What the run's pidfiles name alive (a dead controller's leftovers, for its rerun to reap)."""
        found = []
        for pidfile in (self.out / "run").glob("*.pid"):
            try:
                if (pid := pid_alive(pidfile)) is not None:
                    found.append(psutil.Process(pid))
            except psutil.Error:
                pass
        return found
