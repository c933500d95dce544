"""Evaluation: an environment's eval split through running vLLM servers, scored by its reward.

Used by the `eval` flow (a checkpoint on its own servers) and by RL runs every `eval.interval`
steps (the run's own servers, between steps). The eval prompts come from the `eval` split, so
they never overlap the training stream.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any

from rlfleet.config.models import EvalConfig
from rlfleet.orchestrator.envs import get_env
from rlfleet.orchestrator.rollout import load_tokenizer, prompt_ids, sample_with_healing


def evaluate(
    healthy_urls: Callable[[], list[str]], tokenizer_path: str, cfg: EvalConfig, seed: int
) -> dict[str, Any]:
    env = get_env(cfg.env)
    tok = load_tokenizer(tokenizer_path)
    prompts = env.prompts(0, cfg.num_prompts, seed, split="eval")
    ids = [prompt_ids(tok, p, env.chat) for p in prompts]
    groups = sample_with_healing(
        healthy_urls, ids, cfg.samples_per_prompt, cfg.max_tokens, cfg.temperature, cfg.request_timeout_s
    )
    rewards = [
        env.reward(p, s.text, cfg.max_tokens)
        for p, samples in zip(prompts, groups, strict=True)
        for s in samples
    ]
    return {
        "env": cfg.env,
        "num_prompts": cfg.num_prompts,
        "num_samples": len(rewards),
        "mean_reward": statistics.fmean(rewards),
        "pass_rate": sum(r >= 1.0 for r in rewards) / len(rewards),
        "temperature": cfg.temperature,
    }
