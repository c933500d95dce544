"""Where a run resumes, and the work of a dead life past its last checkpoint that it cannot reuse.
The RL flow asks it before it starts anything; the SFT trainer, which resumes by itself, too.

One rule, with or without a checkpoint: a rerun starts one step past the latest complete checkpoint
(step 0 without one) and rebuilds the state that step begins from. A resume at step 0 is still a
resume: a dead life's records of steps it trained from the base model go as those past a
checkpoint do (its pruned weights left nothing to serve them from).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rlfleet.store import RunStore, layout
from rlfleet.trainer.files import latest_checkpoint

# what a resume keeps of step `start` itself: sampled from the weights it resumes from
_KEPT_AT_START = (layout.ROLLOUTS, layout.BATCHES)


@dataclass(frozen=True)
class Resume:
    """Where a rerun starts and what it did with the dead life's work (`store` paths)."""

    start: int
    checkpoint: int | None  # the step of the checkpoint it resumes from; None: the base model
    discarded: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)

    def describe(self) -> str:
        origin = "the base model" if self.checkpoint is None else f"checkpoint {self.checkpoint}"
        return (
            f"resuming at step {self.start} from {origin}; discarded "
            f"{_listed(self.discarded) or 'nothing'}; kept {_listed(self.kept) or 'nothing'}"
        )


def resume_step(store: RunStore) -> int:
    """First step to run: one past the latest complete checkpoint, or 0."""
    ckpt = latest_checkpoint(store)
    return 0 if ckpt is None else ckpt["step"] + 1


def resume(store: RunStore) -> Resume | None:
    """Rebuild the state of the step a rerun starts at; None for a fresh output_dir (nothing to
    resume: `pristine`)."""
    if pristine(store):
        return None
    start = resume_step(store)
    kept = [layout.step_dir(kind, start) for kind in _KEPT_AT_START if start in store.complete_steps(kind)]
    return Resume(start, start - 1 if start else None, discard_stale(store, start), kept)


def discard_stale(store: RunStore, start: int) -> list[str]:
    """Remove work a previous life did past its last checkpoint that a resumed run cannot reuse
    (an RL or an SFT run: SFT has weights and metrics only).

    Weights, metrics, step records, weight tickets and evals for steps >= start are redone by the
    resumed run, and a write a dead process left half done (a staging dir) goes. Rollouts and batches for `start` were sampled from the weights it resumes from and
    stay; later ones came from weights that are about to be recomputed, so they go.
    """
    removed = []
    for kind, first in ((layout.WEIGHTS, start), (layout.ROLLOUTS, start + 1), (layout.BATCHES, start + 1)):
        for s in store.complete_steps(kind):
            if s >= first:
                store.remove(layout.step_dir(kind, s))
                removed.append(layout.step_dir(kind, s))
    for kind in (layout.WEIGHTS, layout.CHECKPOINTS):  # writes a dead process left half done
        for rel in store.staged(kind):
            store.remove(rel)
            removed.append(rel)
    for kind in (*layout.STEP_RECORDS, layout.EVALS):  # sync/: a dead trainer's weight tickets
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


def _listed(paths: list[str], most: int = 6) -> str:
    """`paths` for a log line: the first few, then how many more."""
    more = f" and {len(paths) - most} more" if len(paths) > most else ""
    return ", ".join(paths[:most]) + more
