"""`[orchestrator.shaping]`: which groups and samples a step trains on (DAPO's batch shaping).

Both rules run where a group finishes, in the rollout stream (rlfleet/orchestrator/shaping.py):
dynamic sampling keeps groups whose rewards all equal (no GRPO signal) out of the buffer and
samples more prompts in their place; overlong handling masks or penalises samples cut at
`max_tokens`. Off by default: the stream then behaves as it did before this section existed.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from rlfleet.config.base import Strict


class ShapingConfig(Strict):
    """Which groups and samples a step trains on (DAPO's batch shaping); off by default."""

    dynamic_sampling: bool = Field(
        False,
        description="Groups whose rewards all equal are held aside and replaced by new prompts "
        "(DAPO's dynamic sampling), up to max_refill extra groups per step.",
    )
    max_refill: int | None = Field(
        None,
        ge=0,
        description="dynamic_sampling: extra groups a step may sample in place of dropped ones; once "
        "spent, the step is filled with held zero-variance groups. Unset = batch_size.",
    )
    overlong: Literal["none", "mask", "soft"] = Field(
        "none",
        description="Samples cut at max_tokens: none (trained as they are), mask (out of the loss, "
        "DAPO's overlong filtering) or soft (DAPO's soft overlong punishment, eq. 13).",
    )
    overlong_buffer: int | None = Field(
        None,
        ge=1,
        description="overlong = soft: the punishment zone L_cache, in tokens below max_tokens.",
    )

    @model_validator(mode="after")
    def _options(self) -> ShapingConfig:
        if self.max_refill is not None and not self.dynamic_sampling:
            raise ValueError("max_refill applies only with dynamic_sampling = true")
        if self.overlong == "soft" and self.overlong_buffer is None:
            raise ValueError("overlong = 'soft' needs overlong_buffer (DAPO's L_cache, in tokens)")
        if self.overlong != "soft" and self.overlong_buffer is not None:
            raise ValueError(f"overlong_buffer applies only with overlong = 'soft' (got {self.overlong!r})")
        return self

    def refill_cap(self, batch_size: int) -> int:
        """Extra groups a step may sample in place of dropped ones."""
        return batch_size if self.max_refill is None else self.max_refill

    def check(self, max_tokens: int) -> None:
        """What needs the orchestrator's other keys (called from its validator)."""
        if self.overlong_buffer is not None and self.overlong_buffer >= max_tokens:
            raise ValueError(
                f"shaping.overlong_buffer ({self.overlong_buffer}) must be below max_tokens "
                f"({max_tokens}): the punishment starts at max_tokens - overlong_buffer"
            )
