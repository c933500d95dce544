"""Aggregate a step's rollouts into trainer micro-batches: advantages, staleness, the batch manifest.

The micro-batch format and its files are rlfleet/batches.py's. The manifest carries
`num_loss_tokens` (the whole step's, for token-level normalization) and the orchestrator cursor
the trainer stores in its checkpoint.
"""

from __future__ import annotations

from typing import Any

from rlfleet.config.advantage import AdvantageConfig
from rlfleet.errors import DeterministicError
from rlfleet.orchestrator.advantages import advantages
from rlfleet.orchestrator.rollout import read_rollout, staleness, usable
from rlfleet.store import RunStore, layout
from rlfleet.store.records import BatchManifest, TrajectoryRecord


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


def build_batches(
    store: RunStore,
    step: int,
    micro_batch_size: int,
    pad_id: int,
    cursor: dict[str, Any] | None = None,
    temperature: float = 1.0,
    seq_len: int = 0,
    max_staleness: int | None = None,
    advantage: AdvantageConfig | None = None,
    max_tokens: int = 0,
) -> BatchManifest:
    """Publish `batches/step_N` from `rollouts/step_N`: the step's micro-batches (rlfleet/batches.py).

    seq_len > 0 packs the sequences into rows of that many tokens, `micro_batch_size` rows a file; a
    GPU trainer regroups the rows into micro-batches of its own token budget (trainer/sizing.py),
    so the files are a transport of rows. Every record carries
    the weight version that sampled it; the batch records the step's staleness range and refuses
    (a bug upstream, never retried) samples older than `max_staleness`. `advantage` picks the
    estimator (default GRPO's); `max_tokens`, recorded, is the `constant` loss normaliser's budget.
    """
    records = with_advantages(read_rollout(store, step), advantage)
    rel = layout.step_dir(layout.BATCHES, step)
    stale = [staleness(step, r["policy_step"]) for r in records]
    if max_staleness is not None and not all(usable(step, r["policy_step"], max_staleness) for r in records):
        raise DeterministicError(
            f"{layout.step_dir(layout.ROLLOUTS, step)}: staleness {min(stale)}..{max(stale)} "
            f"outside 0..{max_staleness}"
        )
    stage = store.staging_dir(rel)
    from rlfleet.batches import micro_batches, write_micro_batches  # torch: after the flow has started

    micro = micro_batches(records, pad_id, micro_batch_size, seq_len)
    write_micro_batches(stage, micro)
    meta = {
        "step": step,
        "micro_batches": len(micro),
        "num_sequences": len(records),
        "max_tokens": max_tokens,
        "num_loss_tokens": sum(sum(r["loss_mask"]) for r in records),
        "policy_steps": sorted({r["policy_step"] for r in records}),
        "max_staleness": max(stale),
        "cursor": cursor or {"next_step": step + 1},
        "temperature": temperature,
        "seq_len": seq_len,
    }
    return store.publish_dir(stage, rel, meta)
