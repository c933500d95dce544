"""Process group, device mesh and the model transforms that make the trainer scale (torchtitan order).

Order matters: activation checkpointing wraps each decoder layer's forward, torch.compile then
compiles the layer with the checkpoint inside, and FSDP2 (`fully_shard`) shards each layer and
then the root, so a layer's parameters are gathered just before it runs and freed after.
A single CPU process (the laptop default) gets none of this: `Parallel.enabled` is False and the
model is used as loaded.
"""

from __future__ import annotations

import functools
import os
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from rlfleet.config.models import TrainerConfig
from rlfleet.trainer import fa4


@dataclass
class Parallel:
    """Where this process sits: rank/world over the data-parallel mesh, or a plain single process."""

    rank: int = 0
    world: int = 1
    device: torch.device = torch.device("cpu")
    mesh: DeviceMesh | None = None

    @property
    def enabled(self) -> bool:
        return self.mesh is not None

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def barrier(self) -> None:
        if self.enabled:
            dist.barrier()

    def broadcast(self, obj: Any) -> Any:
        """Rank 0's value of a picklable object on every rank."""
        if not self.enabled or self.world == 1:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def gather(self, obj: Any) -> list[Any]:
        """Every rank's value of a picklable object, in rank order, on every rank."""
        if not self.enabled or self.world == 1:
            return [obj]
        out: list[Any] = [None] * self.world
        dist.all_gather_object(out, obj)
        return out

    def sum(self, values: list[float]) -> list[float]:
        return self._reduce(values, dist.ReduceOp.SUM)

    def max(self, values: list[float]) -> list[float]:
        return self._reduce(values, dist.ReduceOp.MAX)

    def _reduce(self, values: list[float], op: dist.ReduceOp) -> list[float]:
        if not self.enabled or self.world == 1:
            return values
        t = torch.tensor(values, dtype=torch.float64, device=self.device)
        dist.all_reduce(t, op=op)
        return t.tolist()


def setup(tc: TrainerConfig, device: torch.device) -> Parallel:
    """Join torchrun's process group (WORLD_SIZE/RANK/LOCAL_RANK), or a one-rank group on a GPU.

    trainer.fsdp: "auto" shards whenever there is a GPU or more than one rank; "off" refuses to
    run with more than one rank (there would be nothing keeping the replicas in sync).
    """
    world = int(os.environ.get("WORLD_SIZE", "1"))
    use = tc.fsdp == "on" or (tc.fsdp == "auto" and (world > 1 or device.type == "cuda"))
    if not use:
        if world > 1:
            raise ValueError("trainer.fsdp = 'off' cannot run with WORLD_SIZE > 1")
        return Parallel(device=device)
    if device.type == "cuda":
        local = int(os.environ.get("LOCAL_RANK", "0"))
        device = torch.device("cuda", local)
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        if "RANK" in os.environ:
            dist.init_process_group(backend, device_id=device if device.type == "cuda" else None)
        else:  # one process, no torchrun: a private in-memory rendezvous, no port needed
            dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
        world = dist.get_world_size()
    rep = tc.dp_replicate
    if world % rep:
        raise ValueError(f"trainer.dp_replicate ({rep}) must divide the number of ranks ({world})")
    if rep > 1:
        mesh = init_device_mesh(device.type, (rep, world // rep), mesh_dim_names=("dp_replicate", "dp_shard"))
    else:
        mesh = init_device_mesh(device.type, (world,), mesh_dim_names=("dp_shard",))
    return Parallel(rank=dist.get_rank(), world=world, device=device, mesh=mesh)


def teardown(par: Parallel) -> None:
    if par.enabled and dist.is_initialized():
        dist.destroy_process_group()


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The repeated transformer blocks of an HF causal LM: the first ModuleList named `layers`."""
    for name, mod in model.named_modules():
        if name.rsplit(".", 1)[-1] == "layers" and isinstance(mod, torch.nn.ModuleList):
            return list(mod)
    raise ValueError(f"{type(model).__name__}: no `layers` to shard / checkpoint")


def _save_matmuls_policy():
    """Selective AC (torchtitan's op-level SAC): keep matmul and attention outputs, recompute the rest."""
    from torch.utils.checkpoint import CheckpointPolicy

    keep = {
        torch.ops.aten.mm.default,
        torch.ops.aten.addmm.default,
        torch.ops.aten._scaled_dot_product_flash_attention.default,
        torch.ops.aten._scaled_dot_product_efficient_attention.default,
        torch.ops.aten._scaled_dot_product_cudnn_attention.default,
        torch.ops.aten._flash_attention_forward.default,  # varlen attention (trainer/attention.py)
        fa4.FORWARD,  # the same on Hopper / Blackwell with flash-attn-4
    }

    def policy(ctx, op, *args, **kwargs):
        if op in keep:
            return CheckpointPolicy.MUST_SAVE
        return CheckpointPolicy.PREFER_RECOMPUTE

    return policy


def apply_activation_checkpointing(model: torch.nn.Module, mode: str) -> None:
    """Recompute each decoder layer's activations in backward: all of them ("full"), or all but
    the matmul / attention outputs ("selective": most of the memory saving at a fraction of the cost).

    It only replaces each layer's `forward` (the layer's own, kept, so a later call changes the mode
    instead of nesting one in the other), so the trainer's sizing (budget.py `TokenBudget`) can turn
    it on after FSDP2 has wrapped the model: FSDP's hooks run around the call either way (a compiled
    layer recompiles once)."""
    if mode == "none":
        return
    from torch.utils.checkpoint import checkpoint, create_selective_checkpoint_contexts

    context_fn = None
    if mode == "selective":
        context_fn = functools.partial(create_selective_checkpoint_contexts, _save_matmuls_policy())
    for layer in decoder_layers(model):
        inner = layer.__dict__.setdefault("_unchecked_forward", layer.forward)

        def forward(self, *args, _inner=inner, **kwargs):
            extra = {"context_fn": context_fn} if context_fn is not None else {}
            return checkpoint(_inner, *args, use_reentrant=False, **extra, **kwargs)

        layer.forward = types.MethodType(forward, layer)


def host_compile_cache() -> str:
    """Where the trainer's compiled kernels (inductor's, triton's inside it) stay for the next run
    on this host: `$TORCHINDUCTOR_CACHE_DIR` if set, else `~/.cache/rlfleet/torchinductor`
    (XDG_CACHE_HOME honoured). Torch's default sits under the temp dir, which a SLURM job or a
    container may give each job fresh."""
    if not os.environ.get("TORCHINDUCTOR_CACHE_DIR"):
        base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(Path(base) / "rlfleet" / "torchinductor")
    return os.environ["TORCHINDUCTOR_CACHE_DIR"]


def apply_compile(model: torch.nn.Module) -> None:
    """Compile each decoder layer (one graph serves them all) and the LM head, into the host's
    compile cache."""
    import torch._dynamo
    import torch._logging

    from rlfleet.trainer.lm_head import compile_lm_head

    host_compile_cache()
    # each recompile and its reason (a guard that failed) in the trainer's log: a step that
    # recompiles pays seconds, and the reason says which input changed
    torch._logging.set_logs(recompiles=True)
    torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)
    # MoE: the router hook's record (trainer/router.py) is a forward side effect; inside a checkpointed
    # layer dynamo breaks the graph unless it may skip replaying it in the backward, which is right
    if hasattr(torch._dynamo.config, "skip_fwd_side_effects_in_bwd_under_checkpoint"):
        torch._dynamo.config.skip_fwd_side_effects_in_bwd_under_checkpoint = True
    for layer in decoder_layers(model):
        # dynamic: a GPU trainer's micro-batch is one flat row whose length and samples change every
        # time (budget.py); one graph serves them all, compiled in the warm-up while vLLM starts
        layer.compile(dynamic=True)
    compile_lm_head()


def apply_fsdp(model: torch.nn.Module, par: Parallel, tc: TrainerConfig) -> None:
    """FSDP2 over the data-parallel mesh: each decoder layer is one unit, the root holds the rest
    (embeddings, final norm, LM head; tied weights stay in one unit). Parameters are stored in the
    model's dtype and computed in `param_dtype`; gradients are reduced in float32."""
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

    mp = MixedPrecisionPolicy(
        param_dtype=None if tc.param_dtype == "model" else getattr(torch, tc.param_dtype),
        reduce_dtype=torch.float32,
    )
    kw: dict[str, Any] = {"mesh": par.mesh, "mp_policy": mp}
    if tc.optimizer_offload:
        kw["offload_policy"] = CPUOffloadPolicy()
    if par.world == 1 and not tc.optimizer_offload:
        # Nothing to shard: one unit for the whole model keeps mixed precision and drops the
        # per-layer hooks, which are host time the GPU waits on at this size.
        fully_shard(model, reshard_after_forward=False, **kw)
        return
    layers = decoder_layers(model)
    for i, layer in enumerate(layers):
        # The last layer is needed again right away by backward: keeping it gathered saves one all-gather.
        fully_shard(layer, reshard_after_forward=tc.reshard_after_forward and i < len(layers) - 1, **kw)
    fully_shard(model, reshard_after_forward=tc.reshard_after_forward, **kw)


def parallelize(model: torch.nn.Module, par: Parallel, tc: TrainerConfig) -> torch.nn.Module:
    apply_activation_checkpointing(model, tc.activation_checkpointing)
    if tc.compile or (tc.compile is None and par.device.type == "cuda"):
        apply_compile(model)
    if par.enabled:
        apply_fsdp(model, par, tc)
    return model


def set_gradient_sync(model: torch.nn.Module, sync: bool) -> None:
    """Skip the reduce-scatter on all but the last micro-batch of a step (grads accumulate unsharded)."""
    if hasattr(model, "set_requires_gradient_sync"):
        model.set_requires_gradient_sync(sync)
