"""A fleet's warm controller: a process that has paid `rlfleet rl`'s imports (Prefect, the flow, its
tasks, transformers) and loaded the fleet model's tokenizer, and waits for one run. Those took an
attached run ~3 s to its flow and ~3-5 s of its base eval on an H200 host, ~7 s on 2 CPU cores.

`rlfleet rl --fleet NAME` hands a free one its command (`hand_off`): argv, environment, working
directory and the caller's stdin, stdout and stderr, passed over a Unix socket, then waits for its
exit code and passes SIGINT, SIGTERM and SIGHUP on. From then on the process is that run's
controller, as if `rlfleet rl` had started there: its own session, the run's output on the caller's
terminal, the run's lock in its name. It goes when the caller goes (SIGKILL: what a killed `rlfleet
rl` gets), and exits with the run. The fleet then starts a fresh one (fleet/keeper.py):
no state passes from one run to the next. With none free (each holds a run) the caller runs the
command itself, as without a fleet.

The caller's environment is the run's: the process takes it over, and Prefect's settings (read once,
at Prefect's import) are read again from it.

Files in `<fleet dir>/<name>/controller/<slot>/`: `warm.json` (pid and start time), `ready` (imports
done, listening) and `claimed.json` (the caller's pid). The socket is in Linux's abstract namespace,
named from that directory: a path under pytest's or a user's deep directory outgrows a socket
path's 108 bytes, and nothing is left behind when the process dies."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import socket
import struct
import sys
import threading
import time
from pathlib import Path
from typing import BinaryIO, TypedDict

from rlfleet.fleet.keeper import CLAIMED, READY, WARM
from rlfleet.fleet.state import fleet_dir, read_state, write_json_atomic
from rlfleet.procs import running, this_process

FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
_LEN = struct.Struct("!Q")
HANDSHAKE_S = 60.0
_taken = False  # this process is a warm controller running a run: it hands nothing off again


class Command(TypedDict):
    argv: list[str]  # rlfleet's arguments, the command first ("rl", "@", ...)
    env: dict[str, str]
    cwd: str
    caller: int  # the `rlfleet rl` process waiting for the exit code
    caller_started: float


def spools(name: str) -> list[Path]:
    """Fleet `name`'s warm controllers' directories, by replica slot."""
    base = fleet_dir() / name / "controller"
    return sorted((p for p in base.iterdir() if p.is_dir()), key=lambda p: p.name) if base.is_dir() else []


def address(spool: Path) -> str:
    """The warm controller's socket: an abstract one (a leading NUL), named from its directory."""
    return "\0rlfleet-controller-" + hashlib.sha256(str(spool.resolve()).encode()).hexdigest()[:32]


def serve_one(spool: Path, model: str) -> int:
    """The warm process: pay the imports and the tokenizer, take one caller's command, run it as
    `rlfleet` would, exit with its code."""
    global _taken
    write_json_atomic(spool / WARM, this_process())
    from rlfleet import cli
    from rlfleet.orchestrator.rollout import load_tokenizer

    _preload()
    try:
        load_tokenizer(model)
    except Exception as e:  # noqa: BLE001 - the run loads its own
        print(f"the tokenizer of {model} did not load, the run loads its own: {e!r}", flush=True)
    conn, command, fds = _take(spool)
    _taken = True
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
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
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
    import prefect.context

    prefect.context.GLOBAL_SETTINGS_CONTEXT = prefect.context.root_settings_context()


def _take(spool: Path) -> tuple[socket.socket, Command, list[int]]:
    """The first caller whose command arrives whole; the listener is closed then, so callers queued
    behind it find their connection dropped and try another warm controller."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(address(spool))
    listener.listen(8)
    (spool / READY).touch()
    while True:
        conn, _ = listener.accept()
        try:
            msg, fds, _flags, _addr = socket.recv_fds(conn, _LEN.size, 2)
            msg += _recv_exactly(conn, _LEN.size - len(msg))
            command: Command = json.loads(_recv_exactly(conn, _LEN.unpack(msg)[0]))
        except (OSError, ValueError):  # a caller that went first
            conn.close()
            continue
        if len(fds) != 2:
            conn.close()
            continue
        listener.close()
        return conn, command, fds


def hand_off(name: str, argv: list[str]) -> int | None:
    """Run `rlfleet <argv>` in one of fleet `name`'s warm controllers and return its exit code;
    None when none took it (none up, each running a run, or this process is one)."""
    if _taken or read_state(name) is None:
        return None
    for spool in spools(name):
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.settimeout(HANDSHAKE_S)  # it answers as soon as the command is whole
        try:
            conn.connect(address(spool))
            _send(conn, argv)
            replies = conn.makefile("rb")
            line = replies.readline()
        except OSError:  # no listener (it runs another run, or is starting), or no answer
            conn.close()
            continue
        if not line:  # it took another caller's command
            conn.close()
            continue
        conn.settimeout(None)  # the run takes as long as it takes
        return _wait(replies, int(json.loads(line)["pid"]))
    return None


def _send(conn: socket.socket, argv: list[str]) -> None:
    me = this_process()
    command: Command = {
        "argv": argv,
        "env": dict(os.environ),
        "cwd": os.getcwd(),
        "caller": int(me["pid"]),
        "caller_started": me["started"],
    }
    data = json.dumps(command).encode()
    socket.send_fds(conn, [_LEN.pack(len(data))], [sys.stdout.fileno(), sys.stderr.fileno()])
    conn.sendall(data)


def _wait(replies: BinaryIO, pid: int) -> int:
    for sig in FORWARDED:
        signal.signal(sig, lambda s, _frame: _forward(pid, s))
    sys.stdout.flush()
    sys.stderr.flush()
    line = replies.readline()
    if line:
        return int(line)
    print(f"rlfleet: the fleet's warm controller (pid {pid}) running this command died", file=sys.stderr)
    return 128 + signal.SIGKILL


def _forward(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)


def _die_with_caller(command: Command) -> None:
    while running(command["caller"], command["caller_started"]):
        time.sleep(0.5)
    os.kill(os.getpid(), signal.SIGKILL)


def _recv_exactly(conn: socket.socket, n: int) -> bytes:
    chunks, got = [], 0
    while got < n:
        chunk = conn.recv(n - got)
        if not chunk:
            raise ConnectionError("the caller went before its command was whole")
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


if __name__ == "__main__":
    sys.exit(serve_one(Path(sys.argv[1]), sys.argv[2]))
