"""A user's own task end to end, on one real vLLM (CPU) + trainer + Prefect API run.

One run carries every env type at once (a python env with several turns, a python env whose
reward functions raise or hang on some samples, a verifiers taskset), a model given by hub id
and resolved from a local offline cache, and eval envs with their own datasets: each vLLM CPU
start costs ~40 s, so the checks share it.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from rlfleet.orchestrator.rollout import read_rollout
from rlfleet.store import RunStore
from tests.helpers import rl_config

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[1]

TASK = """
import time

def exact(completion, answer):
    return float(completion.strip() == answer)

def graded(completion, answer, level, state):
    return {"score": float(answer in completion), "turns": state["num_turns"], "level": level}

def flaky(completion, info):
    if info["level"] == 1:
        raise ValueError("level 1 is not graded")
    if info["level"] == 2:
        time.sleep(3600)
    return 0.5

def again(state):
    return None if state["num_turns"] >= 3 else "Again, shorter."

def lookup() -> str:
    '''Look the answer up.'''
    return "7"

def answered(completion, state):
    return float(bool(state["tool_calls"]) and completion.strip() == "7")
"""


def tool_caller(base: Path, out: Path) -> Path:
    """The tiny model SFT'd (in process, seconds) to open with a `lookup` tool call and then answer,
    so the rollouts below really sample tool calls from vLLM."""
    from rlfleet.config.models import SFTConfig
    from rlfleet.trainer.sft import run_sft

    call = {"type": "function", "function": {"name": "lookup", "arguments": {}}}
    schema = {"type": "function", "function": {"name": "lookup", "description": "Look the answer up."}}
    rows = [
        {
            "tools": [schema],
            "messages": [
                {"role": "user", "content": f"{i}+1="},
                {"role": "assistant", "content": "", "tool_calls": [call]},
                {"role": "tool", "content": "7"},
                {"role": "assistant", "content": "7"},
            ],
        }
        for i in range(32)
    ]
    data = out.parent / "tool_sft.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = SFTConfig.model_validate(
        {
            "output_dir": str(out),
            "max_steps": 40,
            "model": {"path": str(base)},
            "data": {"path": str(data), "batch_size": 16, "micro_batch_size": 16, "max_seq_len": 96},
            "trainer": {"lr": 3e-3, "checkpoint_interval": 40, "num_threads": 1},
        }
    )
    return Path(run_sft(cfg, progress=False)["weights"])


def hub_cache(root: Path, model: Path, repo: str) -> Path:
    """A Hugging Face hub cache holding `model` as `repo` (what a download would have left)."""
    entry = root / f"models--{repo.replace('/', '--')}"
    revision = "0123456789abcdef0123456789abcdef01234567"
    shutil.copytree(model, entry / "snapshots" / revision)
    (entry / "refs").mkdir()
    (entry / "refs" / "main").write_text(revision)
    return root


def test_own_tasks_train_and_eval(tiny_model, prefect_api, tmp_path, monkeypatch):
    from huggingface_hub import constants

    from rlfleet.flows.rl import rl

    rows = [{"question": f"{i}+1=", "answer": str(i + 1), "level": i % 3} for i in range(30)]
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "eval.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[:5]))
    (tmp_path / "task.py").write_text(TASK)
    model = tool_caller(tiny_model, tmp_path / "sft")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(hub_cache(tmp_path / "hub", model, "rlfleet/tiny")))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)  # what HF_HUB_OFFLINE=1 sets at import
    monkeypatch.chdir(tmp_path)
    taskset = REPO / "examples/verifiers/arith_taskset.py"
    (tmp_path / "envs.toml").write_text(
        f"""
[[orchestrator.env]]
name = "talk"
type = "python"
[orchestrator.env.args]
dataset = "train.jsonl"
prompt_column = "question"
rewards = ["task.py:exact", {{ fn = "task.py:graded", weight = 0.5 }}]
env_response = "task.py:again"
max_turns = 3

[[orchestrator.env]]
name = "flaky"
type = "python"
[orchestrator.env.args]
dataset = "train.jsonl"
prompt_column = "question"
rewards = ["task.py:flaky"]
reward_timeout_s = 1.0
shuffle = false

[[orchestrator.env]]
name = "calc"
type = "python"
[orchestrator.env.args]
dataset = "train.jsonl"
prompt_column = "question"
rewards = ["task.py:answered"]
tools = ["task.py:lookup"]
max_turns = 2

[[orchestrator.env]]
name = "vf"
type = "verifiers"
[orchestrator.env.args]
module = "{taskset}"
kwargs = {{ num_tasks = 20 }}
max_turns = 2

[eval]
interval = 2
temperature = 1.0
num_examples = 4

[[eval.env]]
name = "talk-eval"
type = "python"
rollouts_per_example = 2
[eval.env.args]
dataset = "eval.jsonl"
prompt_column = "question"
rewards = ["task.py:exact"]

[[eval.env]]
name = "vf-eval"
type = "verifiers"
[eval.env.args]
module = "{taskset}"
kwargs = {{ split = "eval", num_tasks = 4 }}
"""
    )
    out = tmp_path / "run"
    overrides = {
        "orchestrator.batch-size": "8",
        "orchestrator.max-tokens": "64",  # a tool call is 59 characters of the character-level model
        "inference.max-model-len": "512",
        "model.path": "rlfleet/tiny",
    }
    cfg = rl_config(tiny_model, out, max_steps=2, files=(tmp_path / "envs.toml",), **overrides)
    state = rl(config=cfg, return_state=True)
    assert state.is_completed(), state
    store = RunStore(out)
    tok = AutoTokenizer.from_pretrained(model)

    # The hub id became the cached snapshot in every written sub-config.
    assert "snapshots/0123456789abcdef" in (out / "configs/trainer.toml").read_text()

    records = read_rollout(store, 1)
    by_env = {e: [r for r in records if r["env"] == e] for e in ("talk", "flaky", "calc", "vf")}
    assert {e: len(rs) for e, rs in by_env.items()} == {"talk": 8, "flaky": 8, "calc": 8, "vf": 8}  # 2 x 4

    # Tools: vLLM sampled the call, the tool ran, its result is context (mask 0) for the next turn.
    # The tiny model samples at temperature 1, so a call may misspell the tool: that one is
    # answered with a named error, as context, and the rollout goes on.
    calls = [r for r in by_env["calc"] if r["turns"][0].get("tool_calls")]
    called = [r for r in calls if r["turns"][0]["tool_calls"][0]["name"] == "lookup"]
    assert called, [r["completion"] for r in by_env["calc"]]
    for r in calls:
        (call,) = r["turns"][0]["tool_calls"]
        if call["name"] != "lookup":
            assert call["error"] == f"unknown tool {call['name']!r}; tools: ['lookup']"
            assert call["result"] == f"error: {call['error']}"
    for r in called:
        assert r["turns"][0]["tool_calls"] == [
            {"name": "lookup", "arguments": {}, "result": "7", "error": None}
        ]
        assert [m["role"] for m in r["messages"]][:4] == ["user", "assistant", "tool", "assistant"]
        first, second = r["turns"]
        between = r["input_ids"][first["end"] : second["start"]]
        assert tok.decode(between).endswith("<tool>7\n<assistant>")
        assert not any(r["loss_mask"][first["end"] : second["start"]])
        assert r["reward"] == float(second["text"].strip() == "7")

    # Multi-turn: the mask is 1 exactly on the model's tokens; each turn's ids extend the last.
    for r in by_env["talk"] + by_env["calc"]:
        mask, turns = r["loss_mask"], r["turns"]
        assert len(r["input_ids"]) == len(mask) == len(r["logprobs"])
        sampled = {i for t in turns for i in range(t["start"], t["end"])}
        assert {i for i, m in enumerate(mask) if m} == sampled
        assert all(lp == 0.0 for i, lp in enumerate(r["logprobs"]) if i not in sampled)
        assert all(
            a["end"] <= b["start"] for a, b in zip(turns, turns[1:], strict=False)
        )  # env tokens between
        assert [m["role"] for m in r["messages"]][:2] == ["user", "assistant"]
    assert max(len(r["turns"]) for r in by_env["talk"]) == 3  # env_response answered twice
    for r in by_env["talk"]:
        ids, turns = r["input_ids"], r["turns"]
        for t in turns:  # the ids trained on are the ones vLLM sampled for that turn's text
            assert tok.decode(ids[t["start"] : t["end"]], skip_special_tokens=True) == t["text"]
        for a, b in zip(turns, turns[1:], strict=False):  # turn t+1's prompt = turn t's ids + the reply
            assert tok.decode(ids[a["end"] : b["start"]]).endswith("<user>Again, shorter.\n<assistant>")

    # Reward functions that raise or hang score 0 and are counted, with the error; the step goes on.
    errors = {}
    for s in (0, 1):  # rows in order: levels 0, 1 in step 0 and 2, 0 in step 1
        for r in read_rollout(store, s):
            if r["env"] == "flaky":
                level = int(r["example_uid"].rsplit("-", 1)[1]) % 3
                errors.setdefault(level, set()).add(r["error"])
                assert r["reward"] == (0.5 if level == 0 else 0.0)
    assert errors == {
        0: {None},
        1: {"reward task.py:flaky ValueError: level 1 is not graded"},
        2: {"reward task.py:flaky timed out"},
    }
    step = store.read_json("steps/step_1.json")
    assert step["reward_errors"] == sum(r["error"] is not None for r in records) > 0
    assert {"talk/exact", "talk/graded/turns", "vf/exact_match", "vf/num_turns"} <= set(step["env_metrics"])

    # The verifiers taskset was scored by its own rewards on our token-level trajectories.
    assert all(set(r["metrics"]) == {"exact_match", "num_turns"} for r in by_env["vf"])
    assert all(r["reward"] in (0.0, 1.0) for r in by_env["vf"])

    # Eval at step 1 (interval 2): each eval env on its own data, pass@k with k = its rollouts.
    ev = store.read_json("evals/step_1.json")
    envs = {e["env"]: e for e in ev["envs"]}
    assert envs["talk-eval"]["num_examples"] == 4 and envs["talk-eval"]["num_samples"] == 8
    assert "pass@2" in envs["talk-eval"] and envs["vf-eval"]["num_samples"] == 4
    assert 0.0 <= ev["pass_rate"] <= 1.0
