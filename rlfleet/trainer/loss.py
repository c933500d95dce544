"""Token logprobs, and the SFT and GRPO losses over them.

The policy losses of RL (`[loss]`: grpo, dr_grpo, gspo, cispo or a user's) live in
rlfleet/trainer/losses/; `grpo_loss` is the default one with explicit bounds. Every loss is
summed over loss tokens and divided by a normaliser of the whole step (for the default, its loss
tokens), so micro-batches of any size accumulate to the same gradient (DAPO's token-level
normalization).
"""

from __future__ import annotations

from typing import Any

import torch


def token_logprobs(logits: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """log p(target) per position; logits [B, T, V], targets [B, T] -> [B, T] (float32)."""
    logits = logits.float()
    if temperature != 1.0:
        logits = logits / temperature
    return torch.gather(logits.log_softmax(-1), -1, targets.unsqueeze(-1)).squeeze(-1)


def logprobs_and_entropy(
    logits: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """(log p(target), entropy of the next-token distribution), both differentiable, [B, T]; for
    an entropy bonus on the full-logits path (the chunked LM head gives both without the logits)."""
    logits = logits.float()
    if temperature != 1.0:
        logits = logits / temperature
    logp = logits.log_softmax(-1)
    entropy = -(logp.exp() * logp).sum(-1)
    return torch.gather(logp, -1, targets.unsqueeze(-1)).squeeze(-1), entropy


def grpo_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    num_tokens: int,
    clip_low: float = 0.2,
    clip_high: float = 0.28,
    mask_low: float = 0.0,
    mask_high: float = float("inf"),
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The `grpo` loss of `[loss]` with these bounds (rlfleet/trainer/losses/): PPO-clip on every
    masked-in token whose ratio lies in [mask_low, mask_high], summed / `num_tokens`.

    logprobs, old_logprobs (the sampler's), mask: [B, T]; advantages: [B] or [B, T].
    """
    from rlfleet.config.loss import LossConfig
    from rlfleet.trainer.losses import StepNorm, micro_batch_loss, policy_fn

    cfg = LossConfig(
        clip_low=clip_low, clip_high=clip_high, mask_ratio_low=mask_low, mask_ratio_high=mask_high
    )
    return micro_batch_loss(
        cfg, policy_fn(cfg), logprobs, old_logprobs, advantages, mask, StepNorm(num_tokens)
    )


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
