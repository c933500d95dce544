"""The dtypes a config names (`model.dtype`, `inference.dtype`), for every part that reads one:
the trainer's weights, vLLM's, and the buffers the weight transports fill. Config stays torch-free:
`torch_dtype` imports torch only when a name is turned into a dtype."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    import torch

Dtype = Literal["float32", "bfloat16", "float16"]
DTYPE_BYTES: dict[str, int] = {"float32": 4, "bfloat16": 2, "float16": 2}


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype a config's (or a ticket's) dtype name means."""
    import torch

    if name not in DTYPE_BYTES:
        raise ValueError(f"unknown dtype {name!r}: one of {', '.join(DTYPE_BYTES)}")
    return getattr(torch, name)
