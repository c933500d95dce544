"""Parameters as one flat layout: what the cuda_ipc and nccl transports move instead of files.

A layout is a list of `[name, bucket, offset, shape]` in elements of one dtype (vLLM's); buckets
bound the size of one contiguous buffer. The trainer fills buffers from what it sends
(`trainer/hf_export.sent_state`), a vLLM worker reads views of them back by name and hands them to
`model.load_weights`.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping

import torch

BUCKET_BYTES = 1 << 30


def make_layout(sd: Mapping[str, torch.Tensor], dtype: torch.dtype, bucket_bytes: int = BUCKET_BYTES) -> list:
    cap = max(bucket_bytes * 8 // torch.finfo(dtype).bits, 1)
    layout, bucket, offset = [], 0, 0
    for name, t in sd.items():
        n = t.numel()
        if offset and offset + n > cap:
            bucket, offset = bucket + 1, 0
        layout.append([name, bucket, offset, list(t.shape)])
        offset += n
    return layout


def bucket_sizes(layout: list) -> list[int]:
    sizes: dict[int, int] = {}
    for _, b, off, shape in layout:
        sizes[b] = max(sizes.get(b, 0), off + math.prod(shape))
    return [sizes[b] for b in range(len(sizes))]


def fill(buckets: list[torch.Tensor], layout: list, sd: Mapping[str, torch.Tensor]) -> None:
    with torch.no_grad():
        for name, b, off, shape in layout:
            buckets[b][off : off + math.prod(shape)].copy_(sd[name].reshape(-1))


def views(buckets: list[torch.Tensor], layout: list) -> Iterator[tuple[str, torch.Tensor]]:
    for name, b, off, shape in layout:
        yield name, buckets[b][off : off + math.prod(shape)].view(shape)
