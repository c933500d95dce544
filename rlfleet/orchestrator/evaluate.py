"""Evaluation: each eval env's examples through running vLLM servers, by the same generate-and-score
path as training rollouts.

Used by the `eval` flow (a checkpoint on its own servers) and by RL runs every `eval.interval`
steps (the run's own servers, between steps). An eval env reads its own dataset/split; `repeat`
draws from its `eval` split, which never overlaps the training stream. A sample passes when its
reward is >= 1.0; pass@k is the unbiased estimator over `rollouts_per_example` = n samples.
"""

from __future__ import annotations

import statistics
from math import comb
from typing import Any

from rlfleet.config.envs import env_name
from rlfleet.config.rollouts import EvalConfig
from rlfleet.orchestrator.envs import build_env
from rlfleet.orchestrator.generate import SamplingParams, generate, raise_if_none_scored
from rlfleet.orchestrator.rollout import load_tokenizer
from rlfleet.orchestrator.sampler import Replicas
from rlfleet.progress import Progress


def pass_at_k(n: int, c: int, k: int) -> float:
    """P(at least one of k samples drawn from n, c of them correct, is correct)."""
    return 1.0 if n - c < k else 1.0 - comb(n - c, k) / comb(n, k)


def evaluate(
    replicas: Replicas,
    tokenizer_path: str,
    cfg: EvalConfig,
    max_model_len: int,
    progress: Progress | None = None,  # a run's: its stall watchdog sees the eval's tokens
) -> dict[str, Any]:
    tok = load_tokenizer(tokenizer_path)
    per_env = []
    for env_cfg in cfg.env:
        env = build_env(env_cfg)
        n = env_cfg.rollouts_per_example or cfg.rollouts_per_example
        examples = env.eval_examples(env_cfg.num_examples or cfg.num_examples)
        params = SamplingParams(n, cfg.max_tokens, cfg.temperature, cfg.stall_timeout_s, max_model_len)
        groups = generate(env, examples, params, tok, replicas, progress)
        raise_if_none_scored([t.error for g in groups for t in g])
        rewards = [t.reward for g in groups for t in g]
        passes = [sum(t.reward >= 1.0 for t in g) for g in groups]
        per_env.append(
            {
                "env": env_name(env_cfg),
                "num_examples": len(examples),
                "rollouts_per_example": n,
                "num_samples": len(rewards),
                "mean_reward": statistics.fmean(rewards),
                "pass@1": statistics.fmean(pass_at_k(n, c, 1) for c in passes),
                f"pass@{n}": statistics.fmean(pass_at_k(n, c, n) for c in passes),
                "reward_errors": sum(t.error is not None for g in groups for t in g),
            }
        )
    samples = sum(e["num_samples"] for e in per_env)
    return {
        "envs": per_env,
        "num_samples": samples,
        "mean_reward": sum(e["mean_reward"] * e["num_samples"] for e in per_env) / samples,
        "pass_rate": sum(e["pass@1"] * e["num_samples"] for e in per_env) / samples,
        "temperature": cfg.temperature,
    }
