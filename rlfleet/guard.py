"""`python -m rlfleet.guard CMD...`: run CMD and take its whole process group down with the guard.

`procs.ManagedProcess` starts every child through this guard, as the leader of a new process
group, with SIGTERM on parent death. SIGTERM alone is not enough: a vLLM server with a request in
flight (its engine already stopped) waits forever in uvicorn's graceful shutdown. So on SIGTERM the
guard passes it to the group, gives it GRACE_S, then SIGKILLs the group, itself included. Otherwise
it exits as CMD did, once it has SIGKILLed what CMD left in the group. A guard killed outright (SIGKILL) cannot do any of that: CMD gets SIGKILL from
the kernel the moment the guard dies (PR_SET_PDEATHSIG), and the owner's group kill takes the rest. Standard library only: it must start fast and anywhere rlfleet runs.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable

GRACE_S = 10.0


_PR_SET_PDEATHSIG = 1


def die_with_parent(sig: int) -> Callable[[], None]:
    """A `preexec_fn`: the child gets `sig` when the process starting it dies (Linux prctl; elsewhere
    the owner's group kill and the pidfile reaper remain). A parent already gone by then is caught too."""
    parent = os.getpid()

    def arm() -> None:
        with contextlib.suppress(OSError, AttributeError):  # not glibc
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, sig)
        if os.getppid() != parent:
            os._exit(1)

    return arm


def kill_rest_of_group() -> None:
    """SIGKILL what the dead child left in the guard's group, the guard excepted: vLLM's engine
    core outlives its killed API server, and holds the server's listening socket (a fork), so
    requests to the replica queue in its backlog and hang instead of failing, and a relaunch finds
    the port taken. Linux's /proc; elsewhere the owner's group kill remains."""
    me, group = os.getpid(), os.getpgid(0)
    if group != me:  # not the leader of its own group (ManagedProcess makes it one): not its to kill
        return
    with contextlib.suppress(OSError):
        pids = [int(e) for e in os.listdir("/proc") if e.isdigit() and int(e) != me]
        for pid in pids:
            try:
                with open(f"/proc/{pid}/stat") as f:  # "pid (comm) state ppid pgrp ..."
                    pgrp = int(f.read().rsplit(")", 1)[1].split()[2])
                if pgrp == group:
                    os.kill(pid, signal.SIGKILL)
            except (OSError, ValueError, IndexError):
                continue


def main(argv: list[str]) -> int:
    # Same session and group as the guard, same stdio. SIGKILL when the guard dies: a guard killed
    # outright (SIGKILL, OOM killer) runs no grace period, and SIGTERM alone can leave a vLLM server
    # with requests in flight waiting forever; its children are the group's, which the owner kills.
    child = subprocess.Popen(argv, preexec_fn=die_with_parent(signal.SIGKILL))

    def exited() -> bool:
        # Not child.poll(): this handler interrupts child.wait(), which holds the lock poll()
        # needs, so poll() says "running" until the deadline even after the child has exited.
        try:
            return os.waitpid(child.pid, os.WNOHANG)[0] != 0
        except ChildProcessError:
            return True

    def down(signum: int, frame: object) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        os.killpg(0, signal.SIGTERM)
        deadline = time.monotonic() + GRACE_S
        while not exited() and time.monotonic() < deadline:
            time.sleep(0.05)
        os.killpg(0, signal.SIGKILL)

    signal.signal(signal.SIGTERM, down)
    rc = child.wait()
    kill_rest_of_group()
    if rc < 0:  # died of a signal: so does the guard, so the parent sees the same exit
        if -rc not in (signal.SIGKILL, signal.SIGSTOP):  # those two have no handler to reset
            signal.signal(-rc, signal.SIG_DFL)
        os.kill(os.getpid(), -rc)
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
