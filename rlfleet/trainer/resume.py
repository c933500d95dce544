"""Where a run resumes, and the work of a dead life past its last checkpoint that it cannot reuse.
The RL flow asks it before it starts anything; the SFT trainer, which resumes by itself, too."""

from __future__ import annotations

from rlfleet.store import RunStore, layout
from rlfleet.trainer.files import latest_checkpoint


def resume_step(store: RunStore) -> int:
    """First step to run: one past the latest complete checkpoint, or 0."""
    ckpt = latest_checkpoint(store)
    return 0 if ckpt is None else ckpt["step"] + 1


def discard_stale(store: RunStore, start: int) -> list[str]:
    """Remove work a previous life did past its last checkpoint that a resumed run cannot reuse
    (an RL or an SFT run: SFT has weights and metrics only).

    Weights and metrics for steps >= start are redone by the resumed trainer. Rollouts and batches
    for `start` were sampled from the checkpointed weights and stay; later ones came from weights
    that are about to be recomputed, so they go.
    """
    removed = []
    for kind, first in ((layout.WEIGHTS, start), (layout.ROLLOUTS, start + 1), (layout.BATCHES, start + 1)):
        for s in store.complete_steps(kind):
            if s >= first:
                store.remove(layout.step_dir(kind, s))
                removed.append(layout.step_dir(kind, s))
    for kind in layout.STEP_RECORDS:  # sync/: a dead trainer's weight tickets
        for s in store.json_steps(kind):
            if s >= start:
                store.fs.rm(store.path(layout.step_json(kind, s)))
                removed.append(layout.step_json(kind, s))
    return removed


def pristine(store: RunStore) -> bool:
    """No work of any step yet (a fresh output_dir): nothing for `discard_stale` to remove, and no
    batch a trainer started now could train before the flow runs."""
    return (
        latest_checkpoint(store) is None
        and not any(store.complete_steps(kind) for kind in (layout.WEIGHTS, layout.ROLLOUTS, layout.BATCHES))
        and not any(store.json_steps(kind) for kind in layout.STEP_RECORDS)
    )
