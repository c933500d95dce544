"""Policy losses behind one seam: `[loss] type` names a per-token policy term in `LOSSES`, or a
user's `path/file.py:fn` with the same signature; `micro_batch_loss` (compose.py) adds what every
type shares (IS correction, KL, entropy, masks, aggregation)."""

from __future__ import annotations

from rlfleet.trainer.losses.compose import LOSSES, PolicyFn, micro_batch_loss, policy_fn
from rlfleet.trainer.losses.inputs import LossInputs, StepNorm
from rlfleet.trainer.losses.objective import PolicyLoss

__all__ = ["LOSSES", "LossInputs", "PolicyFn", "PolicyLoss", "StepNorm", "micro_batch_loss", "policy_fn"]
