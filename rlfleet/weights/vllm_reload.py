"""New weights into a running vLLM model, in place: the one load every transport ends in.

vLLM's layerwise reload (`initialize_layerwise_reload` -> `model.load_weights` ->
`finalize_layerwise_reload`, what its own `reload_weights` runs) re-creates each layer, loads it
and re-runs the layer's `process_weights_after_loading`, then copies the result into the tensors
the model serves from. Three things it gets wrong or leaves silent, each seen on the architecture
matrix (tests/test_architectures.py):

- A tied LM head in a module of its own (small Qwen2.5/Qwen3s, Gemma-3: `lm_head.weight` is the
  embedding's Parameter; Gemma-2 takes its logits from the embedding module itself) loads nothing,
  so it is never re-processed. On a CPU its oneDNN matmul keeps a packed copy of the first
  weights: vLLM served the new body with the old head (0.2-1.1 logprob off). `refresh`
  re-processes such an (unquantized) head.
- Unquantized MoE experts on a CPU: a weight update skips the CPU kernel's prepack
  (`_setup_kernel` runs `fused_experts.process_weights_after_loading` only on the first load), so
  the experts served raw weights in the packed layout (Qwen3-MoE 0.1 off). `refresh` repacks.
- A parameter that received no weights keeps the old ones: vLLM's `reload_weights` only logs it.
  Here it raises, naming them. vLLM also warns "X: Failed to load weights" for every module whose
  own tensors are buffers it derives (RotaryEmbedding's `cos_sin_cache` - the warning seen on every
  reload - Gemma's embedding `normalizer`) and for the tied head; those are filtered out, so the
  warning left in a log means a module really missed its weights.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from contextlib import contextmanager

import torch

LAYERWISE_LOGGER = "vllm.model_executor.model_loader.reload.layerwise"


class WeightLoadError(RuntimeError):
    """A load left vLLM parameters without new weights."""


def tied_modules(model: torch.nn.Module) -> list[torch.nn.Module]:
    """Modules whose parameter another (earlier) module holds too: vLLM loads it through that one."""
    owner: dict[int, torch.nn.Module] = {}
    tied = []
    for mod in model.modules():
        params = [p for p in mod._parameters.values() if p is not None]
        if any(id(p) in owner and owner[id(p)] is not mod for p in params):
            tied.append(mod)
        for p in params:
            owner.setdefault(id(p), mod)
    return tied


def derived_only(model: torch.nn.Module) -> set[str]:
    """Classes of modules with buffers and no parameters of their own: nothing to load."""
    return {
        type(m).__name__
        for m in model.modules()
        if not any(p is not None for p in m._parameters.values())
        and any(b is not None for b in m._buffers.values())
    }


@contextmanager
def quiet(classes: set[str]):
    """Drop vLLM's "X: Failed to load weights" for modules that load nothing by design."""
    noise = {f"{c}: Failed to load weights" for c in classes}

    def keep(record: logging.LogRecord) -> bool:
        return record.getMessage() not in noise

    log = logging.getLogger(LAYERWISE_LOGGER)
    log.addFilter(keep)
    try:
        yield
    finally:
        log.removeFilter(keep)


def refresh(model: torch.nn.Module, tied: list[torch.nn.Module]) -> None:
    """Re-run what the layerwise reload skipped (see the module docstring)."""
    from vllm.model_executor.layers.vocab_parallel_embedding import UnquantizedEmbeddingMethod

    for mod in tied:  # a quantized method would process its already-processed weights again
        method = getattr(mod, "quant_method", None)
        if isinstance(method, UnquantizedEmbeddingMethod):
            method.process_weights_after_loading(mod)
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return
    for mod in model.modules():
        kernel = getattr(getattr(mod, "quant_method", None), "moe_kernel", None)
        experts = getattr(kernel, "fused_experts", None)
        if experts is not None and type(experts).__module__.endswith("cpu_moe"):
            experts.process_weights_after_loading(mod)  # prepack the raw weights just copied in


def reload_in_place(model: torch.nn.Module, model_config, weights: Iterable[tuple[str, torch.Tensor]]) -> int:
    """Load `weights` (HF checkpoint names, any dtype) into the served model; the count loaded."""
    from vllm.model_executor.model_loader.reload import finalize_layerwise_reload, initialize_layerwise_reload

    expected = {name for name, _ in model.named_parameters()}
    tied = tied_modules(model)
    with quiet(derived_only(model) | {type(m).__name__ for m in tied}):
        initialize_layerwise_reload(model)
        loaded = set(model.load_weights(weights)) & expected  # vLLM 0.32 reports parameter names
        finalize_layerwise_reload(model, model_config)
    refresh(model, tied)
    if missing := sorted(expected - loaded):
        raise WeightLoadError(f"{len(missing)} vLLM parameters got no new weights: {missing[:8]}")
    return len(loaded)
