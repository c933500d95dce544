"""The pool loads weights on every replica at once (and puts them to sleep and wakes them at once):
with N replicas a load costs one replica's time, and an nccl broadcast needs every replica's
workers in the group together. Each replica here is a small HTTP server speaking the pool's side
of the protocol (pause, collective_rpc, resume, sleep, wake_up); a load call returns only once
every replica has received one (a barrier), so loads made one after another would fail it."""

from __future__ import annotations

import threading

import pytest
from fastapi import FastAPI
from fastapi.responses import JSONResponse, Response

from rlfleet.config.model import ModelConfig
from rlfleet.config.models import InferenceJobConfig
from rlfleet.inference.pool import InferencePool
from tests.helpers import serve_app

REPLICAS = 3


class Replica:
    def __init__(self, barrier: threading.Barrier):
        self.calls: list[str] = []
        self.barrier = barrier
        app = FastAPI()
        app.get("/health")(lambda: Response(status_code=200))
        for path in ("pause", "resume"):
            app.post(f"/{path}")(self._record(path))
        for path in ("sleep", "wake_up"):
            app.post(f"/{path}")(self._together(path))
        app.post("/collective_rpc")(self._together("load", {"results": [{"transfer_s": 0, "load_s": 0}]}))
        self.url, self.server = serve_app(app)

    def _record(self, name: str):
        def handler() -> Response:
            self.calls.append(name)
            return Response(status_code=200)

        return handler

    def _together(self, name: str, body: dict | None = None):
        def handler() -> Response:  # sync: FastAPI runs it in a thread, so replicas wait in parallel
            self.calls.append(name)
            self.barrier.wait(timeout=20)  # BrokenBarrierError (HTTP 500) unless all arrive together
            return JSONResponse(body or {})

        return handler


@pytest.fixture
def replicas():
    barrier = threading.Barrier(REPLICAS)
    started = [Replica(barrier) for _ in range(REPLICAS)]
    yield started
    barrier.abort()
    for r in started:
        r.server.should_exit = True


def test_weights_load_on_every_replica_at_once_each_paused_in_place(replicas, tmp_path):
    cfg = InferenceJobConfig(
        output_dir=str(tmp_path),
        model=ModelConfig(path="m"),
        inference={"urls": [r.url for r in replicas], "sleep": True},
    )
    pool = InferencePool(cfg)
    try:
        pool.sleep()
        assert pool.asleep
        out = pool.broadcast({"transport": "filesystem", "step": 1, "path": str(tmp_path / "w")})
    finally:
        pool.shutdown()
    assert out["step"] == 1 and len(out["calls"]) == REPLICAS
    assert all(pool.version(r.url) == 1 for r in replicas)
    for r in replicas:  # each: asleep, woken for weights, paused in place, loaded, resumed, KV woken
        assert r.calls == ["sleep", "wake_up", "pause", "load", "resume", "wake_up"]
