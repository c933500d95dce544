"""LoRA (`[trainer.lora]`): PEFT adapters on a frozen base, and the merged weights that leave the trainer.

The trainer's model is PEFT's `PeftModel` around the HF model (`wrap`); only the adapters require
gradients, so the optimizer, its state and the checkpoint's trainer state hold only them, and a
resume puts them back onto the base from `model.path`.

vLLM gets merged weights, W + (alpha / r) B A under the base's own names (`merged_tensors`), never
the adapters: every transport (files, cuda_ipc, nccl) and every architecture vLLM loads takes them
unchanged, and vLLM decodes at full speed. Serving adapters instead would need vLLM started with
`--enable-lora` and a maximum rank, and adds LoRA kernels to every token. The merge is computed
tensor by tensor as a transport reads it, never into the trained weights (PEFT's `merge_adapter`
would write into the base in place).

peft is an optional dependency (`pip install 'rlfleet[lora]'`): this module imports it only when
LoRA is configured, and `peft_model` answers without it.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from rlfleet.config.lora import DEFAULT_TARGETS, PEFT_MISSING, UNSUPPORTED_TARGETS, LoraConfig

if TYPE_CHECKING:
    from peft import PeftModel
    from transformers import PreTrainedModel

log = logging.getLogger("rlfleet.trainer")

ADAPTER = "default"  # PEFT's name for the one adapter
PREFIX = "base_model.model."  # what PeftModel puts before the HF model's state-dict names


def _peft() -> Any:
    try:
        import peft
    except ImportError as e:
        raise ImportError(PEFT_MISSING) from e
    return peft


def peft_model(lm: torch.nn.Module) -> PeftModel | None:
    """`lm` if it is a PeftModel (the trainer's model under LoRA), else None; never imports peft."""
    peft = sys.modules.get("peft")
    return lm if peft is not None and isinstance(lm, peft.PeftModel) else None


def base_model(lm: torch.nn.Module) -> PreTrainedModel:
    """The HF causal LM: `lm` itself, or the one a PeftModel wraps (its layers carry the adapters)."""
    return lm.get_base_model() if peft_model(lm) is not None else lm


def peft_kwargs(cfg: LoraConfig) -> dict[str, Any]:
    """PEFT's `LoraConfig` arguments for `[trainer.lora]`: what the trainer wraps its model with, and
    what a peer given the same adapters gets (benchmarks/vs_trl.py hands them to TRL)."""
    return {
        "r": cfg.rank,
        "lora_alpha": cfg.alpha,
        "lora_dropout": cfg.dropout,
        "target_modules": list(cfg.target_modules or DEFAULT_TARGETS),
        "bias": "none",
        "task_type": "CAUSAL_LM",
    }


def wrap(lm: PreTrainedModel, cfg: LoraConfig) -> PeftModel:
    """Adapters on the targeted linear layers of `lm` (initialised as PEFT does: A random, B = 0, so
    the model starts as the base); every other parameter is frozen. Adapters are float32 whatever
    the base's dtype (PEFT's autocast), so a bfloat16 base still trains fp32 adapters."""
    peft = _peft()
    config = peft.LoraConfig(**peft_kwargs(cfg))
    linear = sorted(
        {n.rsplit(".", 1)[-1] for n, m in lm.named_modules() if isinstance(m, torch.nn.Linear)}
        - set(UNSUPPORTED_TARGETS)
    )  # for the messages: what could have been named
    try:
        model = peft.get_peft_model(lm, config)
    except ValueError as e:  # PEFT: no target matched at all
        raise ValueError(f"trainer.lora.target_modules: {e} (its linear layers: {linear})") from None
    layers = lora_layers(model)
    names = [n.removeprefix(PREFIX) for n in layers]
    unmatched = [t for t in cfg.target_modules or () if not any(n == t or n.endswith(f".{t}") for n in names)]
    if unmatched:  # PEFT fails only when no target matches: a typo beside a real name would do nothing
        raise ValueError(
            f"trainer.lora.target_modules: {unmatched} match no layer of the model (its linear layers: {linear})"
        )
    if other := [n for n, m in layers.items() if not isinstance(m.get_base_layer(), torch.nn.Linear)]:
        raise ValueError(f"trainer.lora.target_modules: {other[:4]} are not linear layers (nn.Linear)")
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in model.parameters())
    log.info(
        "LoRA r=%d alpha=%g on %d linear layers (%s): %d trainable parameters of %d (%.2f%%)",
        cfg.rank,
        cfg.alpha,
        len(layers),
        ", ".join(sorted({n.rsplit(".", 1)[-1] for n in names})),
        trainable,
        total,
        100.0 * trainable / total,
    )
    return model


def lora_layers(model: PeftModel) -> dict[str, Any]:
    """Each module of `model` that carries an adapter (PEFT's LoraLayer), by its name in `model`."""
    from peft.tuners.lora import LoraLayer

    return {n: m for n, m in model.named_modules() if isinstance(m, LoraLayer)}


def adapters_disabled(model: PeftModel) -> AbstractContextManager[None]:
    """The base model's forward, the adapters skipped (and re-enabled on exit)."""
    return model.disable_adapter()


class MergedTensors(Mapping[str, torch.Tensor]):
    """Names known up front; each tensor made when it is read, so a LoRA merge exists for one
    weight at a time while a transport copies it (a file writer reading all of them holds all)."""

    def __init__(self, makers: dict[str, Callable[[], torch.Tensor]]):
        self._makers = makers

    def __getitem__(self, name: str) -> torch.Tensor:
        return self._makers[name]()

    def __iter__(self) -> Iterator[str]:
        return iter(self._makers)

    def __len__(self) -> int:
        return len(self._makers)


def merged_tensors(model: PeftModel, sd: Mapping[str, torch.Tensor], skip: set[str]) -> MergedTensors:
    """`sd` (the PeftModel's state dict, full tensors) as the base model's state dict with each
    adapter merged: `x.base_layer.weight` + scaling B A goes as `x.weight`, `x.base_layer.bias` as
    `x.bias`, the adapters themselves not at all; names in `skip` (base names) are left out.

    The merge is computed in float32 and rounded once to the base's dtype; `sd` is only read."""
    makers: dict[str, Callable[[], torch.Tensor]] = {}
    adapters = set()
    for layer, mod in lora_layers(model).items():
        a, b = f"{layer}.lora_A.{ADAPTER}.weight", f"{layer}.lora_B.{ADAPTER}.weight"
        adapters |= {a, b}
        w = f"{layer}.base_layer.weight"
        makers[w] = _merger(sd, w, a, b, float(mod.scaling[ADAPTER]))
    out: dict[str, Callable[[], torch.Tensor]] = {}
    for key in sd:
        if key in adapters:
            continue
        name = key.removeprefix(PREFIX).replace(".base_layer.", ".")
        if name not in skip:
            out[name] = makers.get(key, _const(sd, key))
    return MergedTensors(out)


def _merger(
    sd: Mapping[str, torch.Tensor], w: str, a: str, b: str, scaling: float
) -> Callable[[], torch.Tensor]:
    def merge() -> torch.Tensor:
        base = sd[w]
        with torch.no_grad():
            return torch.addmm(base.float(), sd[b].float(), sd[a].float(), alpha=scaling).to(base.dtype)

    return merge


def _const(sd: Mapping[str, torch.Tensor], key: str) -> Callable[[], torch.Tensor]:
    return lambda: sd[key]


def save_adapter(model: PeftModel, sd: Mapping[str, torch.Tensor], out: Path) -> None:
    """PEFT's own adapter directory (`PeftModel.from_pretrained(base, out)`) from `sd`, the
    PeftModel's full state dict (gathered on rank 0 under FSDP), not from the live parameters."""
    model.save_pretrained(str(out), state_dict=dict(sd), save_embedding_layers=False)
