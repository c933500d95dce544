"""Sequence packing: several sequences per row instead of one sequence per right-padded row.

Position ids restart at 0 at every sequence start. transformers reads restarts as sequence
boundaries: sdpa/eager get a block-diagonal causal mask, flash-attention runs varlen, so no token
attends across samples and each sample sees the positions it would see alone. A row's tail
padding is its own pseudo-sequence that carries no loss.

The next-token shift crosses a boundary only at a sequence's first token, which is always a
prompt (or BOS) token and never a loss target, so no loss is taken across samples either.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


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
    """[len(rows), width] tensors of each per-token field, plus `position_ids`.

    `seqs[i][field]` are token-aligned lists of one sequence; `pad[field]` fills the tail.
    """
    out = {k: torch.full((len(rows), width), pad[k], dtype=dtypes[k]) for k in pad}
    pos = torch.zeros((len(rows), width), dtype=torch.long)
    for r, members in enumerate(rows):
        at = 0
        for i in members:
            n = len(seqs[i]["input_ids"])
            for k in pad:
                out[k][r, at : at + n] = torch.tensor(seqs[i][k], dtype=dtypes[k])
            pos[r, at : at + n] = torch.arange(n)
            at += n
        pos[r, at:] = torch.arange(width - at)
    out["position_ids"] = pos
    return out
