"""`python -m rlfleet.sentinel`: what a controller started outside the guard dies with it.

Libraries spawn some of a run's processes themselves, with no hook for PR_SET_PDEATHSIG: Prefect's
temporary server (uvicorn) and wandb's service. A SIGKILLed controller left them running, orphans
of init, until a rerun of the same run reaped them. So a controller starts one sentinel and names
each such process on the sentinel's stdin (`watch`). The kernel closes that pipe when the
controller dies, however it dies; the sentinel then SIGTERMs each named process and its children,
SIGKILLs what is left after GRACE_S, and exits. A clean exit closes the pipe too: nothing named
outlives its controller. Standard library only: it starts in milliseconds, anywhere.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

GRACE_S = 5.0


def _stat(pid: int) -> list[str] | None:
    """Fields of /proc/<pid>/stat after the command name (state is [0], ppid [1], start time [19])."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _started(pid: int) -> str | None:
    fields = _stat(pid)
    return None if fields is None or fields[0] == "Z" else fields[19]


def _tree(pid: int) -> list[int]:
    """`pid` and its descendants now (Linux's /proc)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (fields := _stat(int(entry))) is not None:
            children.setdefault(int(fields[1]), []).append(int(entry))
    tree, todo = [], [pid]
    while todo:
        p = todo.pop()
        tree.append(p)
        todo += children.get(p, [])
    return tree


def _signal(pids: list[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except OSError:
            continue


def take_down(named: dict[int, str]) -> None:
    """SIGTERM each named process still the one named (same start time) and its tree, then
    SIGKILL whatever of them is alive GRACE_S later."""
    tree = [p for pid, started in named.items() if _started(pid) == started for p in _tree(pid)]
    _signal(tree, signal.SIGTERM)
    deadline = time.monotonic() + GRACE_S
    while any(_started(p) for p in tree) and time.monotonic() < deadline:
        time.sleep(0.05)
    _signal([p for p in tree if _started(p)], signal.SIGKILL)


def main() -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl-C is the controller's to handle
    named: dict[int, str] = {}
    for line in sys.stdin:  # until EOF: the controller is gone
        pid = int(line)
        if (started := _started(pid)) is not None:
            named[pid] = started
    take_down(named)
    return 0


_sentinel: subprocess.Popen | None = None
_lock = threading.Lock()


def watch(pid: int) -> None:
    """Take process `pid` down when this process dies (Linux; elsewhere a rerun's reaper remains)."""
    global _sentinel
    if not sys.platform.startswith("linux"):
        return
    with _lock:
        if _sentinel is None or _sentinel.poll() is not None:
            _sentinel = subprocess.Popen(
                [sys.executable, "-m", "rlfleet.sentinel"],
                stdin=subprocess.PIPE,
                text=True,
                start_new_session=True,  # not the terminal's group: it outlives the controller's Ctrl-C
            )
        assert _sentinel.stdin is not None
        _sentinel.stdin.write(f"{pid}\n")
        _sentinel.stdin.flush()


if __name__ == "__main__":
    sys.exit(main())
