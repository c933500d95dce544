"""Prefect's temporary server, when this controller started one (no PREFECT_API_URL): named in the
run's pidfiles. It is a subprocess (uvicorn) that outlives a SIGKILLed controller, as an orphan of
init holding its port and SQLite file; the rerun's reap (runs/lock.py) now kills it."""

from __future__ import annotations

from prefect.server.api.server import SubprocessASGIServer

from rlfleet.runs.lock import adopt
from rlfleet.store import RunStore

PIDFILE = "prefect_server"


def hold_temporary_server(store: RunStore) -> None:
    """Adopt the temporary server(s) this process started. Prefect keeps them in a private
    per-port registry (`SubprocessASGIServer._instances`, Prefect 3): if that moves, nothing is
    adopted and the orphan is back, so tests/test_run_lock.py checks it."""
    for server in list(SubprocessASGIServer._instances.values()):
        proc = server.server_process
        if proc is not None and proc.poll() is None:
            adopt(store, PIDFILE, proc.pid)
