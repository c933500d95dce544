"""`type = "reasoning_gym"`: procedural prompts that are a function of (seed, step), scored by
reasoning-gym's own code, and every bad dataset name or config field refused in preflight by field."""

from __future__ import annotations

import asyncio
import re

import pytest

from rlfleet.config.models import RLConfig
from rlfleet.orchestrator.envs import build_env, check_envs
from rlfleet.orchestrator.envs.base import Trajectory
from rlfleet.orchestrator.envs.reasoning_gym_env import extract

ADD1 = {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1, "operators": ["+"]}


def config(datasets, **args) -> RLConfig:
    env = {"type": "reasoning_gym", "args": {"datasets": datasets, "size": 64, **args}}
    return RLConfig.model_validate({"model": {"path": "unused"}, "orchestrator": {"env": [env]}})


def score(env, example, completion: str) -> tuple[float, dict[str, float]]:
    return asyncio.run(env.score(Trajectory(example, [1], 1, turns=[{"text": completion}])))


def test_stream_mixes_datasets_by_weight_and_repeats_for_a_seed_and_step():
    cfg = config(
        [{"name": "basic_arithmetic", "weight": 3, "config": ADD1}, {"name": "chain_sum", "weight": 1}],
        answer_format="plain",
    )
    assert cfg.orchestrator.env[0].args.datasets[0].config == ADD1
    env = build_env(cfg.orchestrator.env[0])
    first = env.examples(step=2, count=16, seed=0)
    assert first == env.examples(step=2, count=16, seed=0)
    assert first != env.examples(step=3, count=16, seed=0)
    sources = [e.info["dataset"] for e in env.examples(step=0, count=64, seed=0)]
    assert sources.count("basic_arithmetic") > sources.count("chain_sum") > 0
    # eval is drawn with its own seed: not the training pool's first examples
    assert [e.prompt for e in env.eval_examples(8)] != [env._example("train", i).prompt for i in range(8)]
    assert env.system_prompt is None and first[0].prompt[0]["role"] == "user"


def test_the_datasets_own_scorer_grades_the_extracted_answer():
    env = build_env(config([{"name": "basic_arithmetic", "config": ADD1}]).orchestrator.env[0])
    ex = env.examples(0, 1, 0)[0]
    assert (
        ex.prompt[0] == {"role": "system", "content": env.system_prompt} and "<answer>" in env.system_prompt
    )
    assert score(env, ex, f"thinking... <answer>{ex.answer}</answer>") == (1.0, {"answered": 1.0})
    assert score(env, ex, ex.answer) == (0.0, {"answered": 0.0})  # no tag: no answer
    wrong = str(int(ex.answer) + 1)
    assert score(env, ex, f"<answer>{wrong}</answer>")[0] < 1.0
    assert extract(f" {ex.answer}\n", "plain") == ex.answer


@pytest.mark.parametrize(
    ("datasets", "message"),
    [
        (
            [{"name": "basic_arithmetik"}],
            r"datasets\.0\.name: no reasoning-gym dataset 'basic_arithmetik'; valid: \[.*'basic_arithmetic'",
        ),
        (
            [{"name": "chain_sum", "config": {"min_term": 2}}],
            r"datasets\.0\.config: chain_sum has no field \['min_term'\]; fields: \[.*'min_terms'",
        ),
        (
            [{"name": "chain_sum"}, {"name": "chain_sum", "config": {"min_terms": 0}}],
            r"datasets\.1\.config: chain_sum: AssertionError: min_terms must be positive",
        ),
    ],
)
def test_bad_datasets_are_refused_naming_the_field(datasets, message):
    problems = check_envs(config(datasets).orchestrator.env, "orchestrator.env")
    assert len(problems) == 1 and problems[0].startswith("orchestrator.env.0.args.datasets."), problems
    assert re.search(message, problems[0]), problems
