"""The stall watchdog: when nothing in a run has progressed for `faults.stall_timeout_s` (no token
on any replica, no trainer step, no weight load, nothing starting), write `stalls/<time>/` (py-spy
dumps of every process of the run, the controller's threads, `summary.txt`: who waits for whom),
tell the flow (`on_stall`: a Prefect artifact and a log line; this module never imports Prefect),
then recover per `faults.on_stall`.

Recovery kills the stuck part and lets the self-healing that exists take over: the pool relaunches
a dead replica (and a request or load it held fails and is redone), the `train` task's retry
relaunches a dead trainer. A stall nothing can be relaunched for (the controller itself), a second
one with no progress since the first recovery, or `on_stall = "fail"` fails the run: every wait of
the run raises a `StallError` whose message is the diagnosis.
"""

from __future__ import annotations

import contextvars
import logging
import threading
import time
from collections.abc import Callable
from typing import Protocol, TypedDict

from rlfleet.config.faults import FaultsConfig
from rlfleet.progress import Progress, StallError
from rlfleet.runs.dumps import RunProcess, dump_all
from rlfleet.runs.waits import Diagnosis, RunState, diagnose, summary
from rlfleet.store import RunStore, layout

log = logging.getLogger("rlfleet.stalls")


class Stall(TypedDict):
    at: str  # the directory's name, a UTC time
    path: str  # where stalls/<at>/ is (the store's URI)
    culprit: str  # replica, trainer, controller, unknown
    why: str  # one line
    action: str  # what rlfleet did about it
    fails_run: bool
    summary: str  # summary.txt
    dumps: list[str]  # the dump files' names


class RunView(Protocol):
    """What the watchdog needs of a run (`RunHandles`)."""

    def starting(self) -> bool:
        """Whether a party of the run is starting (a replica, the trainer loading its model)."""

    def run_state(self, timeout_s: float) -> RunState:
        """What the controller knows of every party now."""

    def relaunch(self, d: Diagnosis) -> str | None:
        """Kill the stuck part for its relaunch; what was done, or None if nothing can be."""

    def halt(self) -> None:
        """Kill every part the run started, for a stall that fails it: a wait stuck in a call to
        a frozen one ends (with the stall's error), and a failed run relaunches nothing."""


class StallWatchdog:
    def __init__(
        self,
        cfg: FaultsConfig,
        progress: Progress,
        store: RunStore,
        run: RunView,
        on_stall: Callable[[Stall], None] | None = None,
    ):
        assert cfg.stall_timeout_s, "a disabled watchdog is not started"
        self.cfg, self.timeout_s, self.progress, self.store, self.run = (
            cfg,
            cfg.stall_timeout_s,
            progress,
            store,
            run,
        )
        self.on_stall = on_stall
        self.stalls: list[Stall] = []
        self._events_at_stall: int | None = None  # progress.events when the last stall was handled
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> StallWatchdog:
        """A daemon thread in a copy of the caller's context (the flow run's: `on_stall` may log
        and publish to it)."""
        ctx = contextvars.copy_context()
        self.progress.mark("the watchdog started", event=False)
        self._thread = threading.Thread(
            target=ctx.run, args=(self._loop,), name="rlfleet-stall-watch", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _loop(self) -> None:
        interval = min(max(self.timeout_s / 5, 0.2), 5.0)
        while not self._stop.wait(interval):
            try:
                self.check()
            except Exception:  # noqa: BLE001 - the watchdog must outlive its own bugs
                log.exception("the stall watchdog failed a check")

    def check(self) -> Stall | None:
        """One look: the stall handled now, if the run is stalled."""
        if self.run.starting():
            self.progress.mark("a process is starting", event=False)
            return None
        if self.progress.idle_s() < self.timeout_s or self.progress.stall is not None:
            return None
        return self.handle()

    def handle(self) -> Stall:
        state = self.run.run_state(self.timeout_s)
        d = diagnose(state)
        now = time.time()
        at = time.strftime("%Y%m%dT%H%M%S", time.gmtime(now)) + f".{int(now % 1 * 1000):03d}Z"
        dumps = self._write_dumps(at, state["processes"])
        repeated = self._events_at_stall is not None and self.progress.events == self._events_at_stall
        fails = self.cfg.on_stall == "fail" or repeated or d.culprit not in ("replica", "trainer")
        if self.cfg.on_stall == "fail":
            action = "fail the run (faults.on_stall = fail)"
        elif repeated:
            action = "fail the run: nothing progressed since the last stall's relaunch"
        elif fails:
            action = f"fail the run: nothing to relaunch for a stall in the {d.culprit}"
        else:
            action = "relaunch " + (f"replica {', '.join(map(str, d.replicas))}" if d.replicas else d.culprit)
        text = summary(state, d, action) + "dumps: " + ", ".join(f"{n}.txt" for n in dumps) + "\n"
        self.store.write_text(f"{layout.stall_dir(at)}/summary.txt", text)
        stall: Stall = {
            "at": at,
            "path": self.store.uri(layout.stall_dir(at)),
            "culprit": d.culprit,
            "why": d.why,
            "action": action,
            "fails_run": fails,
            "summary": text,
            "dumps": [f"{n}.txt" for n in dumps],
        }
        self.stalls.append(stall)
        log.error("run stalled (%s): %s; %s; see %s", d.culprit, d.why, action, stall["path"])
        if self.on_stall is not None:
            try:
                self.on_stall(stall)
            except Exception:  # noqa: BLE001 - reporting must not stop the recovery
                log.exception("reporting the stall failed")
        error = None
        if fails:
            error = StallError(f"the run stalled: {d.why}\n{text}")
        elif self.run.relaunch(d) is None:
            error = StallError(f"the run stalled and its {d.culprit} cannot be relaunched here\n{text}")
        self.progress.mark("the stall's recovery", event=False)
        self._events_at_stall = self.progress.events
        if error is not None:  # every wait raises it; the kills end one stuck in a call
            self.progress.fail(error)
            self.run.halt()
        return stall

    def _write_dumps(self, at: str, procs: list[RunProcess]) -> list[str]:
        dumps = dump_all(procs, self.cfg.dump_timeout_s)
        status = {f"{p['party']}.{p['role']}.{p['pid']}": p["status"] for p in procs}
        for stem, text in dumps.items():
            head = f"# {stem} ({status.get(stem, 'this process')})\n"
            self.store.write_text(layout.stall_dump(at, stem), head + text)
        return list(dumps)
