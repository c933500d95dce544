"""Model, optimizer and one optimizer step over a step's micro-batches."""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import Callable
from typing import Any, Protocol

import torch
from transformers import AutoModelForCausalLM, PreTrainedModel

from rlfleet.config.dtypes import torch_dtype
from rlfleet.config.memory import head_chunk
from rlfleet.config.models import TrainerConfig
from rlfleet.trainer.attention import VARLEN, Packing, packing
from rlfleet.trainer.attention import kwargs as attention_kwargs
from rlfleet.trainer.flops import Work, adapter_params
from rlfleet.trainer.lm_head import chunked_logprobs, logprobs_and_entropy, token_logprobs
from rlfleet.trainer.lora import base_model
from rlfleet.trainer.parallel import Parallel, set_gradient_sync
from rlfleet.trainer.router import RouterLoad

log = logging.getLogger("rlfleet.trainer")


def pick_device(choice: str) -> torch.device:
    if choice == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("trainer.device = 'cuda' but no CUDA device is visible")
    if choice == "auto":
        choice = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device(choice)


def load_model(path: str, dtype: str, device: torch.device) -> PreTrainedModel:
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype(dtype))
    return model.to(device).train()


def default_head_chunk(device: torch.device, vocab: int) -> int:
    """Tokens per LM-head chunk when the config leaves it unset: on a GPU the [tokens, vocab] logits
    of long packed rows are what runs out of memory; 8192 measured fastest of 2048/4096/8192 on an
    H100 at a 32k vocabulary (BENCHMARKS.md), fewer at a larger one (config/memory.py `head_chunk`,
    which the memory plan counts). A CPU's tiny models keep full logits."""
    return head_chunk(vocab) if device.type == "cuda" else 0


class Policy(torch.nn.Module):
    """The HF causal LM and how logprobs leave it: full logits, or the chunked LM head.

    It is the root of the FSDP2 tree, so calling it is what gathers the embeddings, final norm
    and LM head; `lm` stays the HF model (under LoRA the PeftModel around it) for other callers.
    """

    def __init__(
        self, lm: torch.nn.Module, lm_head_chunk: int = 0, entropy: bool = False, routing: bool = True
    ):
        super().__init__()
        hf = base_model(lm)
        if getattr(hf.config, "attn_logit_softcapping", None):
            # Gemma-2: sdpa and varlen attention drop the attention soft-capping vLLM applies (0.5
            # nats apart once scores near the cap); eager computes it (and costs T^2 memory)
            if hf.config._attn_implementation != "eager":
                log.info(
                    "%s: attention soft-capping has no varlen kernel: eager attention", type(hf).__name__
                )
                hf.set_attn_implementation("eager")
        else:  # packed rows: each sample attends to itself, no dense mask (trainer/attention.py)
            hf.set_attn_implementation(VARLEN)
        self.lm = lm
        self.lm_head_chunk = lm_head_chunk
        self.want_entropy = entropy  # full logits: also the entropy (an entropy bonus needs it)
        # MoE: tokens per expert of each step (router/* metrics); None for a dense model (or routing=False)
        self.routing = RouterLoad.install(hf) if routing else None

    @property
    def varlen(self) -> bool:
        """Whether packed rows run varlen attention (one flat row a micro-batch is then as cheap as
        rows of a fixed width); not under eager (Gemma-2)."""
        return base_model(self.lm).config._attn_implementation == VARLEN

    def forward(
        self,
        input_ids: torch.Tensor,
        temperature: float = 1.0,
        position_ids: torch.Tensor | None = None,
        packed: Packing | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(logprob, entropy or None) of each next token: [B, T-1] float32. The chunked head gives
        the entropy at no cost; full logits only when `want_entropy` (a [B, T, V] softmax more).
        `packed`: the samples of packed rows, from their host-side position ids (`packing`); left
        out, they are read off `position_ids` here (on a GPU that waits for the device).

        use_cache=False: a KV cache in training only costs memory, and breaks activation
        checkpointing (the recompute would append to it again)."""
        targets = input_ids[:, 1:]
        lm = base_model(self.lm)  # under LoRA its layers run the adapters
        kw: dict[str, Any] = {"position_ids": position_ids, "use_cache": False}
        if self.varlen:
            if packed is None and position_ids is not None:
                packed = packing(position_ids.detach().cpu())
            kw |= attention_kwargs(packed, input_ids.device)
        if self.lm_head_chunk == 0:
            logits = lm(input_ids=input_ids, **kw).logits[:, :-1]
            if self.want_entropy:
                return logprobs_and_entropy(logits, targets, temperature)
            return token_logprobs(logits, targets, temperature), None
        hidden = lm.model(input_ids=input_ids, **kw)
        hidden = hidden.last_hidden_state[:, :-1]
        softcap = getattr(lm.config, "final_logit_softcapping", None) or 0.0  # Gemma-2's
        return chunked_logprobs(hidden, lm.lm_head.weight, targets, self.lm_head_chunk, temperature, softcap)


def make_optimizer(model: torch.nn.Module, cfg: TrainerConfig) -> torch.optim.Optimizer:
    """AdamW over the parameters that train: all of them, or under LoRA the adapters only."""
    on_gpu = next(model.parameters()).is_cuda
    return torch.optim.AdamW(
        [p for p in model.parameters() if p.requires_grad],
        lr=cfg.lr,
        betas=cfg.betas,
        weight_decay=cfg.weight_decay,
        fused=True if on_gpu else None,
    )


def init_optimizer_state(optimizer: torch.optim.Optimizer) -> None:
    """Create the optimizer's state now, exactly as its first step would (AdamW: zero moments,
    step 0): torch's own zero-gradient, zero-lr step (what DCP does before loading a state), with
    the step counts put back to 0. Lets the trainer size its checkpoint buffers at start-up."""
    from torch.distributed.checkpoint.state_dict import _init_optim_state

    if optimizer.state:
        return
    _init_optim_state(optimizer)
    for state in optimizer.state.values():
        if torch.is_tensor(state.get("step")):
            state["step"].zero_()


def shard_micro_batches(
    micro_batches: list[dict[str, torch.Tensor]], par: Parallel | None
) -> list[dict[str, torch.Tensor]]:
    """This rank's share (round robin). Every rank runs the same count, so FSDP's collectives pair
    up: a rank that comes up short repeats a micro-batch with its loss mask (and real tokens) zeroed."""
    if par is None or par.world == 1:
        return micro_batches
    mine = micro_batches[par.rank :: par.world]
    need = math.ceil(len(micro_batches) / par.world)
    while len(mine) < need:
        pad = dict(micro_batches[0])
        pad["loss_mask"] = torch.zeros_like(pad["loss_mask"])
        pad["real_tokens"] = torch.zeros(len(pad["input_ids"]), dtype=torch.long)  # routes nothing either
        mine.append(pad)
    return mine


def _grad_norm(total: torch.Tensor) -> float:
    full = getattr(total, "full_tensor", None)
    return float(full() if full is not None else total)


LossFn = Callable[
    [dict[str, torch.Tensor], torch.Tensor, torch.Tensor | None], tuple[torch.Tensor, dict[str, torch.Tensor]]
]


def accumulate(
    policy: Policy,
    micro_batches: list[dict[str, torch.Tensor]],
    loss_fn: LossFn,
    temperature: float = 1.0,
    par: Parallel | None = None,
    work: Work | None = None,
) -> dict[str, float]:
    """Forward and backward over this rank's micro-batches; the stats summed over all ranks.

    `loss_fn(mb, logprobs, entropy)` gives the micro-batch's loss (already divided by the step's
    loss-token count) and tensor statistics. Statistics stay on the device until the end, so the
    host queues micro-batch k+1 while the GPU still runs k: one sync per step, not per micro-batch.
    With several ranks FSDP averages gradients, so the loss is scaled by the world size to keep
    the step's gradient the sum over all loss tokens / num_loss_tokens. `work`, when given, counts
    what this rank computed (flops.py), summed over the ranks at the end.
    """
    device = next(policy.parameters()).device if par is None else par.device
    world = 1 if par is None or not par.enabled else par.world
    mine = shard_micro_batches(micro_batches, par)
    mine_work = Work()
    totals: dict[str, torch.Tensor] = {}
    routing: RouterLoad | None = getattr(policy, "routing", None)
    for i, mb in enumerate(mine):
        # Packed rows carry position_ids that restart per sample (rlfleet/microbatches.py); their
        # samples are read here, on the host, so that no attention layer waits on the GPU for them.
        packed = packing(mb["position_ids"]) if policy.varlen and "position_ids" in mb else None
        mine_work.add(mb)
        mb = {k: v.to(device, non_blocking=True) for k, v in mb.items()}
        set_gradient_sync(policy, i == len(mine) - 1)
        # Padding sits only at the right end, so causal attention never looks at it: no mask needed.
        with routing.counting(mb) if routing is not None else contextlib.nullcontext():
            logprobs, entropy = policy(mb["input_ids"], temperature, mb.get("position_ids"), packed)
        loss, stats = loss_fn(mb, logprobs, entropy)
        (loss * world if world > 1 else loss).backward()
        for k, v in {"loss": loss.detach(), **stats}.items():
            v = v.detach().double()
            if k not in totals:
                totals[k] = v
            else:  # `*_max` statistics are maxima; everything else sums
                totals[k] = torch.maximum(totals[k], v) if k.endswith("_max") else totals[k] + v
    keys = sorted(totals)
    values = torch.stack([totals[k] for k in keys]).tolist() if keys else []
    counts = [float(mine_work.computed), float(mine_work.tokens), float(mine_work.square_lengths)]
    if par is not None:
        summed, maxed = par.sum(values + counts), par.max(values)
        values = [m if k.endswith("_max") else s for k, s, m in zip(keys, summed, maxed, strict=False)]
        counts = summed[len(keys) :]
    if work is not None:
        work.computed, work.tokens, work.square_lengths = (int(c) for c in counts)
    return dict(zip(keys, values, strict=True))


def warm_up(policy: Policy, par: Parallel | None, tokens: int = 97) -> float:
    """One forward and backward on a dummy packed row, its gradients dropped and the RNG restored
    (parameters and optimizer are untouched): the device's kernels and libraries load, FSDP
    initialises and compiled layers compile here, while vLLM starts, instead of inside step 0.

    `tokens` equals no model dimension: dynamo takes equal sizes for the same symbol, and a row of
    64 tokens, the head_dim of the 0.5B and SmolLM2 shapes, recompiled every layer at step 0. The
    chunked LM head runs in two chunks, as a micro-batch longer than `lm_head_chunk` does: in one,
    each chunk is a view as long as its base, and the compiled head recompiled at step 0 for that."""
    start = time.perf_counter()
    device = next(policy.parameters()).device if par is None else par.device
    ids = torch.ones(1, tokens, dtype=torch.long)
    # two samples in one row, as a GPU trainer's micro-batches are: a compiled layer's graph for them
    pos = torch.cat([torch.arange(tokens // 2), torch.arange(tokens - tokens // 2)]).unsqueeze(0)
    chunk = policy.lm_head_chunk
    policy.lm_head_chunk = (tokens - 1) // 2 if chunk else 0
    try:
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            batch = [{"input_ids": ids, "loss_mask": torch.zeros_like(ids), "position_ids": pos}]
            accumulate(policy, batch, lambda mb, lp, ent: (lp.float().sum() * 0.0, {}), 1.0, par)
    finally:
        policy.lm_head_chunk = chunk
    policy.zero_grad(set_to_none=True)
    return time.perf_counter() - start


def probe_row(policy: Policy, par: Parallel, tokens: int, sync: bool) -> int:
    """Peak bytes one forward and backward of a packed row of `tokens` adds to what the GPU holds
    (config/sizing.py). The loss is a zero, so gradients accumulate zeros; sync=False skips FSDP's
    gradient reduction, as every micro-batch of a step but its last does. The caller restores the
    RNG and drops the gradients."""
    device = par.device
    ids = torch.ones(1, tokens, dtype=torch.long, device=device)
    half = tokens // 2  # two samples: a packed row's attention, not a plain causal one
    pos = torch.cat([torch.arange(half), torch.arange(tokens - half)]).unsqueeze(0)
    set_gradient_sync(policy, sync)
    torch.cuda.synchronize(device)
    base = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    logprobs, _ = policy(ids, 1.0, pos.to(device), packing(pos))
    (logprobs.float().sum() * 0.0).backward()
    torch.cuda.synchronize(device)
    return torch.cuda.max_memory_allocated(device) - base


def free_memory(device: torch.device) -> int:
    """What this process's allocator can still get: the device's free memory and its own cache."""
    free, _ = torch.cuda.mem_get_info(device)
    return free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)


def optimizer_step(policy: torch.nn.Module, optimizer: torch.optim.Optimizer, max_grad_norm: float) -> float:
    """Clip to `max_grad_norm`, step, and return the pre-clip gradient norm."""
    grad_norm = _grad_norm(torch.nn.utils.clip_grad_norm_(policy.parameters(), max_grad_norm))
    optimizer.step()
    return grad_norm


class Objective(Protocol):
    """The pluggable part of a train step: RL's policy loss (losses/objective.py `PolicyLoss`) or
    SFT's NLL (nll.py `NLL`). One per step: it may hold the step's normalisers."""

    temperature: float  # the sampler's: logprobs are of logits / temperature
    want_entropy: bool  # the full-logits path also computes the entropy (an entropy bonus needs it)
    __call__: LossFn  # the micro-batch's loss (divided by the step's normaliser) and statistics

    def metrics(self, totals: dict[str, float]) -> dict[str, Any]:
        """The step's metrics from the statistics summed over micro-batches and ranks."""


def train_step(
    policy: Policy,
    optimizer: torch.optim.Optimizer,
    micro_batches: list[dict[str, torch.Tensor]],
    objective: Objective,
    max_grad_norm: float,
    par: Parallel | None = None,
) -> dict[str, Any]:
    """One optimizer step: `objective` over all micro-batches, clip, AdamW. The step's lr is the
    optimizer's now: the caller's scheduler steps after this returns."""
    policy.want_entropy = objective.want_entropy
    start = time.perf_counter()
    optimizer.zero_grad(set_to_none=True)
    lr = optimizer.param_groups[0]["lr"]
    routing: RouterLoad | None = getattr(policy, "routing", None)
    if routing is not None:
        routing.reset()  # the warm-up's (or the last step's) counts
    work = Work()
    totals = accumulate(policy, micro_batches, objective, objective.temperature, par, work)
    grad_norm = optimizer_step(policy, optimizer, max_grad_norm)
    metrics = {"loss": totals["loss"], "grad_norm": grad_norm, "lr": float(lr), **objective.metrics(totals)}
    if routing is not None:  # MoE: the router's load balance over the step (trainer/router.py)
        metrics |= routing.metrics(par)
    seconds = time.perf_counter() - start  # grad_norm's .item() waited for the step's last kernel
    world = 1 if par is None or not par.enabled else par.world
    device = next(policy.parameters()).device if par is None else par.device
    config = base_model(policy.lm).config
    adapters = adapter_params(policy.lm)  # LoRA: the frozen base runs no weight-gradient matmuls
    return metrics | {"train_seconds": seconds} | work.metrics(seconds, config, device, world, adapters)
