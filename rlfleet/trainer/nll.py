"""SFT's objective: the token-mean negative log-likelihood of the step.

Summed over loss tokens and divided by the whole step's loss-token count, not the micro-batch's, so
micro-batches of any size accumulate to the same gradient (the policy losses of rlfleet/trainer/losses/
normalise the same way).
"""

from __future__ import annotations

from typing import Any

import torch


def sft_loss(logprobs: torch.Tensor, mask: torch.Tensor, num_tokens: int) -> torch.Tensor:
    """Negative log-likelihood summed over masked tokens / `num_tokens` (loss tokens in the step).

    Dividing by the step's token count, not the micro-batch's, makes accumulated micro-batches give
    the token-mean NLL of the whole step, whatever their sizes.
    """
    return -(logprobs * mask.to(logprobs.dtype)).sum() / max(num_tokens, 1)


def num_targets(batches: list[dict[str, torch.Tensor]]) -> int:
    """Loss tokens that can be predicted: position 0 has no previous token, so it never counts."""
    return int(sum(int(mb["loss_mask"][:, 1:].sum()) for mb in batches))


class NLL:
    """SFT's objective for the train step (trainer/train.py `Objective`): the token-mean NLL of
    the step. Every rank builds the whole step's micro-batches (a pure function of seed and step)
    and trains its share, so the normaliser is the step's loss-token count on every rank."""

    temperature, want_entropy = 1.0, False

    def __init__(self, micro_batches: list[dict[str, torch.Tensor]]):
        self.tokens = num_targets(micro_batches)
        self.input_tokens = int(sum(mb["input_ids"].numel() for mb in micro_batches))

    def __call__(
        self, mb: dict[str, torch.Tensor], logprobs: torch.Tensor, entropy: torch.Tensor | None
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        return sft_loss(logprobs, mb["loss_mask"][:, 1:], self.tokens), {}

    def metrics(self, totals: dict[str, float]) -> dict[str, Any]:
        return {"loss_tokens": self.tokens, "tokens": self.input_tokens}
