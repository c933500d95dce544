"""The learning-rate schedule: torch's LambdaLR over `lr_factor`, a pure function of the step.

Because the factor depends on the step alone, a resumed trainer rebuilds the scheduler at its
start step (`make_scheduler(..., start)`) and gets exactly the lr an uninterrupted run has there;
nothing about the schedule needs to be in the checkpoint.
"""

from __future__ import annotations

import math
from functools import partial

import torch
from torch.optim.lr_scheduler import LambdaLR

from rlfleet.config.schedule import LRScheduleConfig


def lr_factor(cfg: LRScheduleConfig, max_steps: int, step: int) -> float:
    """lr / base lr at `step` (0-based): (step + 1) / warmup_steps during warm-up, then constant,
    or a linear / cosine decay that would reach min_lr_ratio at step `max_steps`, one past the last
    (as transformers' schedules do): the last step still learns when min_lr_ratio is 0."""
    if step < cfg.warmup_steps:
        return (step + 1) / cfg.warmup_steps
    if cfg.decay == "constant":
        return 1.0
    progress = min((step - cfg.warmup_steps) / max(max_steps - cfg.warmup_steps, 1), 1.0)
    shape = 1.0 - progress if cfg.decay == "linear" else 0.5 * (1.0 + math.cos(math.pi * progress))
    return cfg.min_lr_ratio + (1.0 - cfg.min_lr_ratio) * shape


def make_scheduler(
    optimizer: torch.optim.Optimizer, lr: float, cfg: LRScheduleConfig, max_steps: int, start: int = 0
) -> LambdaLR:
    """A scheduler whose optimizer holds step `start`'s lr now; call `.step()` after each step.

    The base is the config's `lr`, also after a resume (an optimizer state loaded from a
    checkpoint carries the lr of the step it was saved at, which this overwrites)."""
    for group in optimizer.param_groups:
        group["initial_lr"] = lr
    return LambdaLR(optimizer, partial(lr_factor, cfg, max_steps), last_epoch=start - 1)
