"""What step N's weights are, per transport, and which step the replicas hold.

A ticket is a small JSON dict: `{"transport", "step", ...}`. The filesystem's names a local
directory (`newest_weights`: also the fallback every transport shares, for a resumed run and a
relaunched replica); the others are written by the trainer to `sync/step_N.json`
before it reports step N done, and say where vLLM finds the tensors. `run/weights_served.json` is
the controller's acknowledgement (the step every replica holds): the cuda_ipc publisher waits on it
before it overwrites a buffer a replica might still need. The controller's side of nccl's
handshakes lives here too (`live_ticket`, `regroup`): the flow imports this module, not torch.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from typing import Any

from rlfleet.procs import running, this_process
from rlfleet.store import CorruptArtifact, RunStore, stage, step_dir

log = logging.getLogger("rlfleet.weights")

SERVED = "run/weights_served.json"
REGROUP = (
    "sync/regroup.json"  # the controller's request for a new nccl group: {"id", "by": the asking process}
)
REGROUPED = "sync/regrouped.json"  # the trainer's answer: a ticket whose group id is the request's


def ticket_rel(step: int) -> str:
    return f"sync/step_{step}.json"


def ticket(store: RunStore, step: int, transport: str) -> dict[str, Any]:
    """The ticket for `step` (filesystem: the newest verified weights at or before it)."""
    if transport == "filesystem":
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


def sender_running(ticket: dict[str, Any]) -> bool:
    g = ticket["group"]
    return running(g["pid"], g["started"])


def live_ticket(
    store: RunStore, step: int, failure: Callable[[], Exception | None], timeout_s: float, poll_s: float = 0.2
) -> dict[str, Any]:
    """Step N's ticket, once its sender runs: a relaunched trainer replays up to step N and writes
    it again. `failure()` names a trainer that died meanwhile (raised)."""
    deadline = time.monotonic() + timeout_s
    while not sender_running(t := ticket(store, step, "nccl")):
        if (error := failure()) is not None:
            raise error
        if time.monotonic() > deadline:
            raise TimeoutError(f"no running trainer wrote the step {step} nccl ticket in {timeout_s:.0f} s")
        time.sleep(poll_s)
    return t


def regroup(store: RunStore, timeout_s: float, poll_s: float = 0.05) -> dict[str, Any]:
    """The controller's side: ask the trainer for a new group and return its answer, a ticket of
    the newest weights to load on every replica. Raises TimeoutError if no running trainer answers
    in `timeout_s` (a dead one is relaunched by the next task; the request stays and is answered then)."""
    request_id = f"regroup-{os.getpid()}-{time.time_ns()}"
    store.write_json(REGROUP, {"id": request_id, "by": this_process()})
    deadline = time.monotonic() + timeout_s
    while True:
        if store.exists(REGROUPED):
            answer = store.read_json(REGROUPED)
            if answer["group"]["id"] == request_id and sender_running(answer):
                return answer
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"no running trainer answered the weight-sync regroup request in {timeout_s:.0f} s"
            )
        time.sleep(poll_s)


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
        {s for kind in ("weights", "checkpoints") for s in store.complete_steps(kind) if s <= step},
        reverse=True,
    )
    for s in candidates:
        for rel, sub in ((step_dir("weights", s), ""), (step_dir("checkpoints", s), "model")):
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
