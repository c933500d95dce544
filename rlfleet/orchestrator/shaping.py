"""Batch shaping (DAPO, Yu et al. 2025), the rules: overlong samples and groups without signal.

The rollout stream applies them where a group finishes, before the group is buffered, so the
buffered and published records carry the reward and loss mask that train, and dynamic sampling
judges a group by the reward its advantages come from: a soft punishment that tells a group's
samples apart gives it signal. The stream's books (orchestrator/buffer.py) own the refill bookkeeping.
"""

from __future__ import annotations

import statistics
from typing import Any

from rlfleet.config.shaping import ShapingConfig


def overlong_penalty(length: int, max_tokens: int, buffer: int) -> float:
    """DAPO eq. 13 (soft overlong punishment), L_max = max_tokens, L_cache = buffer: 0 up to
    L_max - L_cache, then falling linearly to -1 at L_max, -1 beyond."""
    start = max_tokens - buffer
    if length <= start:
        return 0.0
    if length <= max_tokens:
        return (start - length) / buffer
    return -1.0


def sampled_len(record: dict[str, Any]) -> int:
    """Tokens of the sample's longest model turn: each turn is sampled with its own max_tokens."""
    turns = [t["end"] - t["start"] for t in record["turns"] if "end" in t]
    return max(turns, default=sum(record["loss_mask"]))


def cut(record: dict[str, Any]) -> bool:
    """The sample was stopped before it ended: a model turn ran into max_tokens (vLLM's
    finish_reason "length"), or the conversation into max_model_len (`truncated`)."""
    return record["truncated"] or any(t.get("finish_reason") == "length" for t in record["turns"])


def shape_overlong(records: list[dict[str, Any]], cfg: ShapingConfig, max_tokens: int) -> None:
    """In place. mask: a cut sample leaves the loss (its loss_mask zeroed; its reward still counts
    in the group's advantages). soft: every sample's reward += overlong_penalty(its length).
    Records already shaped (`overlong` set: a buffered group restored) are left as they are."""
    if cfg.overlong == "none":
        return
    for r in records:
        if "overlong" in r:
            continue
        r["overlong"] = cut(r)
        if cfg.overlong == "mask" and r["overlong"]:
            r["loss_mask"] = [0] * len(r["loss_mask"])
        elif cfg.overlong == "soft":
            assert cfg.overlong_buffer is not None  # the config's validator
            r["overlong_penalty"] = overlong_penalty(sampled_len(r), max_tokens, cfg.overlong_buffer)
            r["reward"] += r["overlong_penalty"]


def informative(records: list[dict[str, Any]]) -> bool:
    """A group whose rewards all equal has zero advantages under every estimator: no signal."""
    rewards = [r["reward"] for r in records]
    return min(rewards) != max(rewards)


def step_shaping(
    records: list[dict[str, Any]], cfg: ShapingConfig, dropped: int, refilled: int, held: int
) -> dict[str, Any]:
    """A step's shaping numbers (its manifest's `shaping`, the step record, wandb's `rollout/`)."""
    out: dict[str, Any] = {}
    if cfg.dynamic_sampling:
        out |= {"dropped_zero_variance": dropped, "refilled": refilled, "zero_variance_groups": held}
    if cfg.overlong != "none":
        out["overlong"] = sum(bool(r.get("overlong")) for r in records)
    if cfg.overlong == "soft":
        out["overlong_penalty_mean"] = statistics.fmean(r.get("overlong_penalty", 0.0) for r in records)
    return out
