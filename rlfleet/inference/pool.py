"""The inference pool of a run: its replicas, the weight version they hold, and self-healing.

One pool per output_dir lives in the controlling process across tasks (`get_pool`), so the
`rollout` task can ask it for healthy URLs and a replica that died is relaunched directly from
the newest published weights.
"""

from __future__ import annotations

import time
from typing import Any

from rlfleet.config.models import InferenceJobConfig
from rlfleet.errors import TransientError
from rlfleet.inference.client import reload_weights
from rlfleet.inference.server import Replica, healthy, launch_replicas, stop_replicas
from rlfleet.procs import wait_until


class InferencePool:
    def __init__(self, cfg: InferenceJobConfig):
        self.cfg = cfg
        self.replicas: list[Replica] = []
        self.policy_step = -1  # weight version the servers hold; -1 = the initial model
        self.weights_path: str | None = None
        self.external_ready = False  # external replicas (inference.urls) were healthy once

    @property
    def urls(self) -> list[str]:
        if self.cfg.inference.urls:
            return list(self.cfg.inference.urls)
        return [r.url for r in self.replicas]

    def ensure(self) -> list[str]:
        """Launch missing or dead replicas (with the current weights) and return all URLs.

        External replicas (`inference.urls`, started by a SLURM job on its inference nodes) are
        only waited for: the first time until they are healthy, later a dead one is an error.
        """
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
        for url in self.ensure():
            reload_weights(url, weights_path)
        self.policy_step, self.weights_path = step, weights_path
        return {
            "step": step,
            "weights_path": weights_path,
            "replicas": self.urls,
            "seconds": time.perf_counter() - start,
        }

    def _external(self) -> list[str]:
        if not self.external_ready:
            for url in self.urls:
                wait_until(
                    lambda url=url: healthy(url), self.cfg.inference.startup_timeout_s, what=f"vLLM at {url}"
                )
            self.external_ready = True
        dead = [u for u in self.urls if not healthy(u)]
        if dead:
            raise TransientError(f"external vLLM replicas not healthy: {dead}")
        return self.urls

    def shutdown(self) -> None:
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
