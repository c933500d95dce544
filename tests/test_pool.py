"""The pool's relaunch rule without vLLM (fake processes): a dead replica is relaunched alone while
the others serve on, so the samples streaming on them go on; a transport whose replicas share one
group that cannot grow (nccl) relaunches them all. Real replicas die in test_replica_watch."""

from __future__ import annotations

from typing import Any

import pytest

from rlfleet.inference import pool as module
from rlfleet.inference.pool import InferencePool
from rlfleet.inference.server import Replica
from tests.helpers import rl_config


class Proc:
    def __init__(self, alive: bool = True):
        self.up, self.stopped = alive, False

    def alive(self) -> bool:
        return self.up and not self.stopped

    def returncode(self) -> int | None:
        return None if self.alive() else -9

    def stop(self) -> None:
        self.stopped = True


@pytest.mark.parametrize(("transport", "alone"), [(None, True), ("filesystem", True), ("nccl", False)])
def test_a_dead_replica_is_relaunched_alone_while_the_others_serve_on(
    tmp_path, monkeypatch, transport, alone
):
    started: list[int] = []

    def start_replica(cfg: Any, r: int, model_path: str | None = None) -> Replica:
        started.append(r)
        return Replica(r, f"http://new-{r}", Proc())

    def launch_replicas(cfg: Any, model_path: str | None = None) -> list[Replica]:
        return [start_replica(cfg, r) for r in range(cfg.inference.num_replicas)]

    monkeypatch.setattr(module, "start_replica", start_replica)
    monkeypatch.setattr(module, "launch_replicas", launch_replicas)
    monkeypatch.setattr(module, "wait_ready", lambda cfg, replicas: replicas)
    monkeypatch.setattr(module, "probe", lambda url: True)
    monkeypatch.setattr(module, "write_served", lambda store, step: None)
    monkeypatch.setattr(InferencePool, "_resync", lambda self: None)  # loads the served weights
    cfg = rl_config(tmp_path, tmp_path / "run", max_steps=1, **{"inference.num-replicas": "3"})
    pool = InferencePool(cfg.inference_job())
    live, dead, other = (
        Replica(0, "http://a", Proc()),
        Replica(1, "http://b", Proc(False)),
        Replica(2, "http://c", Proc()),
    )
    pool.replicas = [live, dead, other]
    pool.versions = {"http://a": 3, "http://b": 3, "http://c": 3}
    pool.ticket = None if transport is None else {"transport": transport, "step": 3}

    urls = pool._ensure()  # what the watch and a failed request call (without starting the watch)
    if alone:
        assert started == [1] and urls == ["http://a", "http://new-1", "http://c"]
        assert not live.process.stopped and not other.process.stopped and dead.process.stopped
        assert pool.versions == {"http://a": 3, "http://c": 3}  # the live ones' loads stand
    else:
        assert started == [0, 1, 2] and live.process.stopped and other.process.stopped
    assert [r["replica"] for r in pool.relaunched] == [1]
