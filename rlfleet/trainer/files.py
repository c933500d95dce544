"""What the trainer and the controller say to each other through the run store, without torch:
the controller imports these (the flow's start-up must not wait ~6 s for torch and transformers).

Checkpoints: which one a resume uses, where its HF model is, and which old step dirs retention
removes. Steps: when a checkpoint is due, how often to poll, and the error a dying trainer leaves
for the controller.
"""

from __future__ import annotations

import logging
from typing import Any

from rlfleet.store import CorruptArtifact, RunStore, layout
from rlfleet.store import stage as stage_locally
from rlfleet.store.records import CheckpointManifest

log = logging.getLogger("rlfleet.trainer")


def is_checkpoint_step(step: int, interval: int, max_steps: int) -> bool:
    return (step + 1) % interval == 0 or step == max_steps - 1


def poll_interval(store: RunStore, poll_s: float) -> float:
    """A local stat is cheap, so poll often (every poll is latency added to the step); an object
    store answers each poll with a request, so at most 20 a second there."""
    return poll_s if store.is_local else max(poll_s, 0.05)


def read_trainer_error(store: RunStore) -> dict[str, Any] | None:
    return store.read_json(layout.TRAINER_ERROR) if store.exists(layout.TRAINER_ERROR) else None


def latest_checkpoint(store: RunStore) -> CheckpointManifest | None:
    """The manifest of the newest checkpoint whose files all verify, or None."""
    for step in reversed(store.complete_steps(layout.CHECKPOINTS)):
        try:
            manifest = store.manifest(layout.step_dir(layout.CHECKPOINTS, step), verify=True)
        except CorruptArtifact as e:
            log.warning("checkpoint step %d is corrupt (%s); falling back to the previous one", step, e)
            continue
        if manifest is not None:
            return manifest
    return None


def checkpoint_model_path(store: RunStore, step: int) -> str:
    """A path `from_pretrained` can read; a remote checkpoint is staged (verified) to the local cache."""
    rel = layout.step_dir(layout.CHECKPOINTS, step)
    if store.is_local:
        return str(store.local_path(rel, layout.CHECKPOINT_MODEL))
    return str(stage_locally(store, rel, keep=1) / layout.CHECKPOINT_MODEL)


def prune_steps(
    store: RunStore, kind: str, keep: int, protect: int | None = None, held: int | None = None
) -> list[int]:
    """Remove complete `kind` steps older than the newest `keep` (0 = none), except `protect` and
    any at or past `held` (a step replicas serve or are loading), plus leftovers of cut uploads (no
    manifest) older than the oldest kept: the trainer never writes those again."""
    steps = store.complete_steps(kind)
    kept = steps[-keep:] if keep > 0 else steps
    if not kept:
        return []
    gone = [s for s in steps if s not in kept and s != protect and (held is None or s < held)]
    gone += [s for s in store.step_dirs(kind) if s < kept[0] and s not in steps]
    for s in gone:
        store.remove(layout.step_dir(kind, s))
    return sorted(gone)
