"""The controller's side of the seam: hand a ticket to one running vLLM replica over HTTP."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import httpx

from rlfleet.net import tls


class WeightUpdateError(RuntimeError):
    pass


def load(
    url: str,
    ticket: dict[str, Any],
    rank_base: int = 1,
    timeout_s: float = 300.0,
    in_flight_kv: str = "recompute",
    loaded: Callable[[], None] | None = None,
) -> dict[str, Any]:
    """Pause -> load the ticket's weights -> resume; seconds of each call.

    `/pause?mode=keep` freezes the requests in flight where they are (they are not drained and
    not aborted) and holds new ones until `/resume`. `in_flight_kv`: `recompute` drops the KV and
    prefix caches (vLLM preempts the frozen requests, which recompute their KV with the new
    weights when they resume); `keep` reuses the old weights' KV. `loaded()` runs between the load
    and `/resume`: from then on every token this replica samples is the new version's. Every
    ticket is loaded by rlfleet's worker extension (`vllm_worker.WeightSync.rlfleet_load`),
    `rank_base` being this replica's first rank in an nccl group."""
    rpc = load_rpc(ticket, rank_base)
    times: dict[str, Any] = {}
    pause = {"mode": "keep", "clear_cache": str(in_flight_kv == "recompute").lower()}
    with httpx.Client(timeout=timeout_s, verify=tls()) as client:
        _post(client, f"{url}/pause", times, "pause", params=pause)
        try:
            resp = _post(client, f"{url}/collective_rpc", times, "load", json=rpc)
            if loaded is not None:
                loaded()
        finally:
            _post(client, f"{url}/resume", times, "resume")
    times["workers"] = resp.json()["results"]  # per worker: transfer vs load_weights
    return times


def load_rpc(ticket: dict[str, Any], rank_base: int = 1) -> dict[str, Any]:
    """The `collective_rpc` body that loads `ticket` on every worker of a replica."""
    return {"method": "rlfleet_load", "args": [json.dumps(ticket), str(rank_base)]}


def _post(client: httpx.Client, url: str, times: dict[str, Any], name: str, **kwargs) -> httpx.Response:
    t0 = time.perf_counter()
    resp = client.post(url, **kwargs)
    times[name] = time.perf_counter() - t0
    if resp.status_code != 200:
        raise WeightUpdateError(f"{url} failed: HTTP {resp.status_code}: {resp.text[:500]}")
    return resp
