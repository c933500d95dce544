"""cispo: Clipped IS-weight Policy Optimization (MiniMax-M1, Chen et al. 2025).

Per token: -sg(clip(r, 1 - clip_low, 1 + clip_high)) A log pi_theta (MiniMax-M1 eq. 4-5): the IS
weight is clipped and detached instead of the update, so every token keeps a gradient.
The default clip_low = 1.0 leaves no lower bound, as the paper does.
"""

from __future__ import annotations

import torch

from rlfleet.trainer.losses.inputs import LossInputs


def cispo(x: LossInputs) -> tuple[torch.Tensor, torch.Tensor]:
    low, high = 1.0 - x.clip_low, 1.0 + x.clip_high
    weight = torch.clamp(x.ratio, low, high).detach()
    return -(weight * x.advantages * x.logprobs), (x.ratio < low) | (x.ratio > high)
