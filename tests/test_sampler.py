"""The streaming sampler against completion servers on loopback whose streams the test controls.

The servers speak the slice of vLLM's streamed /inference/v1/generate that the sampler uses (token
ids, logprobs and finish reasons per chunk and choice). What is under test: work goes to the replica
with the fewest requests in flight; a request that keeps streaming never times out however long
it runs; one whose replica dies or stalls keeps its tokens and continues elsewhere from them;
each token is credited to the weights its replica served; a replica too busy to answer /health in
time is alive to the pool's liveness probe, one that answers an error or refuses is down. The real
vLLM path runs in test_e2e and test_faults.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time

import pytest
from fastapi import FastAPI
from fastapi.responses import Response, StreamingResponse

from rlfleet.errors import TransientError
from rlfleet.inference.server import probe
from rlfleet.orchestrator.sampler import FixedReplicas, Sampler
from tests.helpers import serve_app


class Server:
    """Streams token 100 + position, one chunk per token, `delay_s` apart. `die_after` cuts every
    stream after that many tokens; `stall_after` stops sending (connection open) after that many;
    `gates[i]`, when set, is awaited before token i of every stream."""

    def __init__(self, delay_s=0.0, die_after=None, stall_after=None, gates=None):
        self.delay_s, self.die_after, self.stall_after = delay_s, die_after, stall_after
        self.health_status = 200
        self.health_gate: threading.Event | None = None  # when set: /health answers only once it is
        self.gates: dict[int, threading.Event] = gates or {}
        self.bodies: list[dict] = []
        app = FastAPI()
        app.post("/inference/v1/generate")(self.complete)
        app.get("/health")(self.health)
        self.url, self.server = serve_app(app)

    async def health(self):
        if self.health_gate is not None:
            await asyncio.to_thread(self.health_gate.wait, 10)
        return Response(status_code=self.health_status)

    async def complete(self, body: dict):
        self.bodies.append(body)
        params = body["sampling_params"]

        lp = {"content": [{"token": "token_id:0", "logprob": -0.5}]}

        async def events():
            for pos in range(params["max_tokens"]):
                if (gate := self.gates.get(pos)) is not None:
                    await asyncio.to_thread(gate.wait, 10)
                if self.die_after is not None and pos >= self.die_after:
                    raise RuntimeError("replica died")  # uvicorn drops the connection mid-stream
                if self.stall_after is not None and pos >= self.stall_after:
                    await asyncio.sleep(3600)
                await asyncio.sleep(self.delay_s)
                last = pos == params["max_tokens"] - 1
                for i in range(params["n"]):
                    choice = {
                        "index": i,
                        "token_ids": [100 + len(body["token_ids"]) + pos],
                        "logprobs": lp,
                        "finish_reason": "length" if last else None,
                    }
                    yield f"data: {json.dumps({'choices': [choice]})}\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    def stop(self):
        self.server.should_exit = True


@pytest.fixture
def servers():
    started: list[Server] = []

    def start(**kw) -> Server:
        started.append(Server(**kw))
        return started[-1]

    yield start
    for s in started:
        for gate in [*s.gates.values(), s.health_gate]:
            if gate is not None:
                gate.set()
        s.stop()


def _run(replicas, prompts, n=2, max_tokens=4, stall_timeout_s=30.0):
    async def main():
        sampler = Sampler(replicas, 1.0, stall_timeout_s)
        try:
            return await asyncio.gather(*(sampler.sample(p, n, max_tokens) for p in prompts))
        finally:
            await sampler.aclose()

    return asyncio.run(main())


def test_work_goes_to_the_replica_with_fewest_requests_in_flight(servers):
    """Each request goes to the replica with the fewest in flight when it is sent (the first listed
    on a tie): requests held open at token 0 (gates) make the counts known, so the order of
    replicas is exact, not inferred from one replica being slower."""
    gate_a, gate_b = threading.Event(), threading.Event()
    a, b = servers(gates={0: gate_a}), servers(gates={0: gate_b})

    async def main():
        sampler = Sampler(FixedReplicas([a.url, b.url]), 1.0, 30.0)

        async def send(i: int):  # request i, once a replica has it
            task = asyncio.create_task(sampler.sample([1, i], 1, 4))
            deadline = time.monotonic() + 30  # a safety net: the request arrives at once
            while len(a.bodies) + len(b.bodies) <= i and not task.done():
                assert time.monotonic() < deadline, f"request {i} reached no replica"
                await asyncio.sleep(0.01)
            return task

        try:
            first = await send(0)  # none in flight: the first listed, a
            second = await send(1)  # a holds one: b
            third = await send(2)  # one each: a
            gate_b.set()
            done = await second  # b has none in flight again, a two
            fourth = await send(3)  # b
            gate_a.set()
            return [await first, done, await third, await fourth]
        finally:
            gate_a.set()
            gate_b.set()
            await sampler.aclose()

    results = asyncio.run(main())
    assert [r[0].replica for r in results] == [a.url, b.url, a.url, b.url]
    assert [body["token_ids"] for body in a.bodies] == [[1, 0], [1, 2]]
    assert [body["token_ids"] for body in b.bodies] == [[1, 1], [1, 3]]


def test_a_group_of_n_weighs_n_samples_in_the_choice_of_replica(servers):
    """Load is samples in flight, not requests: a replica decoding a group of 3 is busier than one
    decoding a single sample, so the next single goes to the second (gates hold all open at token 0)."""
    gate_a, gate_b = threading.Event(), threading.Event()
    a, b = servers(gates={0: gate_a}), servers(gates={0: gate_b})

    async def main():
        sampler = Sampler(FixedReplicas([a.url, b.url]), 1.0, 30.0)
        sent = []

        async def send(n: int):
            sent.append(asyncio.create_task(sampler.sample([1, len(sent)], n, 4)))
            while len(a.bodies) + len(b.bodies) < len(sent):  # it reached a replica
                assert not sent[-1].done(), "the request failed before reaching a replica"
                await asyncio.sleep(0.01)

        try:
            await send(3)  # none in flight: a (3 samples)
            await send(1)  # b (1)
            await send(1)  # a holds 3 samples, b 1: b, though each holds one request
            assert dict(sampler.in_flight) == {a.url: 3, b.url: 2}
            gate_a.set()
            gate_b.set()
            return await asyncio.gather(*sent)
        finally:
            gate_a.set()
            gate_b.set()
            await sampler.aclose()

    results = asyncio.run(main())
    assert [len(r) for r in results] == [3, 1, 1]
    assert [body["token_ids"] for body in a.bodies] == [[1, 0]]
    assert [body["token_ids"] for body in b.bodies] == [[1, 1], [1, 2]]


def test_a_long_request_that_keeps_streaming_never_times_out(servers):
    slow = servers(delay_s=0.05)  # 40 tokens, 2 s in all: 4x the stall bound, 1/10 of it apart
    (samples,) = _run(FixedReplicas([slow.url]), [[1, 2, 3]], n=2, max_tokens=40, stall_timeout_s=0.5)
    assert [len(s.completion_ids) for s in samples] == [40, 40]
    assert all(s.finish_reason == "length" and s.resent == 0 for s in samples)
    assert samples[0].completion_ids == [103 + i for i in range(40)]


@pytest.mark.parametrize("failure", ["die_after", "stall_after"])
def test_a_failed_replica_s_samples_continue_elsewhere_from_their_tokens(servers, failure):
    bad, good = servers(**{failure: 3}), servers()
    (samples,) = _run(FixedReplicas([bad.url, good.url]), [[1, 2]], n=2, max_tokens=8, stall_timeout_s=1.0)
    assert bad.bodies and bad.bodies[0]["sampling_params"]["n"] == 2, (
        "the first request went to the idle replica listed first"
    )
    for s in samples:
        # 3 tokens from the failed replica, then the rest of the 8 from the good one, which was
        # sent the prompt plus those 3 tokens and a budget of 5: nothing sampled twice
        assert s.completion_ids == [102, 103, 104, 105, 106, 107, 108, 109] and len(s.logprobs) == 8
        assert s.resent == 1 and s.replica == good.url and s.finish_reason == "length"
    assert (
        sorted(
            (b["token_ids"], b["sampling_params"]["max_tokens"], b["sampling_params"]["n"])
            for b in good.bodies
        )
        == [([1, 2, 102, 103, 104], 5, 1)] * 2
    )


def test_a_replica_relaunched_by_the_pool_takes_the_rest(servers):
    dying = servers(die_after=2)
    calls: list[list[str]] = []

    class Pool:  # the first call finds the replica, the second finds it relaunched
        def ensure(self):
            calls.append([dying.url] if not calls else [servers().url])
            return calls[-1]

        def version(self, url):
            return 0

    results = _run(Pool(), [[1, i] for i in range(3)], n=2, max_tokens=4)
    assert len(calls) == 2, "one relaunch served every failed request"
    for group in results:
        for s in group:
            assert s.completion_ids[:2] == [102, 103] and len(s.completion_ids) == 4
            assert s.replica == calls[1][0] and s.resent == 1


def test_a_dead_replicas_samples_go_on_elsewhere_at_once_and_it_rejoins_once_relaunched(servers):
    """Two replicas, one dies mid-stream: its samples continue on the other at once, with no call
    to the pool (whose relaunch takes minutes on a GPU and would hold them); once the pool serves
    a new process at its URL, requests go to it again."""
    dying, good = servers(die_after=2), servers()

    class Pool:
        def __init__(self):
            self.ensures, self.ids = 0, {dying.url: 1, good.url: 2}

        def ensure(self):
            self.ensures += 1
            return [dying.url, good.url]

        def version(self, url):
            return 0

        def serving(self):
            return dict(self.ids)

    pool = Pool()

    async def main():
        sampler = Sampler(pool, 1.0, 30.0)
        try:
            first = await sampler.sample([1, 2], 1, 4)  # to `dying` (listed first), then `good`
            dying.die_after, pool.ids[dying.url] = None, 3  # the pool relaunched it
            return first, await sampler.sample([1, 2], 1, 4)
        finally:
            await sampler.aclose()

    (first,), (second,) = asyncio.run(main())
    assert pool.ensures == 1, "the failure did not wait for the pool"
    assert first.completion_ids == [102, 103, 104, 105] and first.replica == good.url and first.resent == 1
    assert second.replica == dying.url and second.resent == 0, "the relaunched replica rejoined"


def test_no_replica_left_is_a_transient_error_after_the_attempts(servers):
    a = servers(die_after=0)
    with pytest.raises(TransientError, match="failed 3 times"):
        _run(FixedReplicas([a.url]), [[1, 2]], n=1)


def test_each_token_is_credited_to_the_weights_its_replica_served(servers):
    """Version 0 until the load (between token 3 and 4), 1 after: a chunk's tokens get the version
    served when the choice's previous chunk arrived, so the one chunk that can straddle the load
    is credited to the old weights, never to newer ones than its own."""
    gate, received = threading.Event(), threading.Event()
    server = servers(gates={4: gate})
    state = {"v": 0, "asked": 0}

    class Pool:
        def ensure(self):
            return [server.url]

        def version(self, url):  # asked when the request is sent and as each chunk arrives
            state["asked"] += 1
            if state["asked"] == 5:  # tokens 0-3 are in; the server waits before token 4
                received.set()
            return state["v"]

    async def main():
        sampler = Sampler(Pool(), 1.0, 30.0)
        try:
            task = asyncio.create_task(sampler.sample([1], 1, 8))
            assert await asyncio.to_thread(received.wait, 10)
            state["v"] = 1  # the pool loaded weights 1 with the request in flight
            gate.set()
            return await task
        finally:
            await sampler.aclose()

    (s,) = asyncio.run(main())
    assert s.versions == [0, 0, 0, 0, 0, 1, 1, 1]


def test_a_replica_too_busy_to_answer_health_is_alive_and_an_error_or_refusal_is_down(servers):
    """On an H100 a vLLM API server streaming ~1,000 requests left /health unanswered for 2 s and
    the pool killed it with 300 requests in flight; only an answer says a replica is down."""
    s = servers()
    assert probe(s.url) is True
    s.health_gate = threading.Event()  # busy: no answer within the probe's timeout
    assert probe(s.url) is None
    s.health_gate.set()
    s.health_status = 500  # vLLM's answer once its engine core died
    assert probe(s.url) is False
    s.stop()
    deadline = time.monotonic() + 10
    while probe(s.url) is not False:  # refused once uvicorn has closed its socket
        assert time.monotonic() < deadline, "the stopped server still answers"
        time.sleep(0.05)
