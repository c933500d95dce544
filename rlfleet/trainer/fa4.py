"""FlashAttention-4 (the `flash-attn-4` package, CuTe DSL) for packed rows on Hopper and Blackwell.

torch's own varlen kernel is FlashAttention-2. On one H200, forward + backward of a packed row of
16,384 tokens (long-tail samples, causal, bf16) ran at 219 TFLOP/s with it and 413 with FA4 at the
0.5B shape's attention (14 heads, 2 KV heads, head_dim 64), 248 against 501 at 1.5B's (head_dim 128),
both within bf16 noise of float32 sdpa (`benchmarks/attention_kernels.py`, docs/benchmarks/trainer.md).
FA4 ships with the `gpu` extra; without it, or on another GPU, attention.py runs torch's FA2.

FA4 is called through a torch custom op with a fake (shapes only) and an autograd formula, so a
compiled decoder layer traces through it without a graph break and selective checkpointing can
keep its output (`FORWARD`, parallel.py). The op calls FA4's `_flash_attn_fwd` / `_flash_attn_bwd`,
which are not its public API: the version is pinned (`PINNED`, pyproject's `gpu` extra), and
another version is not used (torch 2.11's own FA4 registration fails on this one).
"""

from __future__ import annotations

import functools
import importlib.metadata

import torch

PINNED = "4.0.0b36"


@functools.cache
def available() -> str | None:
    """Why FA4 cannot run here, or None where it can: the pinned package on a Hopper / Blackwell GPU."""
    if not torch.cuda.is_available():
        return "no CUDA device"
    major, minor = torch.cuda.get_device_capability()
    if major not in (9, 10):
        return f"compute capability {major}.{minor} (FA4 runs on 9.x and 10.x)"
    try:
        found = importlib.metadata.version("flash-attn-4")
    except importlib.metadata.PackageNotFoundError:
        return "flash-attn-4 is not installed (pip install 'rlfleet[gpu]')"
    if found != PINNED:
        return f"flash-attn-4 {found} is installed; rlfleet calls {PINNED}'s kernels"
    try:
        import flash_attn.cute.interface  # noqa: F401
    except Exception as e:  # a broken install (its CUDA DSL libraries): say so, run FA2
        return f"flash-attn-4 does not import: {type(e).__name__}: {e}"
    return None


def _window(left: int | None) -> dict[str, int | None]:
    return {"window_size_left": left, "window_size_right": None if left is None else 0}


@torch.library.custom_op("rlfleet::fa4_varlen", mutates_args=(), device_types="cuda")
def fa4_varlen(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor, max_seqlen: int,
    scale: float | None, window_left: int | None,
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """Causal attention of each sample to itself: q [total, H, D], k/v [total, Hkv, D] -> the output
    [total, H, D] and the log-sum-exp [H, total] (float32) the backward needs."""
    from flash_attn.cute.interface import _flash_attn_fwd

    out, lse, *_ = _flash_attn_fwd(
        q, k, v, cu_seqlens_q=cu_seqlens, cu_seqlens_k=cu_seqlens, max_seqlen_q=max_seqlen,
        max_seqlen_k=max_seqlen, softmax_scale=scale, causal=True, return_lse=True, **_window(window_left),
    )  # fmt: skip
    return out.contiguous(), lse.contiguous()


@fa4_varlen.register_fake
def _fa4_varlen_fake(q, k, v, cu_seqlens, max_seqlen, scale, window_left):
    return q.new_empty(q.shape), q.new_empty((q.shape[1], q.shape[0]), dtype=torch.float32)


@torch.library.custom_op("rlfleet::fa4_varlen_backward", mutates_args=(), device_types="cuda")
def fa4_varlen_backward(
    dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
    lse: torch.Tensor, cu_seqlens: torch.Tensor, max_seqlen: int, scale: float | None, window_left: int | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
    from flash_attn.cute.interface import _flash_attn_bwd

    dq, dk, dv = _flash_attn_bwd(
        q, k, v, out, dout.contiguous(), lse, scale, True, 0.0, cu_seqlens_q=cu_seqlens,
        cu_seqlens_k=cu_seqlens, max_seqlen_q=max_seqlen, max_seqlen_k=max_seqlen, **_window(window_left),
    )  # fmt: skip
    return dq, dk, dv


@fa4_varlen_backward.register_fake
def _fa4_varlen_backward_fake(dout, q, k, v, out, lse, cu_seqlens, max_seqlen, scale, window_left):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def _setup(ctx, inputs, output) -> None:
    q, k, v, cu_seqlens, max_seqlen, scale, window_left = inputs
    ctx.save_for_backward(q, k, v, output[0], output[1], cu_seqlens)
    ctx.args = (max_seqlen, scale, window_left)


def _backward(ctx, dout, _dlse):
    q, k, v, out, lse, cu_seqlens = ctx.saved_tensors
    dq, dk, dv = fa4_varlen_backward(dout, q, k, v, out, lse, cu_seqlens, *ctx.args)
    return dq, dk, dv, None, None, None, None


fa4_varlen.register_autograd(_backward, setup_context=_setup)
FORWARD = torch.ops.rlfleet.fa4_varlen.default  # what selective checkpointing keeps (parallel.py)
