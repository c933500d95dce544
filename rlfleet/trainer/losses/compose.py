"""One micro-batch's loss: the configured policy term, IS weight, KL, entropy, masks, aggregation.

With `[loss]`'s defaults this is today's GRPO loss operation for operation (tests/test_loss.py
holds the frozen original and compares bit for bit): PPO-clip against the sampler's logprobs,
tokens whose ratio lies outside [mask_ratio_low, mask_ratio_high] MASKED (they leave the loss,
no gradient, but still count in the normaliser, so it does not depend on how many were masked),
summed and divided by the step's loss tokens.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from rlfleet.config.loss import LossConfig
from rlfleet.trainer.losses.cispo import cispo
from rlfleet.trainer.losses.correction import is_weights
from rlfleet.trainer.losses.gspo import gspo
from rlfleet.trainer.losses.inputs import LossInputs, StepNorm
from rlfleet.trainer.losses.ppo import ppo_clip
from rlfleet.trainer.losses.terms import aggregate, kl_penalty
from rlfleet.usercode import load_object

# (per-token loss [B, T], clipped tokens [B, T] bool or None); user functions may return the loss only
PolicyFn = Callable[[LossInputs], "tuple[torch.Tensor, torch.Tensor | None] | torch.Tensor"]

LOSSES: dict[str, PolicyFn] = {"grpo": ppo_clip, "dr_grpo": ppo_clip, "gspo": gspo, "cispo": cispo}


def policy_fn(cfg: LossConfig) -> PolicyFn:
    """The configured per-token policy term; a user's is loaded once per process."""
    if cfg.builtin:
        return LOSSES[cfg.type]
    return load_object(cfg.type)


def micro_batch_loss(
    cfg: LossConfig,
    policy_fn: PolicyFn,
    logprobs: torch.Tensor,
    sampler_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    norm: StepNorm,
    position_ids: torch.Tensor | None = None,
    ref_logprobs: torch.Tensor | None = None,
    entropy: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The micro-batch's loss (already divided by the step's normaliser) and summed statistics
    (0-d tensors: reading them is a device sync, so the caller sums them first).

    logprobs, sampler_logprobs, mask: [B, T]; advantages [B] (one per sequence) or [B, T];
    position_ids [B, T + 1] for packed rows.
    """
    mask = mask.to(logprobs.dtype)
    adv = (advantages.unsqueeze(-1) if advantages.dim() == 1 else advantages).expand_as(logprobs)
    corrected = cfg.is_correction != "none"
    old = logprobs.detach() if corrected else sampler_logprobs
    x = LossInputs(logprobs, old, sampler_logprobs, adv, mask, cfg.clip_low, cfg.clip_high, position_ids)
    out = policy_fn(x)
    per_token, clipped = out if isinstance(out, tuple) else (out, None)
    if per_token.shape != logprobs.shape:
        raise ValueError(
            f"loss {cfg.type}: per-token loss of shape {tuple(per_token.shape)}, not {tuple(logprobs.shape)}"
        )
    with torch.no_grad():
        in_range = ((x.ratio >= cfg.mask_ratio_low) & (x.ratio <= cfg.mask_ratio_high)).to(mask.dtype)
    stats: dict[str, torch.Tensor] = {}
    total, keep = per_token, None
    if corrected:
        weight, keep = is_weights(x, cfg.is_correction, cfg.is_low, cfg.is_high)
        total = total * weight
        stats["is_weight_sum"] = (weight * mask).sum()
        if keep is not None:
            stats["is_masked_tokens"] = (mask * (1.0 - keep)).sum()
    if cfg.kl_coef > 0:
        if ref_logprobs is None:
            raise ValueError("loss.kl_coef > 0 needs the reference model's logprobs")
        kl = kl_penalty(logprobs, ref_logprobs, cfg.kl_estimator)
        total = total + cfg.kl_coef * kl
        stats["kl_sum"] = (kl.detach() * mask).sum()
    if cfg.entropy_coef > 0:
        if entropy is None or not entropy.requires_grad:
            raise ValueError("loss.entropy_coef > 0 needs a differentiable entropy from the policy")
        total = total - cfg.entropy_coef * entropy
    kept = total * mask * in_range
    if keep is not None:
        kept = kept * keep
    loss = aggregate(kept, cfg.aggregation, norm, x)
    with torch.no_grad():
        # The sampler/trainer gap is ~1e-6 nats: its KL (~x^2/2) vanishes in float32, so float64
        # and expm1 (exp(x) - 1 without the cancellation).
        gap = (logprobs.double() - sampler_logprobs.double()) * mask.double()
        if clipped is not None:
            stats["clipped_tokens"] = (clipped.to(mask.dtype) * mask * in_range).sum()
        stats |= {
            "masked_tokens": (mask * (1.0 - in_range)).sum(),
            "ratio_sum": (x.ratio * mask).sum(),
            # k3 estimator of KL(sampler || trainer) on the sampled tokens
            "mismatch_kl_sum": (torch.expm1(gap) - gap).sum(),
            "logprob_diff_max": gap.abs().max() if gap.numel() else gap.new_zeros(()),
        }
        if entropy is not None:
            stats["entropy_sum"] = (entropy.detach() * mask).sum()
    return loss, stats
