"""Trainer micro-batches: the one format the orchestrator writes and the trainer reads.

records -> micro-batches -> files. A record is a trajectory's token fields (`input_ids`,
`loss_mask`, `logprobs`) plus its `advantage` (`[advantage]`, default GRPO's).
`batches/step_N/micro_K.safetensors` holds tensors aligned to token positions:
  input_ids [B, L]      the trajectory (prompt, model turns, tool/env turns), right-padded with pad_id
  loss_mask [B, L]      1 where the token at that position was sampled by the model, 0 elsewhere
  old_logprobs [B, L]   the sampler's logprob of that token (0 elsewhere)
  advantages [B]        the sequence's advantage
  teacher_logprobs [B, L]  with `loss.distill` only: the teacher's logprob of that token (0 elsewhere)
  real_tokens [B]       how many leading positions of the row are tokens (the rest is padding)
With seq_len > 0 sequences are packed instead: rows of exactly seq_len tokens holding several
sequences, `position_ids [R, L]` restarting at each one (the loss tells sequences apart by them),
and `advantages [R, L]` per token. A GPU trainer repacks the samples into micro-batches of its own
token budget, one flat row each (`flat_rows`; `regroup_rows` under eager attention; config/sizing.py):
the files are a transport of samples, and seq_len only the width of their rows. `real_tokens` is what no other field says exactly (pad_id can be
a real token, e.g. EOS): the MoE router's load counts only those (trainer/router.py).

Packing: position ids restart at 0 at every sequence start. The trainer's attention reads restarts
as sequence boundaries (trainer/attention.py: varlen flash on a GPU, sdpa per sample elsewhere; eager,
for Gemma-2, a block-diagonal mask), so no token attends across samples and each sample sees the
positions it would see alone. A row's
tail padding is its own pseudo-sequence that carries no loss. The next-token shift crosses a
boundary only at a sequence's first token, which is always a prompt (or BOS) token and never a
loss target, so no loss is taken across samples either. SFT packs its examples the same way.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load, save_file

from rlfleet.store import RunStore, layout


def first_fit(lengths: Sequence[int], capacity: int) -> list[list[int]]:
    """Indices grouped into rows of at most `capacity` tokens (first-fit decreasing, stable)."""
    too_long = [n for n in lengths if n > capacity]
    if too_long:
        raise ValueError(f"a sequence of {max(too_long)} tokens does not fit a packed row of {capacity}")
    rows: list[list[int]] = []
    free: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        for r, room in enumerate(free):
            if lengths[i] <= room:
                rows[r].append(i)
                free[r] -= lengths[i]
                break
        else:
            rows.append([i])
            free.append(capacity - lengths[i])
    return rows


def pack_rows(
    seqs: Sequence[dict[str, Sequence[float]]],
    rows: list[list[int]],
    width: int,
    pad: dict[str, float],
    dtypes: dict[str, torch.dtype],
) -> dict[str, torch.Tensor]:
    """[len(rows), width] tensors of each per-token field, plus `position_ids` and `real_tokens`.

    `seqs[i][field]` are token-aligned lists of one sequence; `pad[field]` fills the tail.
    """
    out = {k: torch.full((len(rows), width), pad[k], dtype=dtypes[k]) for k in pad}
    pos = torch.zeros((len(rows), width), dtype=torch.long)
    real = torch.zeros(len(rows), dtype=torch.long)
    for r, members in enumerate(rows):
        at = 0
        for i in members:
            n = len(seqs[i]["input_ids"])
            for k in pad:
                out[k][r, at : at + n] = torch.tensor(seqs[i][k], dtype=dtypes[k])
            pos[r, at : at + n] = torch.arange(n)
            at += n
        pos[r, at:] = torch.arange(width - at)
        real[r] = at
    out["position_ids"] = pos
    out["real_tokens"] = real
    return out


def padded(records: list[dict[str, Any]], pad_id: int) -> dict[str, torch.Tensor]:
    """One micro-batch, one sequence per row, right-padded to the longest with pad_id (no packing)."""
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
    out = {
        "input_ids": input_ids,
        "loss_mask": loss_mask,
        "old_logprobs": old_logprobs,
        "advantages": advantages,
        "real_tokens": torch.tensor([len(r["input_ids"]) for r in records], dtype=torch.long),
    }
    if distilled(records):
        teacher = torch.zeros((n, length), dtype=torch.float32)
        for i, r in enumerate(records):
            teacher[i, : len(r["input_ids"])] = torch.tensor(r["teacher_logprobs"], dtype=torch.float32)
        out["teacher_logprobs"] = teacher
    return out


def distilled(records: list[dict[str, Any]]) -> bool:
    """Whether the records carry a teacher's logprobs (loss.distill): all of them, or none."""
    have = ["teacher_logprobs" in r for r in records]
    if any(have) and not all(have):
        raise ValueError(f"{have.count(False)} of {len(records)} records lack teacher_logprobs")
    return bool(records) and all(have)


def _tokens(r: dict[str, Any]) -> dict[str, list[float]]:
    out = {
        "input_ids": r["input_ids"],
        "loss_mask": [float(m) for m in r["loss_mask"]],
        "old_logprobs": list(r["logprobs"]),
        "advantages": [r["advantage"]] * len(r["input_ids"]),
    }
    if "teacher_logprobs" in r:
        out["teacher_logprobs"] = list(r["teacher_logprobs"])
    return out


PACK_PAD = {"input_ids": 0, "loss_mask": 0.0, "old_logprobs": 0.0, "advantages": 0.0}
PACK_DTYPES = {k: torch.long if k == "input_ids" else torch.float32 for k in PACK_PAD}
PACK_DTYPES["teacher_logprobs"] = torch.float32


def packed_micro_batches(
    records: list[dict[str, Any]], pad_id: int, seq_len: int, rows_per_micro: int
) -> list[dict[str, torch.Tensor]]:
    """Records packed into rows of `seq_len` tokens, `rows_per_micro` rows per micro-batch."""
    seqs = [_tokens(r) for r in records]
    rows = first_fit([len(s["input_ids"]) for s in seqs], seq_len)
    pad = {**PACK_PAD, "input_ids": pad_id} | ({"teacher_logprobs": 0.0} if distilled(records) else {})
    return [
        pack_rows(seqs, rows[i : i + rows_per_micro], seq_len, pad, PACK_DTYPES)
        for i in range(0, len(rows), rows_per_micro)
    ]


def micro_batches(
    records: list[dict[str, Any]], pad_id: int, micro_batch_size: int, seq_len: int = 0
) -> list[dict[str, torch.Tensor]]:
    """Packed rows (seq_len > 0, `micro_batch_size` rows each) or padded sequences sorted by length,
    so that padding inside a micro-batch stays small (`micro_batch_size` sequences each)."""
    if seq_len:
        return packed_micro_batches(records, pad_id, seq_len, micro_batch_size)
    ordered = sorted(records, key=lambda r: len(r["input_ids"]))
    return [
        padded(ordered[i : i + micro_batch_size], pad_id) for i in range(0, len(ordered), micro_batch_size)
    ]


def regroup_rows(micro: list[dict[str, torch.Tensor]], sizes: list[int]) -> list[dict[str, torch.Tensor]]:
    """A step's packed micro-batches as new ones of `sizes` rows each, rows kept in order (a GPU
    trainer's micro-batches by tokens, config/sizing.py `row_groups`). Every field of a packed
    micro-batch is per row, so rows move whole and the step's loss and gradient stay the same."""
    if sum(sizes) != sum(len(m["input_ids"]) for m in micro):
        raise ValueError(
            f"regroup_rows: {sum(sizes)} rows asked of {sum(len(m['input_ids']) for m in micro)}"
        )
    rows = {k: torch.cat([m[k] for m in micro]) for k in micro[0]}
    out, at = [], 0
    for n in sizes:
        out.append({k: v[at : at + n] for k, v in rows.items()})
        at += n
    return out


def samples_in(mb: dict[str, torch.Tensor]) -> list[tuple[int, int, int]]:
    """(row, start, end) of each sample of a micro-batch, a row's tail padding left out: packed rows'
    samples start where their position is 0 and end where the next starts; a row without
    position ids is one sample (its real tokens, or all of it)."""
    rows, width = mb["input_ids"].shape
    real = mb["real_tokens"].tolist() if "real_tokens" in mb else [width] * rows
    if "position_ids" not in mb:
        return [(r, 0, n) for r, n in enumerate(real) if n]
    out = []
    for r, n in enumerate(real):
        if n:  # a row starts a sample (as `trainer/attention.packing` reads it), wherever its positions start
            starts = [0, *((mb["position_ids"][r, 1:n] == 0).nonzero().squeeze(1) + 1).tolist()]
            out += [(r, a, b) for a, b in zip(starts, [*starts[1:], n], strict=True)]
    return out


def samples_of(micro: list[dict[str, torch.Tensor]]) -> list[dict[str, torch.Tensor]]:
    """Each sample of packed micro-batches, its per-token fields cut out of its row (`samples_in`)."""
    out = []
    for mb in micro:
        per_token = [k for k in mb if k != "real_tokens"]
        out += [{k: mb[k][r, a:b] for k in per_token} for r, a, b in samples_in(mb)]
    return out


def flat_rows(
    micro: list[dict[str, torch.Tensor]], capacity: int, ranks: int = 1
) -> list[dict[str, torch.Tensor]]:
    """A step's packed micro-batches as new ones of one row each: its samples repacked first-fit
    decreasing into rows of at most `capacity` tokens (but never less than its longest sample), each
    row exactly as long as what it holds. No padding, so only attention that reads the samples'
    bounds (varlen, trainer/attention.py) may run them. With several ranks the capacity shrinks, if
    need be, until the count of micro-batches divides over them (trainer/train.py
    `shard_micro_batches` repeats a zeroed one for a rank that comes up short)."""
    samples = samples_of(micro)
    if not samples:
        return []
    lengths = [len(s["input_ids"]) for s in samples]
    capacity = max(capacity, max(lengths))
    rows = first_fit(lengths, capacity)
    if ranks > 1 and len(rows) % ranks:
        even = -(-sum(lengths) // (-(-len(rows) // ranks) * ranks))  # the tokens of an even split
        for cap in range(capacity, max(max(lengths), even) - 1, -max(1, capacity // 64)):
            if len(tried := first_fit(lengths, cap)) % ranks == 0:
                rows = tried
                break
    out = []
    for members in rows:
        row = {k: torch.cat([samples[i][k] for i in members]).unsqueeze(0) for k in samples[0]}
        row["real_tokens"] = torch.tensor([row["input_ids"].shape[1]])
        out.append(row)
    return out


def write_micro_batches(stage: Path, micro: list[dict[str, torch.Tensor]]) -> None:
    """A step's micro-batches as files in its batch's staging directory.

    Every trainer rank reads all of them and trains its share (trainer/train.py).
    """
    for k, tensors in enumerate(micro):
        save_file(tensors, str(stage / layout.micro_batch(k)))


def load_micro_batches(store: RunStore, step: int) -> tuple[dict[str, Any], list[dict[str, torch.Tensor]]]:
    """The published `batches/step_N` (verified): its manifest and its micro-batches."""
    rel = layout.step_dir(layout.BATCHES, step)
    manifest = store.published(rel)
    micro = []
    for k in range(manifest["micro_batches"]):
        micro.append(load(store.read_bytes(f"{rel}/{layout.micro_batch(k)}")))
    return manifest, micro
