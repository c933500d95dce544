"""Prefect's temporary server, when this controller started one (no PREFECT_API_URL): named in the
run's pidfiles. It is a subprocess (uvicorn) that outlives a SIGKILLed controller, as an orphan of
init holding its port and SQLite file; the rerun's reap (runs/lock.py) kills it."""

from __future__ import annotations

import atexit
import logging
import subprocess
import sys
import threading
from typing import Any

from prefect.settings import PREFECT_API_URL, PREFECT_SERVER_ALLOW_EPHEMERAL_MODE

from rlfleet.inference.server import healthy
from rlfleet.progress import Progress
from rlfleet.runs.lock import adopt
from rlfleet.store import RunStore

PIDFILE = "prefect_server"
log = logging.getLogger("rlfleet.flows")
# Prefect's server module (FastAPI, SQLAlchemy, docket: ~3 s on 2 cores): Prefect's client imports
# it where it starts a temporary server, and a run on a shared API never needs it.
SERVER_MODULE = "prefect.server.api.server"


def _servers() -> list[Any]:
    """The temporary servers this process started (Prefect's private per-port registry,
    `SubprocessASGIServer._instances`); none where nothing imported the server module."""
    module = sys.modules.get(SERVER_MODULE)
    return [] if module is None else list(module.SubprocessASGIServer._instances.values())


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
    for server in _servers():
        proc = server.server_process
        if proc is not None and proc.poll() is None:
            adopt(store, PIDFILE, proc.pid)


class ServerKeeper:
    """Restart this process's temporary server on its port when it dies under a running flow:
    Prefect's client retries a refused connection for about a minute, and the server's SQLite
    file keeps every run's state, so the flow goes on. Without it a killed server failed the run
    minutes later (each API call's retries), and only a rerun went on (the chaos soak)."""

    def __init__(self, store: RunStore, progress: Progress, poll_s: float = 0.5):
        self.store, self.progress, self.poll_s = store, progress, poll_s
        self.restarts = 0
        self._stop = threading.Event()
        self._server = next((s for s in _servers() if s.server_process is not None), None)
        self._thread = threading.Thread(target=self._watch, name="rlfleet-prefect-server", daemon=True)

    def start(self) -> ServerKeeper:
        if self._server is not None:  # else the API is not this process's to keep
            atexit.register(self.stop)  # before Prefect's own stop (atexit runs last in, first out)
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _watch(self) -> None:
        server = self._server
        while not self._stop.wait(self.poll_s):
            proc = server.server_process
            if proc is None or proc.poll() is None or self._stop.is_set():
                continue
            log.warning(
                "Prefect's temporary server exited (%s): restarting it on port %s",
                proc.returncode,
                server.port,
            )
            with self.progress.starting_up("Prefect's temporary server"):
                server.server_process = proc = server._run_uvicorn_command()
                adopt(self.store, PIDFILE, proc.pid)
                self.restarts += 1
                while not self._stop.wait(0.2) and proc.poll() is None and not healthy(server.api_url):
                    pass
