"""Tiny random-init models with a character tokenizer, made locally so nothing comes from a hub.

`arch` picks the architecture (`ARCHS`): llama (the default), qwen2 (qkv bias, tied embeddings),
qwen3 (qk-norm, tied), gemma2 (logit soft-capping, sliding-window layers, scaled embeddings),
gemma3 (qk-norm, local/global layers with their own RoPE) and qwen3_moe (4 experts, top-2). Each
is the same tiny body: the vocabulary is one token per printable ASCII character plus specials,
padded to the model's vocab size so every id vLLM can sample decodes to something; head_dim is 64
because vLLM's CPU attention rejects 16.
"""

from __future__ import annotations

import json
import string
from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer, decoders
from tokenizers.models import BPE
from transformers import (
    AutoModelForCausalLM,
    LlamaConfig,
    PretrainedConfig,
    PreTrainedModel,
    PreTrainedTokenizerFast,
)

SPECIALS = ["<pad>", "<s>", "</s>", "<unk>"]
CHARS = [c for c in string.printable if c not in "\t\r\x0b\x0c"]  # 95 printable + "\n"
ARCHS = ("llama", "qwen2", "qwen3", "gemma2", "gemma3", "qwen3_moe")
SLIDING_WINDOW = 32  # Gemma's local layers: shorter than a test prompt, so the window matters
# An assistant turn ends with EOS (as Qwen's ends with <|im_end|>), so a chat-trained model stops.
# Tools are listed by name only (a character-level model has no room for JSON schemas); tool
# calls render in the Hermes format that `rlfleet.chat.parse_assistant` reads back.
CHAT_TEMPLATE = (
    "{% if tools %}<tools>{% for t in tools %}{{ (t.function or t).name }}"
    "{% if not loop.last %},{% endif %}{% endfor %}{{ '\\n' }}{% endif %}"
    "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] or '' }}"
    "{% for c in m.get('tool_calls') or [] %}<tool_call>"
    '{"name": "{{ c.function.name }}", "arguments": {{ c.function.arguments | tojson }}}</tool_call>'
    "{% endfor %}{% if m['role'] == 'assistant' %}</s>{% endif %}{{ '\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)


def build_tokenizer(vocab_size: int) -> PreTrainedTokenizerFast:
    tokens = SPECIALS + CHARS
    if vocab_size < len(tokens):
        raise ValueError(f"vocab_size must be >= {len(tokens)}")
    fillers = [f"<extra_{i}>" for i in range(vocab_size - len(tokens))]
    vocab = {t: i for i, t in enumerate(tokens + fillers)}
    # BPE without merges = one token per character; Fuse joins decoded characters without spaces.
    tok = Tokenizer(BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    # Fillers are special: decoded text (vLLM skips special tokens) never shows them, so their
    # letters cannot score on a text reward or push real characters out of a character window.
    tok.add_special_tokens(SPECIALS + fillers)
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        pad_token="<pad>",
        additional_special_tokens=fillers,
        chat_template=CHAT_TEMPLATE,
        model_max_length=4096,
        clean_up_tokenization_spaces=False,
    )


def tiny_config(
    vocab_size: int = 128,
    hidden: int = 128,
    layers: int = 2,
    heads: int = 2,
    intermediate: int | None = None,
    kv_heads: int | None = None,
    dtype: str = "float32",
    arch: str = "llama",
    experts: int = 4,
) -> PretrainedConfig:
    """The config; `intermediate` defaults to 2 x hidden, `kv_heads` to `heads` (no GQA), and
    qwen3_moe's `experts` (top-2 routed) to 4.

    Larger shapes come from the same call, e.g. Qwen2-0.5B's body: hidden 896, intermediate 4864,
    24 layers, 14 heads, 2 KV heads (head_dim 64); `dtype` is what the weights are saved in.
    """
    common: dict[str, Any] = dict(
        vocab_size=vocab_size,
        hidden_size=hidden,
        intermediate_size=intermediate if intermediate is not None else 2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads if kv_heads is not None else heads,
        max_position_embeddings=1024,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        torch_dtype=dtype,
    )
    if arch == "llama":
        return LlamaConfig(**common, head_dim=hidden // heads, rms_norm_eps=1e-5, tie_word_embeddings=False)
    if arch not in ARCHS:
        raise ValueError(f"unknown arch {arch!r}; one of {', '.join(ARCHS)}")
    from transformers import AutoConfig

    extra: dict[str, Any] = {"rms_norm_eps": 1e-6}
    if arch == "qwen2":  # q/k/v carry biases in every Qwen2; small Qwen2.5s tie the LM head
        extra |= {"tie_word_embeddings": True}
    elif arch == "qwen3":  # q_norm/k_norm per head; Qwen3-0.6B to 4B tie the LM head
        extra |= {"head_dim": hidden // heads, "tie_word_embeddings": True}
    elif arch in ("gemma2", "gemma3"):  # HF's soft-capping defaults; every Gemma ties the LM head
        layer_types = ["sliding_attention", "full_attention"] * (layers // 2) + ["sliding_attention"] * (
            layers % 2
        )
        extra |= {
            "head_dim": hidden // heads,
            "query_pre_attn_scalar": hidden // heads,
            "sliding_window": SLIDING_WINDOW,
            "layer_types": layer_types,
            "tie_word_embeddings": True,
        }
    elif arch == "qwen3_moe":  # every layer sparse, top-2 (Qwen3-30B-A3B: 128 experts, top-8)
        extra |= {
            "num_experts": experts,
            "num_experts_per_tok": 2,
            "moe_intermediate_size": intermediate if intermediate is not None else hidden,
            "norm_topk_prob": True,
            "tie_word_embeddings": False,
        }
    model_type = {"gemma3": "gemma3_text"}.get(arch, arch)
    return AutoConfig.for_model(model_type, **common, **extra)


def make_tiny_model(out: str | Path, seed: int = 0, **shape: Any) -> Path:
    """Write a random-init model + tokenizer that both transformers and vLLM load.

    `shape` is `tiny_config`'s keyword arguments; the weights are initialized in float32 (the same
    values for a seed whatever the dtype) and saved in `dtype`.
    """
    out = Path(out)
    cfg = tiny_config(**shape)
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    if head_dim < 32:
        raise ValueError(f"head_dim {head_dim} < 32: vLLM's CPU attention rejects it")
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg).float()
    dtype = str(shape.get("dtype") or "float32")
    if dtype != "float32":
        model = model.to(getattr(torch, dtype))
    return save_with_tokenizer(model, out)


def save_with_tokenizer(model: PreTrainedModel, out: Path) -> Path:
    """`model` and the character tokenizer padded to its vocabulary, with its special ids."""
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    build_tokenizer(model.config.vocab_size).save_pretrained(out)
    gen = {"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0}
    (out / "generation_config.json").write_text(json.dumps(gen, indent=2))
    return out
