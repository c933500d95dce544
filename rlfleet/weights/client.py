"""The controller's side of the seam: hand a ticket to one running vLLM replica over HTTP."""

from __future__ import annotations

import json
import time
from typing import Any

import httpx

from rlfleet.net import tls


class WeightUpdateError(RuntimeError):
    pass


def load(url: str, ticket: dict[str, Any], rank_base: int = 1, timeout_s: float = 300.0) -> dict[str, Any]:
    """Pause -> load the ticket's weights -> resume; seconds of each call.

    `/pause?mode=wait` lets requests in flight finish on the old weights (they were recorded with
    the old version), then drops the KV and prefix caches (vLLM's `clear_cache`, on by default in
    0.26 and 0.32), and holds new requests until `/resume`: no sample mixes two weight versions and
    no cached KV entry outlives the weights that computed it. A filesystem
    ticket is loaded by vLLM's own `reload_weights`; the others by rlfleet's worker extension
    (`vllm_worker.WeightSync.rlfleet_load`), `rank_base` being this replica's first rank in an
    nccl group."""
    if ticket["transport"] == "filesystem":
        rpc = {"method": "reload_weights", "kwargs": {"weights_path": ticket["path"]}}
    else:
        rpc = {"method": "rlfleet_load", "args": [json.dumps(ticket), str(rank_base)]}
    times: dict[str, Any] = {}
    with httpx.Client(timeout=timeout_s, verify=tls()) as client:
        _post(client, f"{url}/pause", times, "pause", params={"mode": "wait"})
        try:
            resp = _post(client, f"{url}/collective_rpc", times, "load", json=rpc)
        finally:
            _post(client, f"{url}/resume", times, "resume")
    if rpc["method"] == "rlfleet_load":  # per worker: transfer vs load_weights
        times["workers"] = resp.json()["results"]
    return times


def _post(client: httpx.Client, url: str, times: dict[str, Any], name: str, **kwargs) -> httpx.Response:
    t0 = time.perf_counter()
    resp = client.post(url, **kwargs)
    times[name] = time.perf_counter() - t0
    if resp.status_code != 200:
        raise WeightUpdateError(f"{url} failed: HTTP {resp.status_code}: {resp.text[:500]}")
    return resp
