"""Talk to running vLLM servers: in-place weight reload and a logprob probe."""

from __future__ import annotations

import httpx


class WeightUpdateError(RuntimeError):
    pass


def reload_weights(url: str, weights_path: str, timeout_s: float = 300.0) -> None:
    """Load `weights_path` (an HF safetensors dir) into the running server and drop its prefix cache,
    whose KV entries were computed with the old weights."""
    with httpx.Client(timeout=timeout_s) as client:
        resp = client.post(
            f"{url}/collective_rpc",
            json={"method": "reload_weights", "kwargs": {"weights_path": weights_path}},
        )
        if resp.status_code != 200:
            raise WeightUpdateError(
                f"{url}: reload_weights failed: HTTP {resp.status_code}: {resp.text[:500]}"
            )
        resp = client.post(f"{url}/reset_prefix_cache")
        if resp.status_code != 200:
            raise WeightUpdateError(f"{url}: reset_prefix_cache failed: HTTP {resp.status_code}")


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
    )
    resp.raise_for_status()
    entries = resp.json()["choices"][0]["prompt_logprobs"][1:]
    return [entry[str(tok)]["logprob"] for entry, tok in zip(entries, prompt_ids[1:], strict=True)]
