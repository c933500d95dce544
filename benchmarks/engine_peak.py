"""vLLM's own peak for a job: one server started as rlfleet's flow starts it, then bursts of C
sequences at once, `ignore_eos`, sent as the sampler sends them (and in other ways, to tell the
serving path's parts apart). long_tail.py's "busy" is a run's tokens/s over this."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

# How the peak's requests are sent. as_sent: as rlfleet's sampler sends a trajectory (vLLM's
# token-in/token-out endpoint, streamed, the sampled token's logprob, no detokenizing); n8: a group
# as one request; generate: the same endpoint answered whole; completions*: the OpenAI completions
# endpoint the sampler used before 82e88c1, whole or streamed (the sampler's way then), with or
# without the logprob. The server's detokenizer and per-token logprob objects, not the engine, were
# the ceiling on an H100 (docs/benchmarks/long-generations.md, the serving path): these tell its parts apart.
PEAK_VARIANTS = {
    "as_sent": {"n": 1, "logprobs": True, "stream": True, "endpoint": "generate"},
    "n8": {"n": 8, "logprobs": True, "stream": True, "endpoint": "generate"},
    "generate": {"n": 1, "logprobs": True, "endpoint": "generate"},
    "completions": {"n": 1, "logprobs": True, "endpoint": "completions"},
    "completions_stream": {"n": 1, "logprobs": True, "stream": True, "endpoint": "completions"},
    "completions_no_logprobs": {"n": 1, "logprobs": False, "endpoint": "completions"},
}


async def _burst(
    url: str,
    c: int,
    max_tokens: int,
    seed_ids: list[int],
    n: int = 1,
    logprobs: bool = True,
    stream: bool = False,
    endpoint: str = "completions",
) -> int:
    """C sequences at once (C/n requests of n), `ignore_eos`; the tokens they generated."""
    import httpx

    from rlfleet.inference.server import SERVED_NAME
    from rlfleet.orchestrator.sampler import GENERATE, generate_body

    if endpoint == "generate":  # the sampler's own request (all these variants ask for the logprob)
        path, body = GENERATE, generate_body(seed_ids, n, max_tokens, stream=stream, ignore_eos=True)
    else:
        path = "v1/completions"
        params = {"max_tokens": max_tokens, "temperature": 1.0, "n": n, "ignore_eos": True}
        body = {"model": SERVED_NAME, "prompt": seed_ids, "return_token_ids": True, "stream": stream} | params
        if logprobs:
            body |= {"logprobs": 0, "return_tokens_as_token_ids": True}

    async def one(client: httpx.AsyncClient) -> int:
        if not stream:
            resp = (await client.post(f"{url}/{path}", json=body)).raise_for_status()
            return sum(len(ch["token_ids"]) for ch in resp.json()["choices"])
        tokens = 0
        async with client.stream("POST", f"{url}/{path}", json=body) as resp:
            async for line in resp.raise_for_status().aiter_lines():
                if line.startswith("data: {"):
                    tokens += sum(len(ch.get("token_ids") or []) for ch in json.loads(line[6:])["choices"])
        return tokens

    # clients of 32 requests, as the sampler spreads its streams (orchestrator/sampler.py)
    clients = [
        httpx.AsyncClient(timeout=3600, limits=httpx.Limits(max_connections=None))
        for _ in range(-(-c // n // 32))
    ]
    try:
        return sum(await asyncio.gather(*(one(clients[i // 32]) for i in range(c // n))))
    finally:
        for client in clients:
            await client.aclose()


def engine_peak(
    cfg: Any,
    concurrency: list[int],
    max_tokens: int,
    variants: list[str],
    reps: int = 2,
) -> dict[str, Any]:
    """One vLLM server started as rlfleet's flow starts it (placement, launch_replicas), then, for
    each C, C sequences at once (a few prompt ids, `ignore_eos`, max_tokens each, sent as the
    sampler sends them): generated tokens over the wall time of the burst, the best of `reps`
    bursts after one warm-up burst. Each other variant (PEAK_VARIANTS) runs at the first C only."""
    from rlfleet.config.gpu_defaults import gpu_defaults
    from rlfleet.config.placement import assign_gpus
    from rlfleet.inference.server import launch_replicas, stop_replicas

    inf, train = assign_gpus(cfg.deployment)
    cfg, _ = gpu_defaults(cfg, inf, train)
    t0 = time.perf_counter()
    replicas = launch_replicas(cfg.inference_job(inf))
    out: dict[str, Any] = {
        "start_s": time.perf_counter() - t0,
        "max_tokens": max_tokens,
        "by_concurrency": {},
    }
    runs = [("as_sent", c) for c in concurrency] + [(v, concurrency[0]) for v in variants if v != "as_sent"]
    try:
        url, seed_ids = replicas[0].url, [1, 70, 71, 72]  # BOS + "abc" in the tiny tokenizer
        warm = PEAK_VARIANTS["as_sent"]
        asyncio.run(
            _burst(url, concurrency[0], max_tokens, seed_ids, **warm)
        )  # a fresh server's first bursts are slow
        for variant, c in runs:
            tries = []
            for _ in range(reps):
                t = time.perf_counter()
                tokens = asyncio.run(_burst(url, c, max_tokens, seed_ids, **PEAK_VARIANTS[variant]))
                tries.append(tokens / (time.perf_counter() - t))
            key = str(c) if variant == "as_sent" else f"{c}_{variant}"
            out["by_concurrency"][key] = {"tokens": tokens, "tokens_per_s": max(tries), "tries": tries}
            print(f"engine peak C={c} {variant}: {max(tries):.0f} tokens/s (best of {tries})", flush=True)
    finally:
        stop_replicas(replicas)
    return out
