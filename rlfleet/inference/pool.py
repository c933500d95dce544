"""The inference pool of a run: its replicas, the weight version they hold, and self-healing.

One pool per output_dir lives in the controlling process across tasks (`get_pool`), so the
`rollout` task can ask it for healthy URLs and a replica that died is relaunched directly from
the newest published weights.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from rlfleet.config.models import InferenceJobConfig
from rlfleet.errors import DeterministicError, TransientError
from rlfleet.inference.client import reload_weights
from rlfleet.inference.server import Replica, healthy, launch_replicas, stop_replicas
from rlfleet.procs import wait_until

log = logging.getLogger("rlfleet.inference")


class InferencePool:
    def __init__(self, cfg: InferenceJobConfig):
        self.cfg = cfg
        self.replicas: list[Replica] = []
        self.policy_step = -1  # weight version the servers hold; -1 = the initial model
        self.weights_path: str | None = None
        self.closed = False  # after shutdown nothing relaunches (a rollout still in flight must not)
        self.external_ready = False  # external replicas (inference.urls) were healthy once
        self.dropped: set[str] = set()  # external replicas that stopped answering

    @property
    def urls(self) -> list[str]:
        if self.cfg.inference.urls:
            return list(self.cfg.inference.urls)
        return [r.url for r in self.replicas]

    def ensure(self) -> list[str]:
        """Launch missing or dead replicas (with the current weights) and return all URLs.

        External replicas (`inference.urls`, started by a SLURM job on its inference nodes) are
        only waited for, the first time until all are healthy. One that stops answering later is
        dropped for good (it could come back holding old weights) and the rollout goes on with
        the others; none left is a transient error.
        """
        if self.closed:
            raise DeterministicError("the inference pool was shut down")
        if self.cfg.inference.urls:
            return self._external()
        dead = [r for r in self.replicas if not (r.process.alive() and healthy(r.url))]
        if self.replicas and not dead:
            return self.urls
        stop_replicas(self.replicas)
        self.replicas = launch_replicas(self.cfg, self.weights_path)
        return self.urls

    def broadcast(self, step: int, weights_path: str) -> dict[str, Any]:
        """Reload `weights_path` in place on every replica; returns a small manifest."""
        start = time.perf_counter()
        calls = [reload_weights(url, weights_path) for url in self.ensure()]
        self.policy_step, self.weights_path = step, weights_path
        return {
            "step": step,
            "weights_path": weights_path,
            "replicas": self.urls,
            "seconds": time.perf_counter() - start,
            "calls": calls,
        }

    def _external(self) -> list[str]:
        if not self.external_ready:
            for url in self.urls:
                wait_until(
                    lambda url=url: healthy(url), self.cfg.inference.startup_timeout_s, what=f"vLLM at {url}"
                )
            self.external_ready = True
        for url in self.urls:
            if url not in self.dropped and not healthy(url):
                log.warning("external vLLM replica %s stopped answering; dropped from the pool", url)
                self.dropped.add(url)
        live = [u for u in self.urls if u not in self.dropped]
        if not live:
            raise TransientError(f"no external vLLM replica is healthy: {self.urls}")
        return live

    def shutdown(self) -> None:
        self.closed = True
        stop_replicas(self.replicas)
        self.replicas = []


_POOLS: dict[str, InferencePool] = {}


def get_pool(cfg: InferenceJobConfig) -> InferencePool:
    pool = _POOLS.get(cfg.output_dir)
    if pool is None or pool.cfg != cfg:
        if pool is not None:
            pool.shutdown()
        pool = _POOLS[cfg.output_dir] = InferencePool(cfg)
    return pool


def shutdown_pool(output_dir: str) -> None:
    pool = _POOLS.pop(output_dir, None)
    if pool is not None:
        pool.shutdown()
