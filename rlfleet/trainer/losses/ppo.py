"""grpo / dr_grpo: token-level PPO-clip with asymmetric bounds ("clip-higher", DAPO).

Per token: -min(r A, clip(r, 1 - clip_low, 1 + clip_high) A), r = pi_theta / pi_old
(GRPO, DeepSeekMath eq. 3, without its KL term: that is `loss.kl_coef`). dr_grpo is the same
term; what makes it Dr.GRPO is its default `constant` aggregation (and mean-only advantages).
"""

from __future__ import annotations

import torch

from rlfleet.trainer.losses.inputs import LossInputs


def ppo_clip(x: LossInputs) -> tuple[torch.Tensor, torch.Tensor]:
    """(per-token loss, which tokens the clip held)."""
    unclipped = x.ratio * x.advantages
    clipped = torch.clamp(x.ratio, 1.0 - x.clip_low, 1.0 + x.clip_high) * x.advantages
    return -torch.minimum(unclipped, clipped), clipped < unclipped
