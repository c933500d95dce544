import pytest

from rlfleet.orchestrator.envs import Prompt, RepeatEnv, get_env


def test_prompts_deterministic_per_seed_step_split():
    env = RepeatEnv()
    a = env.prompts(step=3, count=16, seed=7)
    b = RepeatEnv().prompts(step=3, count=16, seed=7, split="train")
    assert a == b
    assert [p.uid for p in a] == [f"train-3-{i}" for i in range(16)]


def test_prompts_differ_across_steps_seeds_and_splits():
    env = RepeatEnv()
    base = [p.text for p in env.prompts(step=0, count=16, seed=0)]
    assert [p.text for p in env.prompts(step=1, count=16, seed=0)] != base
    assert [p.text for p in env.prompts(step=0, count=16, seed=1)] != base
    assert [p.text for p in env.prompts(step=0, count=16, seed=0, split="eval")] != base


def test_prompt_shape():
    env = RepeatEnv(alphabet="xyz", min_len=4, max_len=8)
    for p in env.prompts(step=0, count=50, seed=0):
        assert p.answer in "xyz"
        assert 4 <= len(p.text) <= 8
        assert p.text == p.answer * len(p.text)


@pytest.mark.parametrize(
    ("completion", "max_tokens", "expected"),
    [
        ("aaXa", 4, 0.75),
        ("aaaa", 4, 1.0),
        ("", 4, 0.0),
        ("aa", 4, 0.5),  # short completion: still divided by max_tokens
        ("aaXaaaaa", 4, 0.75),  # truncated to max_tokens
        ("XXXXaaaa", 4, 0.0),
    ],
)
def test_reward_fraction_of_matching_chars(completion, max_tokens, expected):
    prompt = Prompt(uid="u", text="aaaa", answer="a")
    assert RepeatEnv().reward(prompt, completion, max_tokens) == pytest.approx(expected)


def test_get_env():
    assert isinstance(get_env("repeat"), RepeatEnv)
    with pytest.raises(ValueError, match="unknown environment"):
        get_env("nope")
