"""GPU leases: one Prefect global concurrency limit of 1 slot per GPU id (`gpu-<id>`).

A run holds the slots of every GPU it was placed on for its whole life, so two runs started
from the same work pool never share a GPU: the second waits until the first releases them.
Slots are leases that Prefect renews while the holder lives, so a controller that died frees its
GPUs when the lease expires instead of holding them forever.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager, suppress

from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate
from prefect.concurrency.sync import concurrency
from prefect.exceptions import ObjectAlreadyExists


def gpu_limit_name(gpu: str) -> str:
    return f"gpu-{gpu}"


def ensure_gpu_limits(gpus: list[str]) -> list[str]:
    """Create the per-GPU limits that do not exist yet; returns their names."""
    names = [gpu_limit_name(g) for g in gpus]
    with get_client(sync_client=True) as client:
        for name in names:
            with suppress(ObjectAlreadyExists):
                client.create_global_concurrency_limit(GlobalConcurrencyLimitCreate(name=name, limit=1))
    return names


@contextmanager
def gpu_lease(gpus: list[str], timeout_s: float | None = None) -> Iterator[None]:
    """Hold every GPU in `gpus` (none on a CPU run). Limits that were never created do not block."""
    if not gpus:
        yield
        return
    with concurrency(sorted({gpu_limit_name(g) for g in gpus}), occupy=1, timeout_seconds=timeout_s):
        yield
