"""The model shapes' one home (rlfleet/trainer/shapes.py): the real configs are the published
models' (their parameter counts, total and per token), and `rlfleet model NAME` writes one offline
that transformers loads with its own tokenizer's ids."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from rlfleet.trainer.flops import matmul_params
from rlfleet.trainer.shapes import PUBLISHED, REAL, real_config


def _counts(name: str) -> tuple[int, int]:
    cfg = real_config(name)
    with torch.device("meta"):
        lm = AutoModelForCausalLM.from_config(cfg)
    total = sum(p.numel() for p in lm.parameters())
    experts = sum(p.numel() for n, p in lm.named_parameters() if ".experts." in n)
    n, k = getattr(cfg, "num_experts", 0) or 0, getattr(cfg, "num_experts_per_tok", 0) or 0
    return total, total - experts + (experts * k // n if n else experts)


@pytest.mark.parametrize("name", sorted(REAL))
def test_each_real_shape_has_its_published_parameters(name):
    total, active = _counts(name)
    want_total, want_active = PUBLISHED[name]
    assert total == pytest.approx(want_total, rel=0.02), f"{name}: {total / 1e9:.3f}B"
    assert active == pytest.approx(want_active, rel=0.02), f"{name}: {active / 1e9:.3f}B active"
    # what the MFU counts per token is the active matmuls: all but the embedding lookup (and norms);
    # a tied LM head is a matmul through the embedding's one copy
    cfg = real_config(name)
    lookup = 0 if cfg.tie_word_embeddings else cfg.vocab_size * cfg.hidden_size
    assert matmul_params(cfg) == pytest.approx(active - lookup, rel=0.02)


def test_rlfleet_model_writes_a_real_shape_offline(tmp_path):
    from rlfleet.cli import main

    out = tmp_path / "q"
    assert main(["model", "qwen2.5-0.5b", "--out", str(out)]) == 0
    cfg = AutoConfig.from_pretrained(out)
    assert (cfg.model_type, cfg.hidden_size, cfg.num_key_value_heads, cfg.tie_word_embeddings) == (
        "qwen2",
        896,
        2,
        True,
    )
    tok = AutoTokenizer.from_pretrained(out)
    assert len(tok) == cfg.vocab_size == 151936 and tok.eos_token_id == cfg.eos_token_id == 2
    index = (
        json.loads((out / "model.safetensors.index.json").read_text())
        if (out / "model.safetensors.index.json").exists()
        else None
    )
    assert index is None or index["metadata"]["total_size"] > 0
    lm = AutoModelForCausalLM.from_pretrained(out)
    assert lm.dtype == torch.bfloat16 and lm.model.layers[0].self_attn.q_proj.bias is not None
