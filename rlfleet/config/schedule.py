"""`[trainer.lr_schedule]`: linear warm-up, then a constant, linear or cosine learning rate."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from rlfleet.config.base import Strict


class LRScheduleConfig(Strict):
    """lr x factor(step) (rlfleet/trainer/schedule.py); the run's `max_steps` is the decay's end.
    `lr_schedule = "cosine"` is shorthand for `[trainer.lr_schedule] decay = "cosine"`."""

    decay: Literal["constant", "linear", "cosine"] = Field(
        "constant",
        description="After warm-up: hold lr, or decay it toward lr x min_lr_ratio, reached one step past the last.",
    )
    warmup_steps: int = Field(0, ge=0, description="Steps 0..k-1 ramp linearly to lr: lr x (step + 1) / k.")
    min_lr_ratio: float = Field(
        0.0, ge=0.0, le=1.0, description="linear/cosine: lr / lr at step max_steps (one past the last)."
    )

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, data: Any) -> Any:
        return {"decay": data} if isinstance(data, str) else data
