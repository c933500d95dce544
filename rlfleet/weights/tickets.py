"""What both sides of the seam share: where tickets are, and which step the replicas hold.

A ticket is a small JSON dict: `{"transport", "step", ...}`. The filesystem's names a local
directory (`newest_weights`: also what a resumed run and a relaunched replica start from, any
transport); the others are written by the trainer to `sync/step_N.json` before it reports step N
done, and say where vLLM finds the tensors. `run/weights_served.json` is the controller's
acknowledgement (the step every replica holds): the cuda_ipc publisher waits on it before it
overwrites a buffer a replica might still need. The controller's rules per transport, nccl's
handshakes included, are `controller.py`. Import-light: the flow imports this module, not torch.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from rlfleet.procs import running, wait_until
from rlfleet.store import CorruptArtifact, RunStore, layout, stage

log = logging.getLogger("rlfleet.weights")

SERVED = layout.WEIGHTS_SERVED
REGROUP = layout.REGROUP  # the controller's request for a new nccl group: {"id", "by": the asking process}
REGROUPED = layout.REGROUPED  # the trainer's answer: a ticket whose group id is the request's


def ticket_rel(step: int) -> str:
    return layout.step_json(layout.SYNC, step)


def trainer_ticket(store: RunStore, step: int, transport: str) -> dict[str, Any]:
    """The ticket the trainer wrote for `step`: a transport that sends tensors, not files
    (cuda_ipc, nccl), writes one per step. `transport` names it in the error."""
    rel = ticket_rel(step)
    if not store.exists(rel):
        raise FileNotFoundError(f"no {transport} weights ticket for step {step} ({store.uri(rel)})")
    return store.read_json(rel)


def write_served(store: RunStore, step: int) -> None:
    store.write_json(SERVED, {"step": step, "at": time.time()})


def forget_served(store: RunStore) -> None:
    """A new controller's start: the replicas of any earlier one died with it (their guards'
    PDEATHSIG), so no replica holds what its acknowledgement names. Else a resumed nccl trainer
    would skip the send its new replicas wait for."""
    if store.exists(SERVED):
        store.fs.rm(store.path(SERVED))


def served_step(store: RunStore) -> int | None:
    return store.read_json(SERVED)["step"] if store.exists(SERVED) else None


def wait_served(store: RunStore, step: int, timeout_s: float, poll_s: float = 0.01) -> None:
    """Block until the replicas hold `step` or newer."""

    def held() -> bool:
        return (served := served_step(store)) is not None and served >= step

    wait_until(
        held,
        timeout_s,
        poll_s,
        on_timeout=lambda: TimeoutError(
            f"vLLM still holds weights {served_step(store)} after {timeout_s:.0f} s; step {step} was "
            "expected (weights.timeout_s)"
        ),
    )


def sender_running(ticket: dict[str, Any]) -> bool:
    g = ticket["group"]
    return running(g["pid"], g["started"])


WEIGHTS_CACHED = 2  # staged snapshots a node keeps: the one served and the one replacing it


def newest_weights(store: RunStore, step: int, checksum: bool = True) -> tuple[int, str]:
    """(step, local path) of verified weights for `step`, else of the newest verified ones before it.

    Weights come from `weights/step_N` or a checkpoint's `model/`; a missing, truncated or corrupt
    snapshot is skipped with a warning naming it, so vLLM never loads a half-written file. From a
    remote store they are staged to this node's local cache first (checked against the manifest).
    checksum=False checks a local snapshot's manifest and file sizes only: the broadcast's hot path,
    reading what this run's trainer published (and hashed) moments ago. A resume re-hashes it all.
    """
    candidates = sorted(
        {s for kind in (layout.WEIGHTS, layout.CHECKPOINTS) for s in store.complete_steps(kind) if s <= step},
        reverse=True,
    )
    for s in candidates:
        for rel, sub in (
            (layout.step_dir(layout.WEIGHTS, s), ""),
            (layout.step_dir(layout.CHECKPOINTS, s), layout.CHECKPOINT_MODEL),
        ):
            try:
                local = stage(store, rel, keep=WEIGHTS_CACHED, checksum=checksum)
            except FileNotFoundError:
                continue
            except CorruptArtifact as e:
                log.warning("weights in %s are corrupt (%s); trying an older snapshot", rel, e)
                continue
            if s != step:
                log.warning("no complete weights for step %d; using step %d's", step, s)
            return s, str(local / sub) if sub else str(local)
    raise FileNotFoundError(f"no complete weights for step <= {step} in {store.url}")
