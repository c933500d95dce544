"""Policy losses behind one seam: `[loss] type` names a per-token policy term in `LOSSES`, or a
user's `path/file.py:fn` with the same signature; `micro_batch_loss` (compose.py) adds what every
type shares (IS correction, KL, entropy, masks, aggregation)."""

from __future__ import annotations

from rlfleet.config.loss import LossConfig
from rlfleet.trainer.losses.cispo import cispo
from rlfleet.trainer.losses.compose import PolicyFn, micro_batch_loss
from rlfleet.trainer.losses.gspo import gspo
from rlfleet.trainer.losses.inputs import LossInputs, StepNorm
from rlfleet.trainer.losses.objective import PolicyLoss
from rlfleet.trainer.losses.ppo import ppo_clip
from rlfleet.usercode import load_object

__all__ = ["LOSSES", "LossInputs", "PolicyFn", "PolicyLoss", "StepNorm", "micro_batch_loss", "policy_fn"]

LOSSES: dict[str, PolicyFn] = {"grpo": ppo_clip, "dr_grpo": ppo_clip, "gspo": gspo, "cispo": cispo}


def policy_fn(cfg: LossConfig) -> PolicyFn:
    """The configured per-token policy term; a user's is loaded once per process."""
    if cfg.builtin:
        return LOSSES[cfg.type]
    return load_object(cfg.type)
