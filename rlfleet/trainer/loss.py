"""Token-level GRPO / PPO-clip loss against the sampler's logprobs.

The importance ratio is taken against vLLM's logprobs for the sampled tokens, so the loss stays
correct when the trainer's numerics differ from the sampler's or when rollouts are off-policy.
Clipping is asymmetric ("clip-higher", DAPO): the ratio is clipped to [1 - clip_low, 1 + clip_high].

Off-policy samples (async, `max_async_level` k > 0) are handled by the same ratio: it is taken
against the logprobs of the weights that actually sampled the token, so staleness shows up as a
ratio away from 1. PPO's clip bounds only one side per advantage sign, so a token whose ratio
lies outside [mask_low, mask_high] is MASKED: it leaves the loss entirely (no gradient, as in
prime-rl's and verl's off-policy token masking) but still counts in `num_tokens`, so the
normalization does not depend on how many tokens were masked.
The loss is summed over completion tokens and divided by `num_tokens`, the number of loss tokens in
the whole step, so micro-batches of any size accumulate to the same gradient (DAPO's token-level
normalization).
"""

from __future__ import annotations

import torch


def token_logprobs(logits: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """log p(target) per position; logits [B, T, V], targets [B, T] -> [B, T] (float32)."""
    logits = logits.float()
    if temperature != 1.0:
        logits = logits / temperature
    return torch.gather(logits.log_softmax(-1), -1, targets.unsqueeze(-1)).squeeze(-1)


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
    """PPO-clip on every masked-in token whose ratio lies in [mask_low, mask_high].

    logprobs, old_logprobs, mask: [B, T]; advantages: [B] (one per sequence, GRPO) or [B, T].
    Returns the loss contribution of this micro-batch and summed statistics for logging (0-d
    tensors: reading them is a device sync, so the caller sums them first).
    """
    mask = mask.to(logprobs.dtype)
    adv = advantages.unsqueeze(-1) if advantages.dim() == 1 else advantages
    log_ratio = (logprobs - old_logprobs) * mask
    ratio = torch.exp(log_ratio)
    unclipped = ratio * adv
    clipped = torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high) * adv
    per_token = -torch.minimum(unclipped, clipped)
    with torch.no_grad():
        in_range = ((ratio >= mask_low) & (ratio <= mask_high)).to(mask.dtype)
    loss = (per_token * mask * in_range).sum() / max(num_tokens, 1)
    with torch.no_grad():
        is_clipped = (clipped < unclipped).to(mask.dtype) * mask * in_range
        # The sampler/trainer gap is ~1e-6 nats: its KL (~x^2/2) vanishes in float32, so float64
        # and expm1 (exp(x) - 1 without the cancellation).
        gap = (logprobs.double() - old_logprobs.double()) * mask.double()
        stats = {
            "clipped_tokens": is_clipped.sum(),
            "masked_tokens": (mask * (1.0 - in_range)).sum(),
            "ratio_sum": (ratio * mask).sum(),
            # k3 estimator of KL(sampler || trainer) on the sampled tokens
            "mismatch_kl_sum": (torch.expm1(gap) - gap).sum(),
            "logprob_diff_max": gap.abs().max() if gap.numel() else gap.new_zeros(()),
        }
    return loss, stats


def sft_loss(logprobs: torch.Tensor, mask: torch.Tensor, num_tokens: int) -> torch.Tensor:
    """Negative log-likelihood summed over masked tokens / `num_tokens` (loss tokens in the step).

    Dividing by the step's token count, not the micro-batch's, makes accumulated micro-batches give
    the token-mean NLL of the whole step, whatever their sizes.
    """
    return -(logprobs * mask.to(logprobs.dtype)).sum() / max(num_tokens, 1)
