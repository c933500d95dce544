"""What a policy loss sees of a micro-batch, and the step-wide numbers it is normalised by.

Tensors are aligned to next-token targets, [B, T]. A row is one sequence (padded batches) or
several (packed rows, rlfleet/microbatches.py): `seq_ids` tells them apart from the position ids,
which restart at 0 at every sequence, so per-sequence quantities (GSPO's ratio, a sequence's IS
weight, a per-sequence mean) are segment sums over the micro-batch, never a reshape.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import torch


@dataclass(frozen=True)
class StepNorm:
    """The whole step's normalisers (not the micro-batch's), so micro-batches of any size
    accumulate to one big batch's gradient."""

    tokens: int  # loss tokens in the step
    sequences: int = 0  # sequences in the step (0: unknown; a per-sequence aggregation refuses it)
    constant: float = 0.0  # the `constant` aggregation's divisor


def sequence_ids(position_ids: torch.Tensor | None, shape: torch.Size, device: torch.device) -> torch.Tensor:
    """[B, L] ids, unique within the micro-batch: a new id at every position 0 of a packed row, the
    row index without position ids (one right-padded sequence per row)."""
    b, length = shape
    if position_ids is None:
        return torch.arange(b, device=device).unsqueeze(-1).expand(b, length)
    starts = (position_ids == 0).flatten().long()  # every row starts with position 0
    return (torch.cumsum(starts, 0) - 1).view(b, length)


@dataclass
class LossInputs:
    """One micro-batch as a loss function sees it; a user's `file.py:fn` gets this too.

    logprobs          the trainer's logprob of each target token (carries the gradient)
    old_logprobs      the ratio's denominator: the sampler's (is_correction none) or the trainer's own,
                      detached (one optimizer step per batch: they are the old policy's)
    sampler_logprobs  vLLM's logprob of each sampled token
    advantages        per token (a sequence's advantage repeated over its tokens)
    mask              1.0 on loss tokens
    """

    logprobs: torch.Tensor
    old_logprobs: torch.Tensor
    sampler_logprobs: torch.Tensor
    advantages: torch.Tensor
    mask: torch.Tensor
    clip_low: float
    clip_high: float
    position_ids: torch.Tensor | None = None  # [B, T + 1], the micro-batch's (None: padded rows)

    @cached_property
    def log_ratio(self) -> torch.Tensor:
        return (self.logprobs - self.old_logprobs) * self.mask

    @cached_property
    def ratio(self) -> torch.Tensor:
        """pi_theta / pi_old per token (1.0 off the mask)."""
        return torch.exp(self.log_ratio)

    @cached_property
    def seq_ids(self) -> torch.Tensor:
        b, t = self.logprobs.shape
        full = sequence_ids(self.position_ids, torch.Size((b, t + 1)), self.logprobs.device)
        return full[:, 1:]  # a target belongs to the sequence its position is in

    def seq_sum(self, values: torch.Tensor) -> torch.Tensor:
        """Each token's sequence total of `values` (mask them first), per token [B, T]."""
        ids = self.seq_ids.reshape(-1)
        flat = values.reshape(-1)
        totals = flat.new_zeros(self.seq_ids.numel()).index_add(0, ids, flat)
        return totals[ids].view_as(values)

    @cached_property
    def seq_tokens(self) -> torch.Tensor:
        """Loss tokens of each token's sequence, per token (at least 1)."""
        return self.seq_sum(self.mask).clamp(min=1.0)

    def seq_mean(self, values: torch.Tensor) -> torch.Tensor:
        """Mean of masked `values` over each token's sequence's loss tokens, per token."""
        return self.seq_sum(values * self.mask) / self.seq_tokens
