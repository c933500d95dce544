"""Environments without a server: prompt streams, reward injection and containment, chat turns."""

from __future__ import annotations

import asyncio
import json

import pytest

from rlfleet.chat import continuation_ids, parse_assistant, prompt_ids
from rlfleet.config.envs import PythonArgs, RepeatArgs, split_counts
from rlfleet.orchestrator.envs import Trajectory
from rlfleet.orchestrator.envs.base import RewardError
from rlfleet.orchestrator.envs.python_env import PythonEnv
from rlfleet.orchestrator.envs.repeat import RepeatEnv, reward
from rlfleet.orchestrator.envs.tools import python_tools, run_tool_calls
from rlfleet.orchestrator.evaluate import pass_at_k
from rlfleet.trainer.tiny import build_tokenizer
from rlfleet.usercode import UserFn, load_object


def test_repeat_stream_is_a_function_of_seed_and_step():
    env = RepeatEnv()
    a = env.examples(step=3, count=16, seed=7)
    assert a == RepeatEnv().examples(step=3, count=16, seed=7)
    assert [e.uid for e in a] == [f"train-3-{i}" for i in range(16)]
    assert [e.prompt for e in env.examples(4, 16, 7)] != [e.prompt for e in a]
    assert {e.uid for e in env.eval_examples(16)}.isdisjoint({e.uid for e in a})
    for e in RepeatEnv(RepeatArgs(alphabet="xyz", min_len=4, max_len=8)).examples(0, 50, 0):
        assert e.answer in "xyz" and 4 <= len(e.prompt) <= 8 and e.prompt == e.answer * len(e.prompt)


@pytest.mark.parametrize(
    ("completion", "max_tokens", "expected"),
    [
        ("aaXa", 4, 0.75),
        ("aaaa", 4, 1.0),
        ("", 4, 0.0),
        ("aa", 4, 0.5),
        ("aaXaaaaa", 4, 0.75),
        ("XXXXaaaa", 4, 0.0),
    ],
)
def test_repeat_reward_is_the_fraction_of_matching_chars(completion, max_tokens, expected):
    assert reward("a", completion, max_tokens) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("completion", "expected"), [("aaXa", 0.75), ("aa", 1.0), ("", 0.0), ("aaXaaaaa", 0.875)]
)
def test_repeat_reward_per_completion_ignores_length(completion, expected):
    """per="completion" (the long-tail benchmark's job): RL must not be paid to run to max_tokens."""
    assert reward("a", completion, 4, per="completion") == pytest.approx(expected)


def test_split_counts_follow_weights_and_sum_to_total():
    assert split_counts([1.0], 16) == [16]
    assert split_counts([3.0, 1.0], 16) == [12, 4]
    assert split_counts([1.0, 1.0, 1.0], 16) == [6, 5, 5]
    assert sum(split_counts([0.2, 0.5, 0.3], 7)) == 7


TASK = '''
import asyncio, threading

def exact(completion, answer):
    return float(completion.strip() == answer)

async def graded(completion, answer, level, state):
    return {"score": 0.5, "level": level, "turns": state["num_turns"]}

def needs_secret(completion, secret):
    return 1.0

def boom(completion):
    raise ValueError("kaboom")

HANG = {"entered": threading.Event(), "release": threading.Event(), "returned": threading.Event()}

def hang(completion):
    HANG["entered"].set()
    HANG["release"].wait(60)  # a safety net: the test releases it once the score has given up
    HANG["returned"].set()

def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: the first
        b: the second
    """
    return a + b

def undocumented(a, b):
    return a
'''


@pytest.fixture
def task_dir(tmp_path, monkeypatch):
    (tmp_path / "task.py").write_text(TASK)
    rows = [{"question": f"{i}+1=", "answer": str(i + 1), "level": i % 3} for i in range(10)]
    (tmp_path / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    monkeypatch.chdir(tmp_path)  # references are relative to the cwd
    return tmp_path


def _env(**args) -> PythonEnv:
    base = {"dataset": "data.jsonl", "prompt_column": "question", "rewards": ["task.py:exact"]}
    return PythonEnv(PythonArgs(**{**base, **args}), "add")


def _traj(env: PythonEnv, text: str) -> Trajectory:
    ex = env.examples(0, 1, 0)[0]
    t = Trajectory(ex, [1, 2], 2, list(ex.prompt), max_tokens=8)
    t.extend([3, 4], [-0.1, -0.2])
    t.turns.append({"text": text})
    t.messages.append({"role": "assistant", "content": text})
    return t


def test_python_env_reads_rows_and_injects_arguments_by_name(task_dir):
    env = _env(
        rewards=["task.py:exact", {"fn": "task.py:graded", "weight": 2.0}],
        system_prompt="Be brief.",
        shuffle=False,
    )
    assert env.problems() == []
    ex = env.examples(0, 3, 0)[0]
    assert ex.prompt == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "0+1="}]
    assert ex.answer == "1" and ex.info == {"level": 0}
    t = _traj(env, " 1 ")
    score, metrics = asyncio.run(env.score(t))
    assert score == pytest.approx(1.0 + 2 * 0.5)  # weighted sum; a dict's `score` is its reward
    assert metrics == {"exact": 1.0, "graded": 0.5, "graded/level": 0.0, "graded/turns": 1.0}
    # Epochs are permutations: 10 rows in steps of 4 visit every row once per 10 draws.
    seen = [e.uid for s in range(5) for e in _env().examples(s, 4, seed=1)]
    assert sorted(seen[:10]) == sorted(f"add-{i}" for i in range(10))


def test_reward_that_raises_or_hangs_is_contained_and_named(task_dir):
    """A hanging reward ends the score at its timeout while it still runs: the score raised before
    the function returned (it returns only when the test releases it)."""
    for fn, expect in (
        ("task.py:boom", "task.py:boom ValueError: kaboom"),
        ("task.py:hang", "task.py:hang timed out"),
    ):
        env = _env(rewards=[fn], reward_timeout_s=0.5)
        with pytest.raises(RewardError, match=expect):
            asyncio.run(env.score(_traj(env, "x")))
    hang = load_object("task.py:HANG")
    assert hang["entered"].is_set() and not hang["returned"].is_set()
    hang["release"].set()
    assert hang["returned"].wait(60)


def test_problems_name_the_field(task_dir):
    assert _env(answer_column="solution").problems() == [
        "answer_column: no column 'solution' in data.jsonl; columns: ['question', 'answer', 'level']"
    ]
    (problem,) = _env(rewards=["task.py:needs_secret"]).problems()
    assert problem.startswith("rewards.0.fn: task.py:needs_secret needs ['secret']")


def test_tools_get_schemas_and_errors_go_back_to_the_model(task_dir):
    schemas, calls = python_tools(["task.py:add"], timeout_s=1)
    assert schemas[0]["function"]["name"] == "add"
    assert set(schemas[0]["function"]["parameters"]["properties"]) == {"a", "b"}
    message = parse_assistant(
        'ok <tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>'
        '<tool_call>{"name": "nope", "arguments": {}}</tool_call><tool_call>not json</tool_call>'
    )
    assert [c["function"]["name"] for c in message["tool_calls"]] == ["add", "nope"]
    replies, records = asyncio.run(run_tool_calls(message, calls))
    assert [r["content"] for r in replies] == ["5", "error: unknown tool 'nope'; tools: ['add']"]
    assert records[0]["arguments"] == {"a": 2, "b": 3} and records[1]["error"]
    with pytest.raises(ValueError, match="no tool schema"):
        python_tools(["task.py:undocumented"], timeout_s=1)


def test_user_fn_takes_only_its_parameters_and_times_out(task_dir):
    fn = UserFn("task.py:exact")
    assert fn.missing({"completion"}) == ["answer"]
    assert asyncio.run(fn(1.0, completion="2", answer="2", extra="ignored")) == 1.0
    with pytest.raises(TimeoutError):
        asyncio.run(UserFn("task.py:hang")(0.2, completion=""))


def test_continuation_ids_append_the_new_message_without_retokenizing_the_turn():
    tok = build_tokenizer(128)
    messages = [{"role": "user", "content": "hi"}]
    first = prompt_ids(tok, messages, [], chat=True)
    sampled = tok("yo", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    reply = [{"role": "user", "content": "again"}]
    ids = first + sampled + continuation_ids(tok, reply, [], tok.decode(sampled[-1:]))
    assert ids[: len(first) + len(sampled)] == first + sampled
    assert tok.decode(ids) == "<user>hi\n<assistant>yo</s>\n<user>again\n<assistant>"
    # the EOS the model sampled is the template's end of turn: it is not written twice
    assert ids.count(tok.eos_token_id) == 1


def test_pass_at_k():
    assert pass_at_k(4, 0, 1) == 0.0 and pass_at_k(4, 4, 1) == 1.0
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)
    assert pass_at_k(4, 1, 4) == 1.0
    assert pass_at_k(4, 2, 2) == pytest.approx(1 - 1 / 6)


def test_verifiers_taskset_tools_turns_and_scores():
    """An unchanged verifiers taskset: tool schemas from its toolset, a tool call answered in
    process, the next turn's ids appended, and its own reward and metric on the result."""
    from rlfleet.config.envs import VerifiersArgs
    from rlfleet.orchestrator.envs.verifiers_env import VerifiersEnv

    root = __import__("pathlib").Path(__file__).resolve().parents[1]
    env = VerifiersEnv(
        VerifiersArgs(module=str(root / "examples/verifiers/arith_taskset.py"), kwargs={"num_tasks": 5}), "vf"
    )
    tok = build_tokenizer(128)
    (ex,) = env.examples(step=0, count=1, seed=0)
    tools = env.tools_for(ex)
    assert [t["function"]["name"] for t in tools] == ["calc_add"]
    assert ex.prompt[-1]["role"] == "user" and ex.answer == str(eval(ex.prompt[-1]["content"].rstrip("=")))

    def run(texts: list[str]) -> tuple[float, dict, Trajectory]:
        ids = prompt_ids(tok, ex.prompt, tools, chat=True)
        assert tok.decode(ids).startswith("<tools>calc_add\n")
        t = Trajectory(ex, ids, len(ids), list(ex.prompt), max_tokens=64)
        for text in texts:
            start = len(t.ids)
            sampled = tok(text, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
            t.extend(sampled, [-0.5] * len(sampled))
            t.turns.append({"text": text, "start": start, "end": len(t.ids), "finish_reason": "stop"})
            t.messages.append(parse_assistant(text))
            reply = asyncio.run(env.respond(t))
            if reply:
                before = list(t.ids)
                t.messages += reply
                t.extend(continuation_ids(tok, reply, tools, tok.decode(t.ids[-1:])))
                assert t.ids[: len(before)] == before
        return *asyncio.run(env.score(t)), t

    assert run([ex.answer])[:2] == (1.0, {"exact_match": 1.0, "num_turns": 1.0})
    assert run(["12345"])[0] == 0.0
    call = '<tool_call>{"name": "calc_add", "arguments": {"a": 2, "b": 3}}</tool_call>'
    score, metrics, t = run([call, ex.answer])
    assert (score, metrics) == (1.0, {"exact_match": 1.0, "num_turns": 2.0})
    assert t.turns[0]["tool_calls"] == [
        {"name": "calc_add", "arguments": {"a": 2, "b": 3}, "result": "5", "error": None}
    ]
    assert "<tool>5\n<assistant>" in tok.decode(t.ids) and sum(t.mask) < len(t.ids)


def test_a_step_where_every_sample_failed_to_score_fails_with_the_first_error(task_dir):
    from rlfleet.errors import DeterministicError
    from rlfleet.orchestrator.generate import raise_if_none_scored

    env = _env()
    trajs = [_traj(env, "x") for _ in range(3)]
    for i, t in enumerate(trajs):
        t.error = f"reward task.py:boom ValueError: {i}"
    with pytest.raises(
        DeterministicError,
        match="every sample failed to score; first error: reward task.py:boom ValueError: 0",
    ):
        raise_if_none_scored([t.error for t in trajs])
    trajs[1].error = None
    raise_if_none_scored([t.error for t in trajs])  # one scored sample: the step goes on
