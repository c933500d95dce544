"""Prefect's temporary server, when this controller started one (no PREFECT_API_URL): named in the
run's pidfiles. It is a subprocess (uvicorn) that outlives a SIGKILLed controller, as an orphan of
init holding its port and SQLite file; the rerun's reap (runs/lock.py) kills it."""

from __future__ import annotations

import subprocess
import sys

from prefect.settings import PREFECT_API_URL, PREFECT_SERVER_ALLOW_EPHEMERAL_MODE

from rlfleet.runs.lock import adopt
from rlfleet.store import RunStore

PIDFILE = "prefect_server"
# Prefect's server module (FastAPI, SQLAlchemy, docket: ~3 s on 2 cores): Prefect's client imports
# it where it starts a temporary server, and a run on a shared API never needs it.
SERVER_MODULE = "prefect.server.api.server"


def start_temporary_server(store: RunStore) -> None:
    """Start the temporary server now, named in the run's pidfiles the moment it is spawned, for
    a controller that holds the run's lock (`rlfleet rl` on a CPU box): one killed while the server
    started (~15 s on 2 cores), before the flow adopted it, left it running unnamed (the chaos
    soak, benchmarks/chaos.py). Prefect's client reuses it: one per process, the port-less one.
    Prefect spawns it in a private method (`_run_uvicorn_command`, Prefect 3), wrapped here for
    this one server; tests/test_run_lock.py checks that it still is."""
    if PREFECT_API_URL.value() or not PREFECT_SERVER_ALLOW_EPHEMERAL_MODE.value():
        return
    from prefect.server.api.server import SubprocessASGIServer  # SERVER_MODULE: only where one starts

    server = SubprocessASGIServer()
    if not server.running:
        spawn = server._run_uvicorn_command

        def spawn_named() -> subprocess.Popen:
            proc = spawn()
            adopt(store, PIDFILE, proc.pid)
            return proc

        server._run_uvicorn_command = spawn_named  # type: ignore[method-assign]
        server.start()
    hold_temporary_server(store)


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
