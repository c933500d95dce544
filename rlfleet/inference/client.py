"""A logprob probe of a running vLLM server (weight updates: rlfleet/weights/client.py)."""

from __future__ import annotations

import httpx

from rlfleet.net import tls


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
