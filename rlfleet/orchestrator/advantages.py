"""GRPO group-normalized advantages."""

from __future__ import annotations

import math
from collections.abc import Sequence


def grpo_advantages(group_rewards: Sequence[Sequence[float]], eps: float = 1e-6) -> list[list[float]]:
    """(r - mean(group)) / (std(group) + eps), population std, one list per group.

    A group whose samples all scored the same gets zero advantages: it carries no signal.
    """
    out = []
    for rewards in group_rewards:
        n = len(rewards)
        mean = sum(rewards) / n
        std = math.sqrt(sum((r - mean) ** 2 for r in rewards) / n)
        out.append([(r - mean) / (std + eps) for r in rewards])
    return out
