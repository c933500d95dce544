"""A fleet's warm controller: a process that has paid `rlfleet rl`'s imports (Prefect, the flow, its
tasks, torch, matplotlib) and loaded the fleet model's tokenizer, and waits for one run. Those took
an attached run ~3 s to its flow and ~3-5 s of its base eval on an H200 host, ~7 s on 2 CPU cores.

`rlfleet rl --fleet NAME` hands a free one its command (fleet/handoff.py). From then on the process
is that run's controller, as if `rlfleet rl` had started there: its own session, the run's output on
the caller's stdout and stderr, the run's lock in its name, the caller's environment (Prefect's
settings, read once at Prefect's import, are read again from it). It goes when the caller goes
(SIGKILL: what a killed `rlfleet rl` gets), and exits with the run. The fleet then starts a fresh
one (fleet/keeper.py): no state passes from one run to the next.

Files in `<fleet dir>/<name>/controller/<slot>/`: `warm.json` (pid and start time, written once it
listens), `ready` (imports done) and `claimed.json` (the caller's pid)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import sys
import threading
import time
from pathlib import Path

from rlfleet.fleet import handoff
from rlfleet.fleet.handoff import LEN, Command, recv_exactly
from rlfleet.fleet.keeper import CLAIMED, READY, WARM
from rlfleet.fleet.state import write_json_atomic
from rlfleet.procs import running, this_process


def serve_one(spool: Path, model: str) -> int:
    """The warm process: listen, pay the imports and the tokenizer, take one caller's command, run it
    as `rlfleet` would, exit with its code. It listens first: a caller that comes while it imports
    waits in the socket's queue for less than its own imports would take."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(handoff.address(spool))
    listener.listen(8)
    write_json_atomic(spool / WARM, this_process())
    from rlfleet import cli
    from rlfleet.orchestrator.rollout import load_tokenizer

    _preload()
    try:
        load_tokenizer(model)
    except Exception as e:  # noqa: BLE001 - the run loads its own
        print(f"the tokenizer of {model} did not load, the run loads its own: {e!r}", flush=True)
    (spool / READY).touch()
    conn, command, fds = _take(listener)
    handoff.disable()
    write_json_atomic(spool / CLAIMED, {"pid": command["caller"], "started": command["caller_started"]})
    conn.sendall(json.dumps(this_process()).encode() + b"\n")  # the caller forwards signals here
    os.setsid()  # out of the fleet's process group: the run's controller now
    sys.stdout.flush()
    sys.stderr.flush()
    for target, fd in zip((1, 2), fds, strict=True):  # the caller's stdout and stderr
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(command["cwd"])
    os.environ.clear()
    os.environ.update(command["env"])
    sys.argv = ["rlfleet", *command["argv"]]
    _settings_from_env()
    threading.Thread(
        target=_die_with_caller, args=(command,), name="rlfleet-caller-watch", daemon=True
    ).start()
    code = 1
    try:
        code = cli.main(command["argv"])
    except SystemExit as e:  # the code a process exiting so would have
        code = e.code if isinstance(e.code, int) else int(e.code is not None)
        raise
    except KeyboardInterrupt:  # a forwarded ^C: as the shell reports a process it ended
        code = 128 + signal.SIGINT
        raise
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        with contextlib.suppress(OSError):  # a caller gone takes this process with it anyway
            conn.sendall(f"{code}\n".encode())
    return code


def _preload() -> None:
    """What a run's controller imports on its way to step 0's end: Prefect, the flow and its tasks;
    torch, for step 0's batches (2.3 s of a warm-fleet run's step 0 on 2 cores); matplotlib, for the
    live reward curve after it."""
    import matplotlib

    from rlfleet import microbatches  # noqa: F401
    from rlfleet.flows.rl import rl  # noqa: F401

    matplotlib.use("Agg")
    import matplotlib.pyplot  # noqa: F401


def _settings_from_env() -> None:
    """Prefect's settings read again, from the caller's environment: Prefect reads them once, at
    its import, into the context every later read goes through (the API the run uses included)."""
    from prefect.context import refresh_global_settings_context

    refresh_global_settings_context()


def _take(listener: socket.socket) -> tuple[socket.socket, Command, list[int]]:
    """The first caller whose command arrives whole; the listener is closed then, so callers queued
    behind it find their connection dropped and try another warm controller."""
    while True:
        conn, _ = listener.accept()
        try:
            msg, fds, _flags, _addr = socket.recv_fds(conn, LEN.size, 2)
            msg += recv_exactly(conn, LEN.size - len(msg))
            command: Command = json.loads(recv_exactly(conn, LEN.unpack(msg)[0]))
        except (OSError, ValueError):  # a caller that went first
            conn.close()
            continue
        if len(fds) != 2:
            conn.close()
            continue
        listener.close()
        return conn, command, fds


def _die_with_caller(command: Command) -> None:
    while running(command["caller"], command["caller_started"]):
        time.sleep(0.5)
    os.kill(os.getpid(), signal.SIGKILL)


if __name__ == "__main__":
    sys.exit(serve_one(Path(sys.argv[1]), sys.argv[2]))
