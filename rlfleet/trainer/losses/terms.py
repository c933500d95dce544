"""The terms every loss type shares: KL to the reference model, and how per-token losses become
the micro-batch's share of the step's loss."""

from __future__ import annotations

import torch

from rlfleet.trainer.losses.inputs import LossInputs, StepNorm


def kl_penalty(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, estimator: str) -> torch.Tensor:
    """Per-token estimate of KL(pi_theta || pi_ref) on the sampled tokens (Schulman, "Approximating
    KL divergence"): with log r = log pi_ref - log pi_theta, k1 = -log r, k2 = (log r)^2 / 2,
    k3 = r - 1 - log r (GRPO's, DeepSeekMath eq. 4)."""
    log_r = ref_logprobs - logprobs
    if estimator == "k1":
        return -log_r
    if estimator == "k2":
        return 0.5 * log_r**2
    return torch.exp(log_r) - 1.0 - log_r


def aggregate(kept: torch.Tensor, how: str, norm: StepNorm, x: LossInputs) -> torch.Tensor:
    """The micro-batch's share of the step's loss from masked per-token losses `kept`:
      token_mean           sum / loss tokens in the step (DAPO)
      seq_mean_token_sum   sum / sequences in the step
      seq_mean_token_mean  sum over sequences of (their token sum / their loss tokens) / sequences
      constant             sum / a fixed normaliser (Dr.GRPO)
    Every divisor is the step's, so micro-batches add up to the step's loss."""
    if how == "token_mean":
        return kept.sum() / max(norm.tokens, 1)
    if how == "constant":
        if norm.constant <= 0:
            raise ValueError(
                "loss.aggregation = constant needs loss.normalizer (or a batch that records max_tokens)"
            )
        return kept.sum() / norm.constant
    if norm.sequences <= 0:
        raise ValueError(f"loss.aggregation = {how} needs the step's sequence count (StepNorm.sequences)")
    if how == "seq_mean_token_sum":
        return kept.sum() / norm.sequences
    return (kept / x.seq_tokens).sum() / norm.sequences
