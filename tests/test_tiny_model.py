"""The tiny model rlfleet makes loads in transformers with its tokenizer and chat template."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from rlfleet.trainer.tiny import make_tiny_model


def test_tiny_model_loads_and_round_trips(tiny_model):
    tok = AutoTokenizer.from_pretrained(tiny_model)
    model = AutoModelForCausalLM.from_pretrained(tiny_model)
    text = "Hello, world!\n42 ~"
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert len(ids) == len(text) and tok.decode(ids) == text
    chat = tok.apply_chat_template(
        [{"role": "user", "content": "abc"}], add_generation_prompt=True, tokenize=False
    )
    assert chat == "<user>abc\n<assistant>"
    assert model.config.head_dim >= 32
    logits = model(input_ids=torch.tensor([ids])).logits
    assert logits.shape == (1, len(ids), model.config.vocab_size)
    assert all(tok.decode([i]) for i in range(model.config.vocab_size)), "every sampleable id decodes"


def test_filler_tokens_never_show_in_text(tiny_model):
    """Ids past the character set pad the vocab; as special tokens they decode to nothing in the
    text vLLM returns, so `<extra_N>`'s letters cannot score on the repeat task."""
    tok = AutoTokenizer.from_pretrained(tiny_model)
    fillers = [i for i in range(len(tok)) if tok.convert_ids_to_tokens(i).startswith("<extra_")]
    assert len(fillers) == 128 - 4 - 96
    a = tok("a", add_special_tokens=False)["input_ids"][0]
    assert tok.decode([a, *fillers[:3], a], skip_special_tokens=True) == "aa"
    assert tok("<extra_0>", add_special_tokens=False)["input_ids"] == [fillers[0]]  # never split into letters


def test_same_seed_same_weights(tmp_path):
    a = AutoModelForCausalLM.from_pretrained(make_tiny_model(tmp_path / "a", seed=1))
    b = AutoModelForCausalLM.from_pretrained(make_tiny_model(tmp_path / "b", seed=1))
    assert all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters(), strict=True))


def test_rejects_head_dim_below_32(tmp_path):
    with pytest.raises(ValueError, match="head_dim 16"):
        make_tiny_model(tmp_path / "m", hidden=64, heads=4)


def test_the_controllers_tokenizer_is_the_one_autotokenizer_loads(tiny_model):
    """The rollout's tokenizer skips AutoTokenizer's class lookup for transformers' generic class:
    the same class, ids, special tokens and chat template as AutoTokenizer gives."""
    from rlfleet.orchestrator.rollout import _load_tokenizer

    ours, auto = _load_tokenizer(str(tiny_model)), AutoTokenizer.from_pretrained(tiny_model)
    assert type(ours) is type(auto)
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2+3?"}]
    assert ours.apply_chat_template(
        msgs, tokenize=False, add_generation_prompt=True
    ) == auto.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    assert ours("hello world 12+7")["input_ids"] == auto("hello world 12+7")["input_ids"]
    assert (ours.bos_token_id, ours.eos_token_id, ours.pad_token_id, ours.all_special_ids) == (
        auto.bos_token_id,
        auto.eos_token_id,
        auto.pad_token_id,
        auto.all_special_ids,
    )
