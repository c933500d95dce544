"""gspo: Group Sequence Policy Optimization (Zheng et al. 2025), clipped at the sequence level.

s_i = exp(mean over y_i's tokens of log(pi_theta / pi_old)) (GSPO eq. 7), and sequence i's term
-min(s_i A_i, clip(s_i, 1 - clip_low, 1 + clip_high) A_i) (eq. 5) is put on each of its tokens:
with the default `seq_mean_token_mean` aggregation that is eq. 5's 1/G sum over sequences.
"""

from __future__ import annotations

import torch

from rlfleet.trainer.losses.inputs import LossInputs


def gspo(x: LossInputs) -> tuple[torch.Tensor, torch.Tensor]:
    s = torch.exp(x.seq_mean(x.log_ratio))
    unclipped = s * x.advantages
    clipped = torch.clamp(s, 1.0 - x.clip_low, 1.0 + x.clip_high) * x.advantages
    return -torch.minimum(unclipped, clipped), clipped < unclipped
