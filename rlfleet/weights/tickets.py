"""What step N's weights are, per transport, and which step the replicas hold.

A ticket is a small JSON dict: `{"transport", "step", ...}`. The filesystem's names a local
directory (`filesystem.newest_weights`); the others are written by the trainer to `sync/step_N.json`
before it reports step N done, and say where vLLM finds the tensors. `run/weights_served.json` is
the controller's acknowledgement (the step every replica holds): the cuda_ipc publisher waits on it
before it overwrites a buffer a replica might still need.
"""

from __future__ import annotations

import time
from typing import Any

from rlfleet.store import RunStore

SERVED = "run/weights_served.json"


def ticket_rel(step: int) -> str:
    return f"sync/step_{step}.json"


def ticket(store: RunStore, step: int, transport: str) -> dict[str, Any]:
    """The ticket for `step` (filesystem: the newest verified weights at or before it)."""
    if transport == "filesystem":
        from rlfleet.weights.filesystem import newest_weights

        s, path = newest_weights(store, step, checksum=False)
        return {"transport": "filesystem", "step": s, "path": path}
    rel = ticket_rel(step)
    if not store.exists(rel):
        raise FileNotFoundError(f"no {transport} weights ticket for step {step} ({store.uri(rel)})")
    return store.read_json(rel)


def write_served(store: RunStore, step: int) -> None:
    store.write_json(SERVED, {"step": step, "at": time.time()})


def served_step(store: RunStore) -> int | None:
    return store.read_json(SERVED)["step"] if store.exists(SERVED) else None


def wait_served(store: RunStore, step: int, timeout_s: float, poll_s: float = 0.01) -> None:
    """Block until the replicas hold `step` or newer."""
    deadline = time.monotonic() + timeout_s
    while (held := served_step(store)) is None or held < step:
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"vLLM still holds weights {held} after {timeout_s:.0f} s; step {step} was expected "
                "(weights.timeout_s)"
            )
        time.sleep(poll_s)
