"""`[advantage]`: how the orchestrator turns each group's rewards into per-sample advantages."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from rlfleet.config.base import Strict


class AdvantageConfig(Strict):
    """One estimator per type (rlfleet/orchestrator/advantages.py); the default is today's GRPO."""

    type: Literal["grpo", "rloo", "reinforce_pp"] = Field(
        "grpo",
        description="grpo: (r - group mean) / group std; rloo: r - mean of the group's others; "
        "reinforce_pp: r - baseline, then normalized over the whole batch (REINFORCE++).",
    )
    std_normalize: bool = Field(
        True, description="grpo: divide by the group's std (false: Dr.GRPO's mean-only advantages)."
    )
    baseline: Literal["group", "batch"] = Field(
        "group", description="reinforce_pp: subtract the group's mean reward or the whole batch's."
    )
