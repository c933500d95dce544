"""What a GPU trainer's checkpoint host buffers cost to make (trainer/checkpoint.py `HostCopy`):
the host copy of each rank's shards of the model and AdamW state, pinned, made at start-up. On a
warm fleet the run's trainer made them before its step 0 (6.5 s for SmolLM2 on an H200,
docs/fleet.md). Three ways, each timed in this process, on a random-init model of the given shape
sharded by FSDP2 on one rank:

- `per_tensor`: torch's `_create_cpu_state_dict(pin_memory=True)`, what HostCopy does today: each
  tensor copied to the host, then a pinned copy of it (one pinned allocation per tensor);
- `per_tensor_again`: the same once more after the first was dropped (torch's host allocator keeps
  freed pinned blocks: a process that made them once, such as a warm trainer, makes them again so);
- `flat`: one pinned allocation the size of the whole state (rounded up to a power of two by torch's
  allocator), a view per tensor, nothing copied;
- `chunks`: what HostCopy does now (`rlfleet/trainer/host_state.py`): views into pinned chunks of
  256 MiB or a larger power of two, each DTensor rewrapped with its own spec (no copy of its data);
  `chunks_pinned_bytes` is what they pin.

Each `--variant` in its own process.

Standard library, torch and transformers only (it runs in the GPU image without the kit; `chunks`
imports rlfleet's host_state.py, which needs torch alone):

    python benchmarks/host_buffers.py --shape smollm2 --variant flat --out host_buffers_h200_flat.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from typing import Any

import torch

SHAPES = {  # (hidden, layers, heads, kv heads, intermediate, vocab)
    "smollm2": (576, 30, 9, 3, 1536, 49152),
    "05b": (896, 24, 14, 2, 4864, 151936),
}


def build(shape: str) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard
    from transformers import LlamaConfig, LlamaForCausalLM

    hidden, layers, heads, kv, inter, vocab = SHAPES[shape]
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    dist.init_process_group("nccl", rank=0, world_size=1)
    cfg = LlamaConfig(
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv,
        intermediate_size=inter,
        vocab_size=vocab,
        tie_word_embeddings=True,
    )
    with torch.device("cuda"):
        model = LlamaForCausalLM(cfg)
    for layer in model.model.layers:
        fully_shard(layer)
    fully_shard(model)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-5)


def state(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    from torch.distributed.checkpoint.state_dict import _init_optim_state, get_state_dict

    _init_optim_state(optimizer)
    model_sd, optim_sd = get_state_dict(model, optimizer)
    return {"model": model_sd, "optim": optim_sd}


def flat(sd: dict[str, Any]) -> list[torch.Tensor]:
    """One pinned allocation for every tensor of `sd` (local shards), a view each."""
    from torch.distributed.tensor import DTensor
    from torch.utils._pytree import tree_leaves

    local = [
        t._local_tensor if isinstance(t, DTensor) else t
        for t in tree_leaves(sd)
        if isinstance(t, torch.Tensor) and t.dim() > 0
    ]
    sizes = [-(-t.numel() * t.element_size() // 64) * 64 for t in local]  # 64-byte aligned
    buf = torch.empty(sum(sizes), dtype=torch.uint8, pin_memory=True)
    views, offset = [], 0
    for t, size in zip(local, sizes, strict=True):
        n = t.numel() * t.element_size()
        views.append(buf[offset : offset + n].view(t.dtype).view(t.shape))
        offset += size
    return views


def pinned_bytes(sd: dict[str, Any]) -> int:
    """The pinned memory under `sd`'s tensors: each allocation rounded up to a power of two, as
    torch's pinned allocator makes it."""
    from torch.distributed.tensor import DTensor
    from torch.utils._pytree import tree_leaves

    from rlfleet.trainer.host_state import pinned_size

    storages = {
        s.data_ptr(): s.nbytes()
        for t in tree_leaves(sd)
        if isinstance(t, torch.Tensor) and t.dim() > 0
        for s in [(t._local_tensor if isinstance(t, DTensor) else t).untyped_storage()]
    }
    return sum(pinned_size(n) for n in storages.values() if n)


def timed(fn: Any) -> tuple[float, Any]:
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    out = fn()
    torch.cuda.synchronize()
    return time.perf_counter() - t0, out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", choices=sorted(SHAPES), default="smollm2")
    ap.add_argument(
        "--variant",
        choices=("per_tensor", "flat", "chunks"),
        default="per_tensor",
        help="one per process: torch's host allocator keeps what a variant before it freed",
    )
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    from torch.distributed._state_dict_utils import _create_cpu_state_dict

    model, optimizer = build(a.shape)
    t_state, sd = timed(lambda: state(model, optimizer))
    n_bytes = sum(
        t.numel() * t.element_size()
        for t in torch.utils._pytree.tree_leaves(sd)
        if isinstance(t, torch.Tensor)
    )
    results: dict[str, Any] = {"shape": a.shape, "state_bytes": n_bytes, "state_s": t_state}
    if a.variant == "flat":
        results["flat_s"], _ = timed(lambda: flat(sd))
    elif a.variant == "chunks":
        from rlfleet.trainer.host_state import host_like

        results["chunks_s"], host = timed(lambda: host_like(sd, pinned=True))
        results["chunks_pinned_bytes"] = pinned_bytes(host)
    else:
        results["per_tensor_s"], first = timed(lambda: _create_cpu_state_dict(sd, pin_memory=True))
        del first
        results["per_tensor_again_s"], _ = timed(lambda: _create_cpu_state_dict(sd, pin_memory=True))
    print(json.dumps(results), flush=True)
    with open(a.out, "w") as f:
        json.dump(
            {
                "env": {
                    "torch": torch.__version__,
                    "gpu": torch.cuda.get_device_name(0),
                    "cpus": os.cpu_count(),
                    "machine": platform.machine(),
                    "date": time.strftime("%Y-%m-%d %H:%M"),
                },
                "results": results,
            },
            f,
        )


if __name__ == "__main__":
    main()
