"""The rollout load balancer against completion servers on loopback with known speeds.

The servers speak the slice of vLLM's /v1/completions that the sampler uses; what is under test
is the dispatch: work follows free capacity, a replica that stops answering loses its requests
to the others, and requests no replica could serve are sent again after the pool is healed. The real vLLM path runs in test_e2e and test_faults.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter

import pytest
import uvicorn
from fastapi import FastAPI
from fastapi.responses import JSONResponse

from rlfleet.errors import TransientError
from rlfleet.orchestrator.sampler import sample_groups, sample_with_healing
from tests.conftest import free_port


def _server(delay_s: float, fail_after: int | None = None) -> tuple[str, uvicorn.Server]:
    app = FastAPI()
    served = {"n": 0}

    @app.post("/v1/completions")
    async def complete(body: dict):
        served["n"] += 1
        if fail_after is not None and served["n"] > fail_after:
            return JSONResponse({"error": "engine dead"}, status_code=500)
        await asyncio.sleep(delay_s)
        choices = [
            {
                "index": k,
                "text": "a",
                "token_ids": [7],
                "logprobs": {"token_logprobs": [-0.5]},
                "finish_reason": "length",
            }
            for k in range(body["n"])
        ]
        return {"choices": choices}

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error"))
    threading.Thread(target=server.run, daemon=True).start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert time.monotonic() < deadline, "test server did not start"
        time.sleep(0.02)
    return f"http://127.0.0.1:{port}", server


@pytest.fixture
def servers():
    started: list[uvicorn.Server] = []

    def start(delay_s: float, fail_after: int | None = None) -> str:
        url, server = _server(delay_s, fail_after)
        started.append(server)
        return url

    yield start
    for server in started:
        server.should_exit = True


def _sample(urls, num_prompts, slots=2):
    prompts = [[1, 2, i] for i in range(num_prompts)]
    return asyncio.run(sample_groups(urls, prompts, 2, 1, 1.0, 30.0, slots_per_replica=slots))


def test_work_follows_free_capacity(servers):
    fast, slow = servers(0.01), servers(0.25)
    results = _sample([fast, slow], 40)
    assert all(isinstance(r, list) and len(r) == 2 for r in results)
    by = Counter(r[0].replica for r in results)
    assert by[fast] + by[slow] == 40
    assert by[slow] >= 1, "the slow replica still takes work while it has free slots"
    assert by[fast] >= 3 * by[slow], f"the faster replica should pull most prompts, got {dict(by)}"


def test_replica_that_stops_answering_loses_its_requests(servers):
    good, dying = servers(0.02), servers(0.02, fail_after=3)
    results = _sample([good, dying], 30)
    assert all(isinstance(r, list) for r in results), [r for r in results if not isinstance(r, list)]
    by = Counter(r[0].replica for r in results)
    assert by[good] + by[dying] == 30
    assert by[dying] <= 3, "nothing is sent to a replica after it failed"
    resent = [r for r in results if r[0].resent]
    assert len(resent) >= 1 and all(r[0].replica == good and r[0].resent == 1 for r in resent)
    assert all(r[0].resent == 0 for r in results if r[0].replica == dying)


def test_no_replica_left_gives_transient_errors(servers):
    a, b = servers(0.01, fail_after=1), servers(0.01, fail_after=1)
    results = _sample([a, b], 10, slots=1)
    served = [r for r in results if isinstance(r, list)]
    failed = [r for r in results if isinstance(r, BaseException)]
    assert len(served) == 2 and len(failed) == 8
    assert all(isinstance(e, TransientError) and "no replica left" in str(e) for e in failed)


def test_failed_requests_are_resent_after_healing_and_marked(servers):
    dying = servers(0.01, fail_after=2)
    calls: list[list[str]] = []

    def healthy_urls() -> list[str]:  # the pool: the second call finds the replica relaunched
        calls.append([dying] if not calls else [servers(0.01)])
        return calls[-1]

    groups = sample_with_healing(healthy_urls, [[1, 2, i] for i in range(6)], 2, 1, 1.0, 30.0)
    assert len(calls) == 2 and all(len(g) == 2 for g in groups)
    first = [g for g in groups if g[0].replica == dying]
    again = [g for g in groups if g[0].replica == calls[1][0]]
    assert len(first) <= 2 and len(first) + len(again) == 6
    assert all(s.resent == 0 for g in first for s in g)
    assert all(s.resent >= 1 for g in again for s in g)
