"""Sampler/trainer mismatch: importance weights pi_old / pi_sampler, truncated or masked.

vLLM's numerics (and, asynchronously, its older weights) differ from the trainer's. With an IS
correction the PPO ratio is taken against the trainer's own logprobs (detached: one optimizer
step per batch makes them the old policy's) and the policy term is weighted by
w = pi_old / pi_sampler of the token, or of the whole sequence (the product over its tokens):
  *_tis  min(w, is_high)                        truncated IS (Yao et al. 2025, "TIS")
  *_mis  w where is_low <= w <= is_high, else the token (sequence) leaves the loss  (masked IS)
"""

from __future__ import annotations

import torch

from rlfleet.trainer.losses.inputs import LossInputs


def is_weights(x: LossInputs, kind: str, low: float, high: float) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(detached weight per token, keep mask or None): the mask is 0 where `*_mis` drops."""
    with torch.no_grad():
        log_w = (x.logprobs.detach() - x.sampler_logprobs) * x.mask
        if kind.startswith("seq_"):
            log_w = x.seq_sum(log_w)
        w = torch.exp(log_w)
        if kind.endswith("_tis"):
            return torch.clamp(w, max=high), None
        keep = ((w >= low) & (w <= high)).to(w.dtype)
        return w * keep, keep
