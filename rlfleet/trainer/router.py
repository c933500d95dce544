"""MoE router load balance per optimizer step: how evenly each layer's router spreads tokens.

Why: a router that collapses onto a few experts wastes their capacity and makes token-level
ratios noisy (GSPO's argument for MoE); RL can drive that drift with no auxiliary loss watching
it. The counts come from the router modules the model itself declares for `output_router_logits`
(transformers 5: `_can_record_outputs["router_logits"]`, e.g. `Qwen3MoeTopKRouter`, whose forward
returns (logits, top-k weights, top-k indices)): a forward hook keeps the detached indices of the
policy's own forward, and after it one scatter-add per micro-batch adds them, masked to the real
tokens (`real_tokens` of a micro-batch, rlfleet/microbatches.py; never padding), into [layers, experts]
counts on the device. Nothing else runs on the hot path: no top-k is recomputed, no graph is kept,
an activation-checkpointing recompute and the LoRA reference's forward are not counted (the hook
only records while `counting` is open). Dense models get no hooks and no metrics.

Per step, with c[l, e] the top-k selections of expert e in MoE layer l over the step's real tokens
(all micro-batches, summed over ranks) and m[l] = mean_e c[l, e] = top_k * tokens / experts:
  router/max_vio       max over layers of (max_e c[l, e] - m[l]) / m[l]: MaxVio, the load
                       imbalance of Wang et al. 2024 ("Auxiliary-loss-free load balancing",
                       DeepSeek-V3's balancing), over the whole step's batch. 0 is perfectly even;
                       experts / top_k - 1 is every token on the same top_k experts.
  router/load_cv       mean over layers of std_e c[l, e] / m[l] (population std): the coefficient
                       of variation whose square is Shazeer et al. 2017's balancing loss.
  router/dead_experts  (layer, expert) pairs that received no token in the step, summed over layers.
  router/tokens        the real tokens each layer routed (the counts' denominator).
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from rlfleet.trainer.parallel import Parallel

log = logging.getLogger("rlfleet.trainer")


def router_modules(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The MoE router of each sparse layer, in layer order; [] for a dense model."""
    recorder = (getattr(type(model), "_can_record_outputs", None) or {}).get("router_logits")
    if recorder is None:
        return []
    target = recorder if isinstance(recorder, type) else getattr(recorder, "target_class", None)
    if target is None:
        return []
    return [m for m in model.modules() if isinstance(m, target)]


def num_experts(router: torch.nn.Module) -> int:
    n = getattr(router, "num_experts", None)
    return int(n) if n is not None else int(router.weight.shape[0])


def real_token_mask(mb: dict[str, torch.Tensor]) -> torch.Tensor:
    """[B, T] bool: True on tokens, False on padding (`real_tokens`; without it every position)."""
    ids = mb["input_ids"]
    real = mb.get("real_tokens")
    if real is None:
        return torch.ones_like(ids, dtype=torch.bool)
    return torch.arange(ids.shape[1], device=ids.device) < real.to(ids.device).unsqueeze(-1)


class RouterLoad:
    """Tokens per expert per MoE layer over a step, from hooks on the routers (installed once)."""

    def __init__(self, routers: list[torch.nn.Module]):
        self.experts = num_experts(routers[0])
        if any(num_experts(r) != self.experts for r in routers):
            raise ValueError("MoE layers with different expert counts are not supported")
        self.layers = len(routers)
        self.counts: torch.Tensor | None = None  # [layers * experts] int64, on the routers' device
        self._offsets = torch.zeros(0, dtype=torch.long)  # each layer's first slot in `counts`
        self.top_k = int(getattr(routers[0], "top_k", 0) or 0)  # else learnt from the first forward
        self._recording = False
        self._pending: list[tuple[int, torch.Tensor]] = []
        for i, router in enumerate(routers):
            router.register_forward_hook(functools.partial(self._hook, i))

    @classmethod
    def install(cls, model: torch.nn.Module) -> RouterLoad | None:
        """Hooks on `model`'s routers (the HF model, before compile and FSDP), or None if dense."""
        routers = router_modules(model)
        return cls(routers) if routers else None

    def _hook(self, layer: int, module: torch.nn.Module, args: Any, output: Any) -> None:
        if self._recording:
            self._pending.append((layer, _indices(output).detach()))

    @contextlib.contextmanager
    def counting(self, mb: dict[str, torch.Tensor]) -> Iterator[None]:
        """Count the routing of the forward inside, over `mb`'s real tokens (on the device)."""
        self._pending.clear()
        self._recording = True
        try:
            yield
        finally:
            self._recording = False
        pending, self._pending = self._pending, []
        if pending:
            self._add(pending, real_token_mask(mb))

    def _add(self, pending: list[tuple[int, torch.Tensor]], real: torch.Tensor) -> None:
        ids = torch.stack([t for _, t in pending])  # [L, N, k]: N = B * T, rows in the batch's order
        if ids.shape[1] != real.numel():
            raise RuntimeError(f"router saw {ids.shape[1]} tokens, the micro-batch has {real.numel()}")
        self.top_k = ids.shape[-1]
        if self.counts is None or self.counts.device != ids.device:
            self.counts = torch.zeros(self.layers * self.experts, dtype=torch.long, device=ids.device)
            self._offsets = torch.arange(self.layers, device=ids.device) * self.experts
        layers = [i for i, _ in pending]
        if layers == list(range(self.layers)):  # every layer once, in order: no host-to-device copy
            offsets = self._offsets
        else:
            offsets = self._offsets[torch.tensor(layers, device=ids.device)]
        ids = ids + offsets.view(-1, 1, 1)
        weight = real.reshape(1, -1, 1).expand_as(ids).long()
        self.counts.scatter_add_(0, ids.flatten(), weight.flatten())

    def reset(self) -> None:
        if self.counts is not None:
            self.counts.zero_()

    def step_counts(self, par: Parallel | None = None) -> torch.Tensor:
        """[layers, experts] counts of the step, summed over ranks (every rank must call it)."""
        values = [0.0] * (self.layers * self.experts) if self.counts is None else self.counts.tolist()
        if par is not None:
            values = par.sum(values)
        return torch.tensor(values, dtype=torch.float64).view(self.layers, self.experts)

    def metrics(self, par: Parallel | None = None) -> dict[str, float]:
        """The step's `router/*` metrics (module docstring); {} if the step routed no token."""
        return load_metrics(self.step_counts(par), self.top_k)


def load_metrics(counts: torch.Tensor, top_k: int) -> dict[str, float]:
    """`router/*` from [layers, experts] counts of top-k selections (definitions: module docstring)."""
    total = counts.sum(-1)
    if not top_k or bool((total == 0).any()):
        return {}
    mean = total / counts.shape[-1]
    return {
        "router/max_vio": float(((counts.max(-1).values - mean) / mean).max()),
        "router/load_cv": float((counts.std(-1, correction=0) / mean).mean()),
        "router/dead_experts": float((counts == 0).sum()),
        "router/tokens": float(total[0] / top_k),
    }


def _indices(output: Any) -> torch.Tensor:
    """The top-k expert indices in a router's output: its (last) integer tensor."""
    items = output if isinstance(output, tuple | list) else (output,)
    for t in reversed(items):
        if isinstance(t, torch.Tensor) and not t.is_floating_point():
            return t
    raise TypeError(f"router output has no integer top-k indices: {type(output).__name__}")
