"""Talk to running vLLM servers: in-place weight reload and a logprob probe."""

from __future__ import annotations

import time

import httpx

from rlfleet.net import tls


class WeightUpdateError(RuntimeError):
    pass


def reload_weights(url: str, weights_path: str, timeout_s: float = 300.0) -> dict[str, float]:
    """Pause -> reload -> resume: load `weights_path` (an HF safetensors dir, already fully
    published and verified by the caller) into the running server and drop its prefix cache, whose
    KV entries were computed with the old weights. Returns the seconds of each call.

    `/pause?mode=wait` lets requests in flight finish on the old weights (they were recorded with
    the old version) and holds new ones until `/resume`, so no sample mixes two weight versions.
    The stall is the reload alone: fetching and verifying happen before the pause."""
    times: dict[str, float] = {}
    with httpx.Client(timeout=timeout_s, verify=tls()) as client:
        _post(client, f"{url}/pause", times, "pause", params={"mode": "wait"})
        try:
            _post(
                client,
                f"{url}/collective_rpc",
                times,
                "reload",
                json={"method": "reload_weights", "kwargs": {"weights_path": weights_path}},
            )
            _post(client, f"{url}/reset_prefix_cache", times, "reset_prefix_cache")
        finally:
            _post(client, f"{url}/resume", times, "resume")
    return times


def _post(client: httpx.Client, url: str, times: dict[str, float], name: str, **kwargs) -> None:
    t0 = time.perf_counter()
    resp = client.post(url, **kwargs)
    times[name] = time.perf_counter() - t0
    if resp.status_code != 200:
        raise WeightUpdateError(f"{url} failed: HTTP {resp.status_code}: {resp.text[:500]}")


def prompt_logprobs(url: str, prompt_ids: list[int], timeout_s: float = 60.0) -> list[float]:
    """The server's logprob of each prompt token after the first: a fingerprint of its weights."""
    resp = httpx.post(
        f"{url}/v1/completions",
        json={
            "model": "policy",
            "prompt": prompt_ids,
            "max_tokens": 1,
            "temperature": 0.0,
            "prompt_logprobs": 0,
        },
        timeout=timeout_s,
        verify=tls(),
    )
    resp.raise_for_status()
    entries = resp.json()["choices"][0]["prompt_logprobs"][1:]
    return [entry[str(tok)]["logprob"] for entry, tok in zip(entries, prompt_ids[1:], strict=True)]
