"""`[trainer.lora]`: train low-rank adapters on a frozen base (PEFT's LoRA) instead of every weight.

Unset, the trainer fine-tunes every weight. Set (an empty `[trainer.lora]` takes the defaults), the
base stays frozen and only the adapters and their optimizer state are trained and checkpointed;
vLLM still gets the full, merged weights (rlfleet/trainer/lora.py says why).
"""

from __future__ import annotations

import importlib.util

from pydantic import Field, field_validator

from rlfleet.config.base import NonEmptyStr, Strict

# The decoder's linear layers under their Llama/Qwen/Gemma/Mistral names: attention and the MLP.
DEFAULT_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")

# Layers the adapters must not wrap: the trainer computes the LM head from its weight directly
# (the chunked head), and a tied head is the embedding, which vLLM ties back on its own.
UNSUPPORTED_TARGETS = ("lm_head", "embed_tokens")

PEFT_MISSING = "trainer.lora needs peft, which is not installed: pip install 'rlfleet[lora]'"


class LoraConfig(Strict):
    """A LoRA adapter on each targeted linear layer: W x + (alpha / rank) B A x, with B = 0 at start."""

    rank: int = Field(16, ge=1, le=4096, description="r: the adapters' inner dimension.")
    alpha: float = Field(32.0, gt=0.0, description="lora_alpha: the update is scaled by alpha / rank.")
    dropout: float = Field(
        0.0,
        ge=0.0,
        lt=1.0,
        description="Dropout on the adapters' input while training. RL: it makes the trainer's logprobs "
        "noisier than the sampler's, so 0 there.",
    )
    target_modules: list[NonEmptyStr] | None = Field(
        None,
        min_length=1,
        description="Names (or dotted name suffixes) of the linear layers that get adapters, each of which "
        "must be in the model; unset = each of q/k/v/o_proj and gate/up/down_proj the model has (every "
        "attention and MLP projection of a Llama/Qwen/Gemma/Mistral decoder; a MoE's fused experts are no "
        "linear layers, so there the attention).",
    )

    @field_validator("target_modules")
    @classmethod
    def _targets(cls, v: list[str] | None) -> list[str] | None:
        if v is None:
            return v
        if dups := sorted({t for t in v if v.count(t) > 1}):
            raise ValueError(f"listed more than once: {dups}")
        if bad := [t for t in v if t.rsplit(".", 1)[-1] in UNSUPPORTED_TARGETS]:
            raise ValueError(
                f"{bad}: adapters go on the decoder's linear layers; the LM head and the embeddings "
                "are trained only by full fine-tuning (leave [trainer.lora] unset)"
            )
        return v


def check_lora(lora: LoraConfig | None) -> list[str]:
    """`[trainer.lora]` needs the optional peft, checked at launch (whether its targets exist, the
    trainer says: the model's layers are known only once it is built)."""
    if lora is None or importlib.util.find_spec("peft") is not None:
        return []
    return [PEFT_MISSING]
