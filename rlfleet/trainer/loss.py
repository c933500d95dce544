"""Token-level GRPO / PPO-clip loss against the sampler's logprobs.

The importance ratio is taken against vLLM's logprobs for the sampled tokens, so the loss stays
correct when the trainer's numerics differ from the sampler's or when rollouts are off-policy.
Clipping is asymmetric ("clip-higher", DAPO): the ratio is clipped to [1 - clip_low, 1 + clip_high].
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
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO-clip on every masked token.

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
    loss = (per_token * mask).sum() / max(num_tokens, 1)
    with torch.no_grad():
        is_clipped = (clipped < unclipped).to(mask.dtype) * mask
        stats = {
            "clipped_tokens": is_clipped.sum(),
            "ratio_sum": (ratio * mask).sum(),
            # k3 estimator of KL(sampler || trainer) on the sampled tokens
            "mismatch_kl_sum": ((ratio - 1.0 - log_ratio) * mask).sum(),
        }
    return loss, stats


def sft_loss(logprobs: torch.Tensor, mask: torch.Tensor, num_tokens: int) -> torch.Tensor:
    """Negative log-likelihood summed over masked tokens / `num_tokens` (loss tokens in the step).

    Dividing by the step's token count, not the micro-batch's, makes accumulated micro-batches give
    the token-mean NLL of the whole step, whatever their sizes.
    """
    return -(logprobs * mask.to(logprobs.dtype)).sum() / max(num_tokens, 1)
