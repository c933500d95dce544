"""Long-lived child processes (vLLM servers, trainers) that never outlive the run.

Each child starts in its own session (process group) so stopping it stops its whole tree (vLLM's
engine core, torchrun's workers), under `rlfleet.guard`, which gets SIGTERM if its parent dies
(PR_SET_PDEATHSIG) and then SIGKILLs the group after a grace period; and a
pidfile under `<output_dir>/run/` lets the next launch of the same run reap a child whose parent
was SIGKILLed before it could clean up.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import psutil

from rlfleet.guard import die_with_parent
from rlfleet.store.layout import rank_log

T = TypeVar("T")


@dataclass
class ManagedProcess:
    name: str
    cmd: list[str]
    log_path: Path
    pidfile: Path
    env: dict[str, str] = field(default_factory=dict)
    proc: subprocess.Popen | None = None

    def start(self) -> ManagedProcess:
        reap_pidfile(self.pidfile)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.pidfile.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")  # noqa: SIM115 - handed to the child, closed in stop()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "rlfleet.guard", *self.cmd],  # takes the group down on SIGTERM
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **self.env},
            start_new_session=True,
            preexec_fn=die_with_parent(signal.SIGTERM),  # the guard's grace period, then SIGKILL
        )
        log.close()
        write_pidfile(self.pidfile, self.proc.pid)
        return self

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def returncode(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self, grace_s: float = 10.0) -> None:
        if self.proc is not None:
            kill_group(self.proc.pid, grace_s)
            self.proc.wait()
        self.pidfile.unlink(missing_ok=True)


def _create_time(pid: int) -> float:
    try:
        return psutil.Process(pid).create_time()
    except psutil.Error:
        return 0.0


def kill_group(pid: int, grace_s: float = 10.0) -> None:
    """SIGTERM the process group led by pid (and any stray descendants), SIGKILL after grace_s."""
    try:
        members = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
    except psutil.Error:
        members = []
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, sig)
        for p in members:
            with contextlib.suppress(psutil.Error):
                p.send_signal(sig)
        _, members = psutil.wait_procs(members, timeout=grace_s)
        if not members:
            return


def write_pidfile(pidfile: Path, pid: int) -> None:
    """pid and its start time: a recycled pid is never mistaken for the process we started."""
    pidfile.parent.mkdir(parents=True, exist_ok=True)
    pidfile.write_text(f"{pid}\n{_create_time(pid)}\n")


def pid_alive(pidfile: Path) -> int | None:
    """The pid a pidfile names if that very process is still running, else None."""
    try:
        pid_s, ctime_s = pidfile.read_text().split()
        pid, ctime = int(pid_s), float(ctime_s)
    except (OSError, ValueError):
        return None
    return pid if running(pid, ctime) else None


def running(pid: int, started: float) -> bool:
    """Whether process `pid`, started at `started` (psutil's create_time), still runs: not exited,
    not a zombie nobody reaped, not a recycled pid."""
    try:
        p = psutil.Process(pid)
        return abs(p.create_time() - started) < 1e-3 and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def this_process() -> dict[str, float]:
    """What `running` needs to recognise this process from another one on this node."""
    return {"pid": os.getpid(), "started": _create_time(os.getpid())}


def reap_pidfile(pidfile: Path) -> None:
    """Kill the process tree a pidfile names (left by a controller that was killed), if still
    running; with its leader dead, what is left in the leader's process group."""
    if (pid := pid_alive(pidfile)) is not None:
        kill_group(pid)
    else:
        _kill_orphaned_group(pidfile)
    pidfile.unlink(missing_ok=True)


def _kill_orphaned_group(pidfile: Path) -> None:
    """SIGKILL the members of the dead leader's group and wait for them: a replica's guard and
    its controller killed at once left vLLM's engine core (reparented to init) holding the
    replica's port, and every rerun failed on it. The kernel reuses no pid that still names a
    live group, so a process now holding the leader's pid means the group is gone."""
    try:
        pid_s, ctime_s = pidfile.read_text().split()
        pid, ctime = int(pid_s), float(ctime_s)
    except (OSError, ValueError):
        return
    with contextlib.suppress(psutil.Error):
        if abs(psutil.Process(pid).create_time() - ctime) >= 1e-3:
            return  # another process has the pid: not our group
    members = []
    for p in psutil.process_iter():
        with contextlib.suppress(psutil.Error, OSError):
            if p.pid != pid and os.getpgid(p.pid) == pid:
                members.append(p)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
    psutil.wait_procs(members, timeout=10)


def wait_until(
    predicate: Callable[[], T],
    timeout_s: float,
    interval_s: float = 0.5,
    what: str = "condition",
    abort: Callable[[], str | Exception | None] | None = None,
    on_timeout: Callable[[], Exception] | None = None,
) -> T:
    """Poll predicate() until it returns something truthy, and return that.

    abort() ends the wait early: an exception it returns is raised as is (a dead process's own
    error, whose type says whether a retry helps), a reason as RuntimeError; unless predicate()
    came true meanwhile (a trainer that wrote step N's record and was killed right after: the step
    is done). After timeout_s: on_timeout()'s exception (made then, so it can say what was seen
    last), else TimeoutError.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        if value := predicate():
            return value
        if abort is not None and (reason := abort()):
            if value := predicate():
                return value
            raise (
                reason
                if isinstance(reason, Exception)
                else RuntimeError(f"gave up waiting for {what}: {reason}")
            )
        if time.monotonic() > deadline:
            if on_timeout is not None:
                raise on_timeout()
            raise TimeoutError(f"timed out after {timeout_s:.0f}s waiting for {what}")
        time.sleep(interval_s)


def python_module_cmd(module: str, args: Sequence[str]) -> list[str]:
    import sys

    return [sys.executable, "-m", module, *args]


RANK_LOGS = "RLFLEET_RANK_LOGS"  # set by a torchrun launcher: the directory of its ranks' logs


def log_to_rank_file() -> None:
    """A torchrun rank other than 0 writes its stdout and stderr to `$RLFLEET_RANK_LOGS/rank_R.log`;
    rank 0 keeps the launcher's stream, which is `rank_0.log`. Without both variables: nothing."""
    log_dir, rank = os.environ.get(RANK_LOGS), os.environ.get("RANK")
    if not log_dir or rank in (None, "0"):
        return
    path = rank_log(log_dir, rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    redirect_output(path)


def redirect_output(path: str | Path) -> None:
    """This process's stdout and stderr appended to `path`, as file descriptors 1 and 2, so what C
    code and child processes write goes there too."""
    sys.stdout.flush()
    sys.stderr.flush()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


def log_lines() -> None:
    """INFO lines with time and logger, for an rlfleet process other than the flow's (a trainer, an
    SFT rank, the fleet); its parent gives it the log file as stdout and stderr."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
