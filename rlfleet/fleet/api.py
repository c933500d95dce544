"""The fleet's Prefect API. A run attached to a fleet talks to it (`use_fleet_api`), so it starts no
temporary server of its own: that server was the longest piece of an attached run's start (~15 s
on 2 cores, 13.5 s on a GPU host). Under a work-pool worker (PREFECT_API_URL set) the fleet records
the worker's API. Otherwise it starts `prefect server start` on `api_port`, with its own PREFECT_HOME
(database, logs) under the fleet's directory, and starts it again if it dies: the runs' flow runs
are all there, where the UI shows them."""

from __future__ import annotations

import logging
import os
import sys
import time
from pathlib import Path

from rlfleet.config.fleet import FleetConfig
from rlfleet.config.inference import port_free
from rlfleet.fleet.state import read_state
from rlfleet.inference.server import healthy
from rlfleet.procs import ManagedProcess, wait_until

log = logging.getLogger("rlfleet.fleet")
HOST = "127.0.0.1"
START_TIMEOUT_S = 180.0


def check_api_port(cfg: FleetConfig) -> list[str]:
    """The port of the server the fleet will start is free (none to start: nothing to check)."""
    if os.environ.get("PREFECT_API_URL") or port_free(HOST, cfg.api_port):
        return []
    return [f"api_port: port {cfg.api_port} on {HOST} is in use (another Prefect server?)"]


class FleetApi:
    """The Prefect API the fleet's runs use: the one this process is given, else a server it keeps."""

    def __init__(self, cfg: FleetConfig, home: Path):
        given = os.environ.get("PREFECT_API_URL")
        self.url = given or f"http://{HOST}:{cfg.api_port}/api"
        self.restarts = 0
        self.server = (
            None
            if given
            else ManagedProcess(
                name="prefect_server",
                cmd=[
                    sys.executable,
                    "-m",
                    "prefect",
                    "server",
                    "start",
                    "--host",
                    HOST,
                    "--port",
                    str(cfg.api_port),
                ],
                log_path=home / "prefect" / "server.log",
                pidfile=home / "run" / "prefect_server.pid",
                env={"PREFECT_HOME": str(home / "prefect")},
            )
        )

    def start(self) -> FleetApi:
        if self.server is not None:
            self.server.start()
        return self

    def wait_ready(self) -> str:
        server = self.server
        if server is not None:
            wait_until(
                self.healthy,
                START_TIMEOUT_S,
                what=f"the fleet's Prefect server on {self.url}",
                abort=lambda: None if server.alive() else "it exited:\n" + server.log_tail(),
            )
        return self.url

    def healthy(self) -> bool:
        return healthy(self.url)

    def create_gpu_limits(self, gpus: list[str]) -> list[str]:
        """Create the per-GPU concurrency limits (`gpu-<id>`, 1 slot) of the fleet's GPUs on its API:
        an attached run, a UI rerun or a scheduled eval then leases the GPUs of the replica it holds,
        as a run from a deployment does (workers/leases.py); without them the lease is skipped."""
        if not gpus:
            return []
        from prefect.settings import PREFECT_API_URL, temporary_settings

        from rlfleet.workers.leases import ensure_gpu_limits

        with temporary_settings(updates={PREFECT_API_URL: self.url}):
            return ensure_gpu_limits(gpus)

    def keep(self) -> None:
        """Start the server again if it died; the runs' clients retry while it comes back."""
        if self.server is None or self.server.alive():
            return
        log.warning(
            "the fleet's Prefect server exited (%s): starting it again on %s",
            self.server.returncode(),
            self.url,
        )
        self.server.start()
        self.restarts += 1
        started = time.monotonic()
        self.wait_ready()
        log.info("the fleet's Prefect server is back after %.1f s", time.monotonic() - started)

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()


def use_fleet_api(fleet: str | None) -> None:
    """A run or an eval on a fleet uses the fleet's Prefect API, unless PREFECT_API_URL names
    another. Set before Prefect is first imported: it reads its settings once."""
    if fleet is None or os.environ.get("PREFECT_API_URL"):
        return
    state = read_state(fleet)
    if state is not None and state.get("api_url"):
        os.environ["PREFECT_API_URL"] = state["api_url"]
        log.info("on fleet %s's Prefect API, %s", fleet, state["api_url"])
