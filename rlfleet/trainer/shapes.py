"""The model shapes rlfleet is measured and sized at, in one place, each made offline as a
random-init model with rlfleet's character tokenizer padded to the model's vocabulary (nothing
from a hub): `rlfleet model NAME --out DIR`.

- `BODIES`: the benchmarks' bodies, `make_tiny_model`'s keywords (the 0.5B and 1.5B shapes are
  Qwen2-0.5B's and -1.5B's bodies as Llamas with a 32k vocabulary; `moe` and `moe_dense` are the
  MoE pair of benchmarks/gpu_loop.py).
- `REAL`: the configs of the models users bring, field for field as their hubs publish them
  (architecture, every shape, RoPE, tying), so that memory, FLOPs and kernels are theirs. Their
  parameter counts are checked against the published ones (`PUBLISHED`, tests/test_shapes.py).
SmolLM2-135M-Instruct stays the model that shows learning (`rlfleet model smollm2`).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # import-light: `rlfleet model` lists the names without torch
    from transformers import PretrainedConfig

BODIES: dict[str, dict[str, Any]] = {
    "05b": dict(hidden=896, intermediate=4864, layers=24, heads=14, kv_heads=2, vocab_size=32768),
    "15b": dict(hidden=1536, intermediate=8960, layers=28, heads=12, kv_heads=2, vocab_size=32768),
    # Qwen3-MoE: 8 experts of intermediate 768 (1/4 of a 3 x hidden dense MLP), top-2, every layer
    # sparse, head_dim 64, GQA 4 KV heads, untied head: 411.2M parameters, 184.7M active per token.
    "moe": dict(
        arch="qwen3_moe",
        hidden=1024,
        intermediate=768,  # moe_intermediate_size (intermediate_size too, which no sparse layer uses)
        layers=16,
        heads=16,
        kv_heads=4,
        vocab_size=32768,
        experts=8,
    ),
    # The dense Llama of moe's active parameters: the same attention (16 x 64 heads, 4 KV heads),
    # embeddings, untied head and layers, and one MLP of top_k x 768 = 1536. 184.6M parameters.
    "moe_dense": dict(hidden=1024, intermediate=1536, layers=16, heads=16, kv_heads=4, vocab_size=32768),
}

_QWEN3 = dict(
    vocab_size=151936, head_dim=128, max_position_embeddings=40960, rope_theta=1e6, rms_norm_eps=1e-6
)
_QWEN25 = dict(
    vocab_size=151936,
    num_key_value_heads=2,
    max_position_embeddings=32768,
    rope_theta=1e6,
    tie_word_embeddings=True,
    use_sliding_window=False,
)
# name -> (model_type, config fields)
REAL: dict[str, tuple[str, dict[str, Any]]] = {
    "qwen2.5-0.5b": (
        "qwen2",
        dict(_QWEN25, hidden_size=896, num_hidden_layers=24, num_attention_heads=14, intermediate_size=4864),
    ),
    "qwen2.5-1.5b": (
        "qwen2",
        dict(_QWEN25, hidden_size=1536, num_hidden_layers=28, num_attention_heads=12, intermediate_size=8960),
    ),
    "qwen3-4b": (
        "qwen3",
        dict(
            _QWEN3,
            hidden_size=2560,
            intermediate_size=9728,
            num_hidden_layers=36,
            num_attention_heads=32,
            num_key_value_heads=8,
            tie_word_embeddings=True,
        ),
    ),
    "qwen3-8b": (
        "qwen3",
        dict(
            _QWEN3,
            hidden_size=4096,
            intermediate_size=12288,
            num_hidden_layers=36,
            num_attention_heads=32,
            num_key_value_heads=8,
            tie_word_embeddings=False,
        ),
    ),
    "llama3.1-8b": (
        "llama",
        dict(
            vocab_size=128256,
            hidden_size=4096,
            intermediate_size=14336,
            num_hidden_layers=32,
            num_attention_heads=32,
            num_key_value_heads=8,
            head_dim=128,
            max_position_embeddings=131072,
            rope_theta=500000.0,
            rms_norm_eps=1e-5,
            rope_scaling={
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192,
            },
            tie_word_embeddings=False,
        ),
    ),
    "qwen3-30b-a3b": (
        "qwen3_moe",
        dict(
            _QWEN3,
            hidden_size=2048,
            intermediate_size=6144,
            moe_intermediate_size=768,
            num_experts=128,
            num_experts_per_tok=8,
            norm_topk_prob=True,
            decoder_sparse_step=1,
            mlp_only_layers=[],
            num_hidden_layers=48,
            num_attention_heads=32,
            num_key_value_heads=4,
            tie_word_embeddings=False,
        ),
    ),
}
# parameters as the model cards give them: (total, active per token)
PUBLISHED: dict[str, tuple[float, float]] = {
    "qwen2.5-0.5b": (0.49e9, 0.49e9),
    "qwen2.5-1.5b": (1.54e9, 1.54e9),
    "qwen3-4b": (4.0e9, 4.0e9),
    "qwen3-8b": (8.2e9, 8.2e9),
    "llama3.1-8b": (8.03e9, 8.03e9),
    "qwen3-30b-a3b": (30.5e9, 3.3e9),
}
NAMES = (*BODIES, *REAL)


def real_config(name: str, dtype: str = "bfloat16") -> PretrainedConfig:
    """The config of `REAL[name]`, with the character tokenizer's special ids."""
    from transformers import AutoConfig

    model_type, fields = REAL[name]
    ids = {"pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}
    return AutoConfig.for_model(model_type, **fields, **ids, torch_dtype=dtype)


def make_shape_model(
    name: str, out: str | Path, seed: int = 0, dtype: str = "bfloat16", device: str = "cpu"
) -> Path:
    """Write the random-init model `name` (a body or a real config) and its tokenizer to `out`.
    A real 8B model takes ~16 GB of host memory and disk in bfloat16; `device` = "cuda" initializes
    it on the GPU (seconds instead of minutes of the host's normal_)."""
    import torch
    from transformers import AutoModelForCausalLM

    from rlfleet.trainer.tiny import make_tiny_model, save_with_tokenizer

    if name in BODIES:
        return make_tiny_model(out, seed=seed, dtype=dtype, **BODIES[name])
    cfg = real_config(name, dtype)
    torch.manual_seed(seed)
    default = torch.get_default_dtype()
    torch.set_default_dtype(getattr(torch, dtype))  # initialized in the dtype it is saved in
    try:
        with torch.device(device):
            model = AutoModelForCausalLM.from_config(cfg)
    finally:
        torch.set_default_dtype(default)
    return save_with_tokenizer(model, Path(out))
