"""Host memory shaped like a trainer's sharded state (each rank's shards of the model and optimizer),
for the checkpoint's host copy (checkpoint.py `HostCopy`).

torch's `_create_cpu_state_dict(pin_memory=True)` copies each tensor to the host, then pins a copy
of it: for the 0.5B shape's 6.5 GB 12.3-15.1 s on an H200, 2.0-2.9 s for SmolLM2's 1.7 GB
(`git show d1694e7:benchmarks/host_buffers.py`, removed since). Here the tensors are views into few allocations and nothing is
copied: 2.3-3.6 s at 0.5B, 6.7 GB pinned, where one allocation of it all took 3.0 s. Each
allocation is `CHUNK` bytes, or a larger power of two for a larger tensor: torch's pinned allocator
rounds every allocation up to one, and keeps what is freed for the next of that size (a warm
trainer's precompile makes them once for the run that takes it: fleet/warm.py)."""

from __future__ import annotations

from typing import Any

import torch

CHUNK = 256 << 20
ALIGN = 64  # bytes: any dtype's view may start there


def host_like(state: Any, pinned: bool) -> Any:
    """`state` (nested dicts, lists and tuples) with every tensor replaced by host memory of its
    shape (a DTensor by a DTensor whose local tensor is such memory, as torch's own host copies do);
    contents undefined. Other values as they are."""
    from torch.distributed.tensor import DTensor
    from torch.utils._pytree import tree_leaves, tree_map

    views = iter(_carve([_nbytes(_local(t)) for t in tree_leaves(state) if _stored(t)], pinned))

    def host(t: torch.Tensor) -> torch.Tensor:
        local = _local(t)
        if t.dim() == 0:  # as torch's host copy has them: a step count, its DTensor kept
            return torch.tensor(0, dtype=t.dtype) if local is t else t
        mine = (
            next(views).view(local.dtype).view(local.shape)
            if _stored(t)
            else torch.zeros_like(local, device="cpu")
        )
        if local is t:
            return mine
        # a new DTensor of the same spec around the host memory: what torch's _create_cpu_state_dict
        # makes, without the copy of the data it makes to get there (`t.to("cpu")`, a deepcopy)
        return DTensor(mine, t._spec, requires_grad=False)

    return tree_map(lambda x: host(x) if isinstance(x, torch.Tensor) else x, state)


def _local(t: torch.Tensor) -> torch.Tensor:
    from torch.distributed.tensor import DTensor

    return t._local_tensor if isinstance(t, DTensor) else t


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _stored(t: Any) -> bool:
    """A tensor whose host copy takes space in the chunks (not a scalar, not empty)."""
    return isinstance(t, torch.Tensor) and t.dim() > 0 and _local(t).numel() > 0


def _carve(sizes: list[int], pinned: bool) -> list[torch.Tensor]:
    """One uint8 view per size, in order, from allocations whose sizes are powers of two (torch's
    pinned allocator rounds each up to one: a 544 MB embedding alone would pin 1 GiB). First fit,
    largest first, into allocations of `CHUNK` or, for a larger tensor, its size rounded up, whose
    rest the smaller ones fill."""
    views: dict[int, torch.Tensor] = {}
    chunks: list[torch.Tensor] = []
    used: list[int] = []
    for i in sorted(range(len(sizes)), key=lambda i: -sizes[i]):
        size = sizes[i]
        k = next((k for k, c in enumerate(chunks) if used[k] + size <= c.numel()), len(chunks))
        if k == len(chunks):
            chunks.append(torch.empty(max(CHUNK, pinned_size(size)), dtype=torch.uint8, pin_memory=pinned))
            used.append(0)
        views[i] = chunks[k][used[k] : used[k] + size]
        used[k] += -(-size // ALIGN) * ALIGN
    return [views[i] for i in range(len(sizes))]


def pinned_size(n: int) -> int:
    """What torch's pinned allocator allocates for `n` bytes: `n` rounded up to a power of two."""
    return 1 << (n - 1).bit_length()
