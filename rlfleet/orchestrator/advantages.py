"""Per-sample advantages from each group's rewards, one function per `[advantage] type`."""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence

from rlfleet.config.advantage import AdvantageConfig

Groups = Sequence[Sequence[float]]


def grpo_advantages(
    group_rewards: Groups, eps: float = 1e-6, std_normalize: bool = True
) -> list[list[float]]:
    """(r - mean(group)) / (std(group) + eps), population std, one list per group (DeepSeekMath
    eq. 3's outcome supervision); std_normalize=False: r - mean(group) (Dr.GRPO).

    A group whose samples all scored the same gets zero advantages: it carries no signal.
    """
    out = []
    for rewards in group_rewards:
        n = len(rewards)
        mean = sum(rewards) / n
        if not std_normalize:
            out.append([r - mean for r in rewards])
            continue
        std = math.sqrt(sum((r - mean) ** 2 for r in rewards) / n)
        out.append([(r - mean) / (std + eps) for r in rewards])
    return out


def rloo_advantages(group_rewards: Groups) -> list[list[float]]:
    """r_i - mean of the group's other rewards (REINFORCE leave-one-out, Ahmadian et al. 2024);
    a group of one has no baseline and gets 0."""
    out = []
    for rewards in group_rewards:
        n, total = len(rewards), sum(rewards)
        out.append([r - (total - r) / (n - 1) if n > 1 else 0.0 for r in rewards])
    return out


def reinforce_pp_advantages(
    group_rewards: Groups, baseline: str = "group", eps: float = 1e-6
) -> list[list[float]]:
    """REINFORCE++ (Hu et al. 2025): r - the group's (or the batch's) mean reward, then normalised
    over the whole batch: (a - mean(a)) / (std(a) + eps), population std."""
    flat = [r for g in group_rewards for r in g]
    batch_mean = statistics.fmean(flat)
    centred = [
        [r - (statistics.fmean(g) if baseline == "group" else batch_mean) for r in g] for g in group_rewards
    ]
    values = [a for g in centred for a in g]
    mean = statistics.fmean(values)
    std = math.sqrt(sum((a - mean) ** 2 for a in values) / len(values))
    return [[(a - mean) / (std + eps) for a in g] for g in centred]


ADVANTAGES: dict[str, Callable[[Groups, AdvantageConfig], list[list[float]]]] = {
    "grpo": lambda g, c: grpo_advantages(g, std_normalize=c.std_normalize),
    "rloo": lambda g, c: rloo_advantages(g),
    "reinforce_pp": lambda g, c: reinforce_pp_advantages(g, c.baseline),
}


def advantages(group_rewards: Groups, cfg: AdvantageConfig | None = None) -> list[list[float]]:
    """The configured estimator's advantages, one list per group (default: GRPO's)."""
    cfg = cfg or AdvantageConfig()
    return ADVANTAGES[cfg.type](group_rewards, cfg)
