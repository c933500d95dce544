"""What a train step computed and the MFU it makes: one formula for the loop's step metrics and the
bench (`rlfleet trainer --bench`), stated in docs/benchmarks/trainer.md.

Model FLOPs (PaLM / torchtitan), counted on real tokens only (a packed row's padding is waste, not
work): 6 x the matmul parameters (every decoder layer's projections and the LM head; the embedding
lookup is not a matmul) per token, plus causal attention over each sample's own length,
6 x layers x heads x head_dim x n^2 for a sample of n tokens (QK^T and AV, forward and backward,
half of the square). Recomputation (activation checkpointing, the chunked head's backward) is not
useful work. With LoRA the frozen base's matmuls count 4 x its parameters (no weight gradient) and
the adapters' 6 x theirs. MFU divides by the step's seconds, the GPUs and each GPU's dense bf16 peak.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from rlfleet.microbatches import samples_in

PEAK_BF16 = {
    "H100 PCIe": 756e12,
    "H100": 989e12,
    "H200": 989e12,
    "H20": 148e12,
    "A100": 312e12,
    "B200": 2250e12,
}


def peak_flops(device: torch.device) -> float | None:
    """The GPU's dense bf16 peak, None on a CPU or a GPU not listed."""
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    for key, value in PEAK_BF16.items():  # "H100 PCIe" before "H100"
        if key in name:
            return value
    return None


def _dims(config: Any) -> tuple[int, int, int, int, int]:
    h, heads = config.hidden_size, config.num_attention_heads
    kv = getattr(config, "num_key_value_heads", None) or heads
    hd = getattr(config, "head_dim", None) or h // heads
    return h, heads, kv, hd, config.num_hidden_layers


def matmul_params(config: Any) -> int:
    """The parameters a token multiplies through: q/k/v/o and the gated MLP of each layer (an MoE's
    active experts' width is `intermediate_size` x experts per token), and the LM head."""
    h, heads, kv, hd, layers = _dims(config)
    ffn = getattr(config, "moe_intermediate_size", None) or config.intermediate_size
    active = getattr(config, "num_experts_per_tok", None) or 1
    per_layer = 2 * h * heads * hd + 2 * h * kv * hd + 3 * h * ffn * active
    return layers * per_layer + config.vocab_size * h


def model_flops(config: Any, tokens: int, square_lengths: int, adapters: int | None = None) -> float:
    """Useful FLOPs of a forward and backward over `tokens` real tokens whose samples' squared
    lengths sum to `square_lengths`. `adapters`: the trainable parameters of a frozen base (LoRA),
    None for full fine-tuning. A frozen weight's matmul runs forward and for its input's gradient,
    never for its own: 4 x its parameters per token, not 6; the adapters' run all three."""
    _, heads, _, hd, layers = _dims(config)
    weights = (
        6.0 * matmul_params(config) if adapters is None else 4.0 * matmul_params(config) + 6.0 * adapters
    )
    return weights * tokens + 6.0 * layers * heads * hd * square_lengths


def adapter_params(model: torch.nn.Module) -> int | None:
    """The trainable parameters where the rest is frozen (LoRA's adapters), else None (every
    parameter trains)."""
    trainable = frozen = 0
    for p in model.parameters():
        if p.requires_grad:
            trainable += p.numel()
        else:
            frozen += p.numel()
    return trainable if frozen else None


@dataclass
class Work:
    """A step's micro-batches as the GPU computes them: positions run, real tokens among them,
    and the real samples' squared lengths (the attention term)."""

    computed: int = 0
    tokens: int = 0
    square_lengths: int = 0

    def add(self, mb: dict[str, torch.Tensor]) -> None:
        samples = [b - a for _, a, b in samples_in(mb)]
        self.computed += mb["input_ids"].numel()
        self.tokens += sum(samples)
        self.square_lengths += sum(n * n for n in samples)

    def metrics(
        self, seconds: float, config: Any, device: torch.device, world: int, adapters: int | None = None
    ) -> dict[str, float]:
        """train_tokens_per_s, padding_frac and (on a GPU with a known peak) mfu, over all ranks."""
        out = {
            "train_tokens_per_s": self.tokens / max(seconds, 1e-9),
            "padding_frac": 1.0 - self.tokens / max(self.computed, 1),
        }
        peak = peak_flops(device)
        if peak is not None:
            flops = model_flops(config, self.tokens, self.square_lengths, adapters)
            out["mfu"] = flops / (max(seconds, 1e-9) * peak * world)
        return out
