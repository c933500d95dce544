"""`python -m rlfleet.guard CMD...`: run CMD and take its whole process group down with the guard.

`procs.ManagedProcess` starts every child through this guard, as the leader of a new process
group, with SIGTERM on parent death. SIGTERM alone is not enough: a vLLM server with a request in
flight (its engine already stopped) waits forever in uvicorn's graceful shutdown. So on SIGTERM the
guard passes it to the group, gives it GRACE_S, then SIGKILLs the group, itself included. Otherwise
it exits as CMD did. Standard library only: it must start fast and anywhere rlfleet runs.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

GRACE_S = 10.0


def main(argv: list[str]) -> int:
    child = subprocess.Popen(argv)  # same session and group as the guard, same stdio

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
    if rc < 0:  # died of a signal: so does the guard, so the parent sees the same exit
        signal.signal(-rc, signal.SIG_DFL)
        os.kill(os.getpid(), -rc)
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
