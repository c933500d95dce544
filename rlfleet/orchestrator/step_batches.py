"""Step N's training data in one call, `step_batches`: the step's rollout, then its advantages,
staleness check and micro-batches, published as `batches/step_N`. The rollout task
(tasks/rl.py) only calls it and reports.

The rollout comes from the stream (`RolloutStream.take`, which publishes `rollouts/step_N`), and
its records go on to the batches from memory. The store is read back only when a rollout published
by an earlier attempt is reused: a Prefect retry, or a resume. The micro-batch format and its files
are rlfleet/microbatches.py's. The batch manifest carries `num_loss_tokens` (the whole step's, for
token-level normalization) and the orchestrator cursor the trainer stores in its checkpoint.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from rlfleet.config.advantage import AdvantageConfig
from rlfleet.config.models import RLConfig
from rlfleet.errors import DeterministicError
from rlfleet.orchestrator.advantages import advantages
from rlfleet.orchestrator.rollout import Rollout, load_tokenizer, read_rollout, staleness, usable
from rlfleet.store import RunStore, layout
from rlfleet.store.records import BatchManifest, RolloutManifest, TrajectoryRecord, read_rollout_manifest


@dataclass(frozen=True)
class BatchSpec:
    """How a step's records become the trainer's batch."""

    micro_batch_size: int  # sequences per micro-batch, or packed rows with seq_len > 0
    pad_id: int = 0
    seed: int | None = None  # the data's, kept in the cursor for a resume
    temperature: float = 1.0  # the sampling temperature the trainer's logprobs divide by
    seq_len: int = 0  # > 0: pack sequences into rows of this many tokens
    max_staleness: int = 0  # reuse a published rollout, and batch samples, only this stale (k, m)
    advantage: AdvantageConfig | None = None  # the estimator; None: GRPO's
    max_tokens: int = 0  # recorded: the `constant` loss normaliser's budget

    @classmethod
    def of(cls, cfg: RLConfig) -> BatchSpec:
        o = cfg.orchestrator
        pad_id = load_tokenizer(cfg.model.path).pad_token_id or 0  # cached: the stream loaded it
        return cls(
            o.micro_batch_size,
            pad_id,
            cfg.seed,
            o.temperature,
            o.seq_len,
            o.max_staleness,
            cfg.advantage,
            o.max_tokens,
        )


class Taker(Protocol):
    """What `step_batches` needs of the rollout stream (orchestrator/stream.py)."""

    store: RunStore

    def take(self, step: int) -> Rollout: ...


@dataclass
class StepBatches:
    rollout: RolloutManifest
    batches: BatchManifest
    reused: bool  # the rollout an earlier attempt published (a retry, a resume), not taken now
    free_gpu_seconds: float


def step_batches(
    stream: Taker, step: int, spec: BatchSpec, free_gpu: Callable[[], float] = lambda: 0.0
) -> StepBatches:
    """Publish step N's rollout and batches. A rollout published earlier is reused while its
    weights are within `max_staleness` of N-1 (with its batches, or batches made from it), else it
    goes with its batches and the step's groups are taken again.

    `free_gpu()` runs between the two: a colocated pool sleeps there (`inference.sleep`), before
    the trainer, which waits for the batches, allocates its memory."""
    store = stream.store
    published = read_rollout_manifest(store, step)
    if published is not None and usable(step, published["policy_step"], spec.max_staleness):
        free = free_gpu()
        batches = store.manifest(layout.step_dir(layout.BATCHES, step))
        if batches is None:  # the attempt that published the rollout stopped before its batches
            batches = publish_batches(store, step, read_rollout(store, step), spec)
        return StepBatches(published, batches, True, free)
    if published is not None:  # too stale for step N now: batches first, so none outlives its rollout
        store.remove(layout.step_dir(layout.BATCHES, step))
        store.remove(layout.step_dir(layout.ROLLOUTS, step))
    rollout = stream.take(step)
    free = free_gpu()
    return StepBatches(rollout.manifest, publish_batches(store, step, rollout.records, spec), False, free)


def with_advantages(
    records: list[TrajectoryRecord], cfg: AdvantageConfig | None = None
) -> list[TrajectoryRecord]:
    groups: dict[int, list[TrajectoryRecord]] = {}
    for r in records:
        groups.setdefault(r["group"], []).append(r)
    ordered = [groups[g] for g in sorted(groups)]
    for members, advs in zip(
        ordered, advantages([[m["reward"] for m in g] for g in ordered], cfg), strict=True
    ):
        for m, a in zip(members, advs, strict=True):
            m["advantage"] = a
    return [m for g in ordered for m in g]


def publish_batches(
    store: RunStore, step: int, records: list[TrajectoryRecord], spec: BatchSpec
) -> BatchManifest:
    """Publish `batches/step_N` from step N's rollout records: the step's micro-batches
    (rlfleet/microbatches.py).

    seq_len > 0 packs the sequences into rows of that many tokens, `micro_batch_size` rows a file; a
    GPU trainer regroups the rows into micro-batches of its own token budget (config/sizing.py),
    so the files are a transport of rows. Every record carries the weight version that sampled it;
    the batch records the step's staleness range and refuses (a bug upstream, never retried)
    samples older than `max_staleness`; `advantage` picks the estimator.
    """
    records = with_advantages(records, spec.advantage)
    rel = layout.step_dir(layout.BATCHES, step)
    stale = [staleness(step, r["policy_step"]) for r in records]
    m = spec.max_staleness
    if not all(usable(step, r["policy_step"], m) for r in records):
        raise DeterministicError(
            f"{layout.step_dir(layout.ROLLOUTS, step)}: staleness {min(stale)}..{max(stale)} outside 0..{m}"
        )
    stage = store.staging_dir(rel)
    from rlfleet.microbatches import micro_batches, write_micro_batches  # torch: after the flow has started

    micro = micro_batches(records, spec.pad_id, spec.micro_batch_size, spec.seq_len)
    write_micro_batches(stage, micro)
    cursor: dict[str, Any] = {"next_step": step + 1}
    if spec.seed is not None:
        cursor["seed"] = spec.seed
    meta = {
        "step": step,
        "micro_batches": len(micro),
        "num_sequences": len(records),
        "max_tokens": spec.max_tokens,
        "num_loss_tokens": sum(sum(r["loss_mask"]) for r in records),
        "policy_steps": sorted({r["policy_step"] for r in records}),
        "max_staleness": max(stale),
        "cursor": cursor,
        "temperature": spec.temperature,
        "seq_len": spec.seq_len,
    }
    return store.publish_dir(stage, rel, meta)
