"""Aggregate a step's rollouts into trainer micro-batches: advantages, padding, one file per micro-batch.

Layout: `batches/step_N/rank_R/micro_K.safetensors`, tensors aligned to token positions:
  input_ids [B, L]      the trajectory (prompt, model turns, tool/env turns), right-padded with pad_id
  loss_mask [B, L]      1 where the token at that position was sampled by the model, 0 elsewhere
  old_logprobs [B, L]   the sampler's logprob of that token (0 elsewhere)
  advantages [B]        GRPO advantage of the sequence
With `orchestrator.seq_len` > 0 sequences are packed instead (rlfleet/trainer/packing.py): rows of
exactly seq_len tokens holding several sequences, `position_ids [R, L]` restarting at each one, and
`advantages [R, L]` per token.
The manifest carries `num_loss_tokens` (the whole step's, for token-level normalization) and the
orchestrator cursor the trainer stores in its checkpoint.
"""

from __future__ import annotations

import statistics
from typing import Any

import torch
from safetensors.torch import load, save_file

from rlfleet.errors import DeterministicError
from rlfleet.orchestrator.advantages import grpo_advantages
from rlfleet.orchestrator.rollout import read_rollout, staleness
from rlfleet.store import RunStore, step_dir
from rlfleet.trainer.packing import first_fit, pack_rows


def pack(records: list[dict[str, Any]], pad_id: int) -> dict[str, torch.Tensor]:
    length = max(len(r["input_ids"]) for r in records)
    n = len(records)
    input_ids = torch.full((n, length), pad_id, dtype=torch.long)
    loss_mask = torch.zeros((n, length), dtype=torch.float32)
    old_logprobs = torch.zeros((n, length), dtype=torch.float32)
    for i, r in enumerate(records):
        k = len(r["input_ids"])
        input_ids[i, :k] = torch.tensor(r["input_ids"])
        loss_mask[i, :k] = torch.tensor(r["loss_mask"], dtype=torch.float32)
        old_logprobs[i, :k] = torch.tensor(r["logprobs"], dtype=torch.float32)
    advantages = torch.tensor([r["advantage"] for r in records], dtype=torch.float32)
    return {
        "input_ids": input_ids,
        "loss_mask": loss_mask,
        "old_logprobs": old_logprobs,
        "advantages": advantages,
    }


def _tokens(r: dict[str, Any]) -> dict[str, list[float]]:
    return {
        "input_ids": r["input_ids"],
        "loss_mask": [float(m) for m in r["loss_mask"]],
        "old_logprobs": list(r["logprobs"]),
        "advantages": [r["advantage"]] * len(r["input_ids"]),
    }


PACK_PAD = {"input_ids": 0, "loss_mask": 0.0, "old_logprobs": 0.0, "advantages": 0.0}
PACK_DTYPES = {k: torch.long if k == "input_ids" else torch.float32 for k in PACK_PAD}


def packed_micro_batches(
    records: list[dict[str, Any]], pad_id: int, seq_len: int, rows_per_micro: int
) -> list[dict[str, torch.Tensor]]:
    """Records packed into rows of `seq_len` tokens, `rows_per_micro` rows per micro-batch."""
    seqs = [_tokens(r) for r in records]
    rows = first_fit([len(s["input_ids"]) for s in seqs], seq_len)
    pad = {**PACK_PAD, "input_ids": pad_id}
    return [
        pack_rows(seqs, rows[i : i + rows_per_micro], seq_len, pad, PACK_DTYPES)
        for i in range(0, len(rows), rows_per_micro)
    ]


def with_advantages(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    groups: dict[int, list[dict[str, Any]]] = {}
    for r in records:
        groups.setdefault(r["group"], []).append(r)
    ordered = [groups[g] for g in sorted(groups)]
    for members, advs in zip(
        ordered, grpo_advantages([[m["reward"] for m in g] for g in ordered]), strict=True
    ):
        for m, a in zip(members, advs, strict=True):
            m["advantage"] = a
    return [m for g in ordered for m in g]


def build_batches(
    store: RunStore,
    step: int,
    micro_batch_size: int,
    pad_id: int,
    world_size: int = 1,
    cursor: dict[str, Any] | None = None,
    temperature: float = 1.0,
    seq_len: int = 0,
    max_async_level: int | None = None,
) -> dict[str, Any]:
    """Publish `batches/step_N` from `rollouts/step_N`; sequences are dealt round-robin to ranks.

    seq_len > 0 packs each rank's sequences into rows of that many tokens. Every record carries
    the weight version that sampled it; the batch records the step's staleness range and refuses
    (a bug upstream, never retried) samples older than `max_async_level`.
    """
    records = with_advantages(read_rollout(store, step))
    stale = [staleness(step, r["policy_step"]) for r in records]
    if max_async_level is not None and not all(0 <= s <= max_async_level for s in stale):
        raise DeterministicError(
            f"rollouts/step_{step}: staleness {min(stale)}..{max(stale)} outside 0..{max_async_level}"
        )
    stage = store.staging_dir(step_dir("batches", step))
    per_rank = [records[r::world_size] for r in range(world_size)]
    micro_counts = []
    for rank, rank_records in enumerate(per_rank):
        (stage / f"rank_{rank}").mkdir()
        if seq_len:
            micro = packed_micro_batches(rank_records, pad_id, seq_len, micro_batch_size)
        else:
            # Sort by length so padding inside a micro-batch stays small.
            rank_records = sorted(rank_records, key=lambda r: len(r["input_ids"]))
            micro = [
                pack(rank_records[i : i + micro_batch_size], pad_id)
                for i in range(0, len(rank_records), micro_batch_size)
            ]
        for k, tensors in enumerate(micro):
            save_file(tensors, str(stage / f"rank_{rank}" / f"micro_{k}.safetensors"))
        micro_counts.append(len(micro))
    meta = {
        "step": step,
        "world_size": world_size,
        "micro_batches": micro_counts,
        "num_sequences": len(records),
        "num_loss_tokens": sum(sum(r["loss_mask"]) for r in records),
        "reward_mean": statistics.fmean(r["reward"] for r in records),
        "policy_steps": sorted({r["policy_step"] for r in records}),
        "max_staleness": max(stale),
        "cursor": cursor or {"next_step": step + 1},
        "temperature": temperature,
        "seq_len": seq_len,
    }
    return store.publish_dir(stage, step_dir("batches", step), meta)


def load_micro_batches(
    store: RunStore, step: int, rank: int = 0
) -> tuple[dict[str, Any], list[dict[str, torch.Tensor]]]:
    rel = step_dir("batches", step)
    manifest = store.manifest(rel, verify=True)
    if manifest is None:
        raise FileNotFoundError(f"{rel} is not published")
    micro = []
    for k in range(manifest["micro_batches"][rank]):
        micro.append(load(store.read_bytes(f"{rel}/rank_{rank}/micro_{k}.safetensors")))
    return manifest, micro
