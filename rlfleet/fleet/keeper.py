"""The fleet's side of its warm processes: for each replica slot, one warm trainer (fleet/warm.py)
and one warm controller (fleet/controller.py) waiting, a fresh one after each run that took one.
One that exits without a run (it failed its imports) is started again after `RETRY_S`, its log
named.

On a fleet with GPUs the fresh one starts as soon as a run takes the waiting one (`early`): it pays
its imports and its compile while the run trains, so a run that comes right after finds it ready
(a host with GPUs has the cores; on a CPU box it would take them from the run, so there it starts
when the run ends). A trainer whose compile's GPU memory is unknown (the compile failed) is held
back from compiling until the run's trainer is gone, whose sizing left nothing for it."""

from __future__ import annotations

import json
import logging
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import TypedDict

from rlfleet.fleet.state import fleet_dir
from rlfleet.procs import ManagedProcess, running, wait_until

log = logging.getLogger("rlfleet.fleet")
# the files both kinds share in their spool directory: the waiting process, its readiness, the run
# that took it, and the fleet's word that its replicas serve (a trainer compiles only then)
WARM, READY, CLAIMED, GO = "warm.json", "ready", "claimed.json", "go"
POLL_S = 0.05


class Ready(TypedDict):
    """What a warm trainer writes to READY (fleet/warm.py), and the fleet reads back."""

    gpu_bytes: int | None  # GPU memory the precompile took (0 on a CPU); None: it did not run


class WarmKeeper:
    """One warm process of kind `kind` ("trainer" or "controller") beside replica `slot`."""

    RETRY_S = 30.0

    def __init__(
        self, home: Path, kind: str, slot: int, args: list[str], env: dict[str, str], early: bool = False
    ):
        self.kind, self.early = kind, early
        self.spool = spool(home, kind, slot)
        self.process = ManagedProcess(
            name=f"{kind}_{slot}",
            cmd=[sys.executable, "-m", f"rlfleet.fleet.{MODULES[kind]}", str(self.spool), *args],
            log_path=home / "logs" / kind / f"warm_{slot}.log",
            pidfile=home / "run" / f"{kind}_{slot}.pid",
            env={"HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1", **env},
        )
        self.taken: list[ManagedProcess] = []  # taken by runs, still running them
        self.starts = 0
        self.released = False
        self._held_back = False  # a fresh trainer that compiles once the taken ones are gone
        self._retry_at = 0.0

    @classmethod
    def trainer(
        cls, home: Path, slot: int, gpu_ids: list[str], model: str, dtype: str, early: bool = False
    ) -> WarmKeeper:
        env = {"CUDA_VISIBLE_DEVICES": ",".join(gpu_ids)} if gpu_ids else {}
        return cls(home, "trainer", slot, [model, dtype], env, early)

    @classmethod
    def controller(cls, home: Path, slot: int, model: str, early: bool = False) -> WarmKeeper:
        return cls(home, "controller", slot, [model], {}, early)

    def start(self, hold_back: bool = False) -> WarmKeeper:
        clear(self.spool)
        self.process = replace(self.process, proc=None)
        self.process.start()
        self.starts += 1
        self._held_back = hold_back
        if self.released and not hold_back:
            (self.spool / GO).touch()
        return self

    def release(self) -> None:
        """The fleet's replicas are up: this and every later warm trainer may compile on its GPU."""
        self.released = True
        (self.spool / GO).touch()

    def wait_ready(self, timeout_s: float = 600.0) -> bool:
        """Wait until the warm process is ready for a run (a trainer: compiled); False if it exited
        first or is not ready after `timeout_s` (a run that comes then waits for it, or goes without)."""
        try:
            wait_until(
                lambda: (self.spool / READY).exists(),
                timeout_s,
                POLL_S,
                what=f"the warm {self.kind} to be ready",
                abort=lambda: None if self.process.alive() else "it exited",
            )
            return True
        except (TimeoutError, RuntimeError) as e:
            log.warning("%s; log %s", e, self.process.log_path)
            return False

    def keep(self) -> None:
        """Start a fresh warm process once the last one is taken by a run (`early`) or gone (it ran a
        run, or failed)."""
        for gone in [p for p in self.taken if not p.alive()]:
            gone.pidfile.unlink(missing_ok=True)
            self.taken.remove(gone)
        if self._held_back and not self.taken:
            self._held_back = False
            if self.released:
                (self.spool / GO).touch()
        if self.process.alive():
            if self.early and (self.spool / CLAIMED).exists():
                self._next_beside_run()
            return
        if time.monotonic() < self._retry_at:
            return
        if (self.spool / CLAIMED).exists():
            log.info(
                "the warm %s ran a run (exit %s): starting a fresh one", self.kind, self.process.returncode()
            )
        elif not self._retry_at:
            self._retry_at = time.monotonic() + self.RETRY_S
            log.warning(
                "the warm %s exited (%s) before any run; again in %.0f s. Log %s:\n%s",
                self.kind,
                self.process.returncode(),
                self.RETRY_S,
                self.process.log_path,
                self.process.log_tail(),
            )
            return
        self._retry_at = 0.0
        self.start()

    def _next_beside_run(self) -> None:
        """The waiting process was taken by a run and is done with the spool: keep it as the run's
        (its pidfile moves aside: starting the next must not reap it), start the next beside it."""
        taken = self.process
        gpu_bytes = _ready_gpu_bytes(self.spool)
        pidfile = taken.pidfile.with_name(f"{taken.pidfile.stem}.taken-{taken.pid}.pid")
        taken.pidfile.rename(pidfile)
        self.taken.append(replace(taken, pidfile=pidfile))
        log.info("a run took the warm %s (pid %s): starting the next beside it", self.kind, taken.pid)
        self.start(hold_back=self.kind == "trainer" and gpu_bytes is None)

    def stop(self) -> None:
        for taken in self.taken:  # the fleet's own processes all go with it, runs' included
            taken.stop()
        self.process.stop()
        clear(self.spool)


MODULES = {"trainer": "warm", "controller": "controller"}


def spool(home: Path, kind: str, slot: int) -> Path:
    """The directory through which the fleet at `home`, its warm process of `kind` beside replica
    `slot` and the run that takes it speak."""
    return home / kind / str(slot)


def clear(spool: Path) -> None:
    """What a warm process that exited left; before starting the next."""
    spool.mkdir(parents=True, exist_ok=True)
    for f in spool.iterdir():
        if f.is_file():
            f.unlink(missing_ok=True)


def _ready_gpu_bytes(spool: Path) -> int | None:
    """The GPU memory a warm trainer's compile took, as it wrote in READY."""
    try:
        ready: Ready = json.loads((spool / READY).read_text())
        return ready["gpu_bytes"]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def warm(name: str, slots: int) -> list[dict[str, bool]]:
    """Per replica slot of fleet `name`, which kinds of warm process wait ready for a run (what
    `rlfleet fleet status` shows as warm)."""
    home = fleet_dir() / name
    return [{kind: _waiting(spool(home, kind, i)) for kind in MODULES} for i in range(slots)]


def _waiting(spool: Path) -> bool:
    try:
        process = json.loads((spool / WARM).read_text())
    except (OSError, ValueError):
        return False
    ready = (spool / READY).exists() and not (spool / CLAIMED).exists()
    return ready and running(process["pid"], process["started"])
