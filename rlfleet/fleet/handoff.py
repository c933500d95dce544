"""`rlfleet rl --fleet NAME`'s side of a warm controller (fleet/controller.py), and what both sides
share: hand a free one the command (argv, environment, working directory, and the caller's stdout
and stderr as file descriptors over a Unix socket), then wait for its exit code, passing SIGINT,
SIGTERM and SIGHUP on. A ready one is tried first; one still importing (a fresh one, right after a
run) takes the command when its imports are done, sooner than the caller's own would be. With none
free (each runs a run) the caller runs the command itself, as without a fleet.

The socket is in Linux's abstract namespace, named from the warm controller's directory: a path
under pytest's or a user's deep directory outgrows a socket path's 108 bytes, and nothing is left
behind when the process dies."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import socket
import struct
import sys
from pathlib import Path
from typing import BinaryIO, TypedDict

from rlfleet.fleet.keeper import READY, spool
from rlfleet.fleet.state import fleet_dir, read_state
from rlfleet.procs import this_process

FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
LEN = struct.Struct("!Q")  # the command's size, sent with the file descriptors
HANDSHAKE_S = 60.0
_disabled = False


class Command(TypedDict):
    argv: list[str]  # rlfleet's arguments, the command first ("rl", "@", ...)
    env: dict[str, str]
    cwd: str
    caller: int  # the `rlfleet rl` process waiting for the exit code
    caller_started: float


def disable() -> None:
    """This process is a warm controller running a run: it hands nothing off again."""
    global _disabled
    _disabled = True


def address(spool: Path) -> str:
    """The warm controller's socket: an abstract one (a leading NUL), named from its directory."""
    return "\0rlfleet-controller-" + hashlib.sha256(str(spool.resolve()).encode()).hexdigest()[:32]


def hand_off(name: str, argv: list[str]) -> int | None:
    """Run `rlfleet <argv>` in one of fleet `name`'s warm controllers and return its exit code;
    None when none took it (none up, each running a run, or this process is one)."""
    if _disabled or (state := read_state(name)) is None:
        return None
    spools = [spool(fleet_dir() / name, "controller", slot) for slot in range(len(state["urls"]))]
    for slot_spool in sorted(spools, key=lambda s: not (s / READY).exists()):  # ready ones first
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.settimeout(HANDSHAKE_S)  # it answers once its imports are done and the command is whole
        try:
            conn.connect(address(slot_spool))
            _send(conn, argv)
            replies = conn.makefile("rb")
            line = replies.readline()
        except OSError:  # no listener (it runs another run, or has not started), or no answer
            conn.close()
            continue
        if not line:  # it took another caller's command
            conn.close()
            continue
        conn.settimeout(None)  # the run takes as long as it takes
        return _wait(replies, int(json.loads(line)["pid"]))
    print(
        f"rlfleet: no warm controller of fleet {name!r} is free (each runs a run, or none listens yet);"
        " this process runs the command, paying its own imports",
        file=sys.stderr,
    )
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
    socket.send_fds(conn, [LEN.pack(len(data))], [sys.stdout.fileno(), sys.stderr.fileno()])
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


def recv_exactly(conn: socket.socket, n: int) -> bytes:
    chunks, got = [], 0
    while got < n:
        chunk = conn.recv(n - got)
        if not chunk:
            raise ConnectionError("the caller went before its command was whole")
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)
