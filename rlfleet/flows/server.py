"""Prefect's temporary server, when this controller started one (no PREFECT_API_URL): named in the
run's pidfiles. It is a subprocess (uvicorn) that outlives a SIGKILLed controller, as an orphan of
init holding its port and SQLite file; the rerun's reap (runs/lock.py) now kills it."""

from __future__ import annotations

import sys

from rlfleet.runs.lock import adopt
from rlfleet.store import RunStore

PIDFILE = "prefect_server"
# Prefect's server module (FastAPI, SQLAlchemy, docket: ~3 s on 2 cores): Prefect's client imports
# it where it starts a temporary server, and a run on a shared API never needs it.
SERVER_MODULE = "prefect.server.api.server"


def hold_temporary_server(store: RunStore) -> None:
    """Adopt the temporary server(s) this process started. Prefect keeps them in a private
    per-port registry (`SubprocessASGIServer._instances`, Prefect 3): if that moves, nothing is
    adopted and the orphan is back, so tests/test_run_lock.py checks it."""
    server_module = sys.modules.get(SERVER_MODULE)
    if server_module is None:  # nothing imported it: no temporary server was started here
        return
    for server in list(server_module.SubprocessASGIServer._instances.values()):
        proc = server.server_process
        if proc is not None and proc.poll() is None:
            adopt(store, PIDFILE, proc.pid)
