"""GPU leases: one Prefect global concurrency limit of 1 slot per GPU id (`gpu-<id>`).

A run holds the slots of every GPU it was placed on for its whole life, so two runs started
from the same work pool never share a GPU: the second waits until the first releases them.
Slots are leases that Prefect renews while the holder lives, so a controller that died frees its
GPUs when the lease expires instead of holding them forever.

Who takes a run's lease: `rlfleet rl` on a shared Prefect API, before it starts the run's processes
(`lease_before_start`, runs/early.py); otherwise the flow. Either way through `run_lease`, which
never asks for a GPU its run holds already: a 1-slot limit would wait for itself.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext, suppress

from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate
from prefect.concurrency.sync import concurrency
from prefect.exceptions import ObjectAlreadyExists
from prefect.settings import PREFECT_API_URL

# output_dir -> the GPUs this process holds for that run
_HELD: dict[str, frozenset[str]] = {}


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


@contextmanager
def run_lease(output_dir: str, gpus: list[str], timeout_s: float | None = None) -> Iterator[None]:
    """Hold the GPUs of the run in `output_dir` for the `with`; those this process holds for the
    run already are not asked for again."""
    held = _HELD.get(output_dir, frozenset())
    ask = [g for g in gpus if g not in held]
    if not ask:
        yield
        return
    with gpu_lease(ask, timeout_s):
        _HELD[output_dir] = held | set(ask)
        try:
            yield
        finally:
            if held:
                _HELD[output_dir] = held
            else:
                del _HELD[output_dir]


def shared_api() -> bool:
    """Whether this process talks to a Prefect API that other runs share (PREFECT_API_URL, from the
    environment or the profile). Without one the flow starts a temporary server of its own."""
    return bool(PREFECT_API_URL.value())


def lease_before_start(output_dir: str, gpus: list[str]) -> AbstractContextManager[None]:
    """What `rlfleet rl` holds before it starts a run's processes ahead of the flow: on a shared
    API the run's GPUs (another run may hold them: this waits, as the flow would have); otherwise
    nothing, since only this process's temporary server will hold their slots (the flow leases
    them there)."""
    return run_lease(output_dir, gpus) if gpus and shared_api() else nullcontext()
