"""Packed rows through varlen attention: each sample attends to itself only, and no [T, T] mask is built.

transformers' default sdpa reads restarting position ids as packed samples and builds a dense
block-diagonal mask, and with a mask sdpa has no flash kernel: on packed rows of the 0.5B shape it
ran 1.86x slower than on unpacked ones (docs/benchmarks/trainer.md). `VARLEN` is an attention
implementation registered with transformers that takes the samples' cumulative lengths
(`Packing`, computed once a micro-batch on the host, so no layer waits on the GPU) and runs:
- on a Hopper or Blackwell GPU with the `gpu` extra, in bf16/fp16: FlashAttention-4 (fa4.py), ~1.9x
  torch's own kernel's forward + backward on an H200;
- on other GPUs in bf16/fp16: torch's own FlashAttention-2 varlen kernel (`aten._flash_attention_forward`
  and its backward; grouped KV heads without repeating them), as AReaL's Archon engine does;
- elsewhere (a CPU, float32): sdpa once per sample, causal, no mask.
Unpacked rows (no position ids) run transformers' sdpa, causal, as before, except under a sliding
window (Gemma-3's local layers), which the varlen path applies: transformers builds no mask for an
implementation of its own. Models whose attention has no varlen form (Gemma-2's logit soft-capping)
keep eager (`Policy` says so in the log).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from rlfleet.trainer import fa4

VARLEN = "rlfleet_varlen"
FA4 = False  # set once the trainer's device is known (`choose_kernel`); read at each layer's call


class Packing(NamedTuple):
    """A micro-batch's samples over its rows flattened into one: [0, end_1, end_2, ..., B x T]."""

    cu_seqlens: torch.Tensor  # int32 [samples + 1] (a row's tail padding is a sample of its own)
    max_seqlen: int
    lengths: list[int]  # each sample's length, in order (the MFU's attention term)


def packing(position_ids: torch.Tensor) -> Packing:
    """The samples of packed rows from their position ids: a sample starts where its position is 0,
    and every row starts one. Call it on the host copy: on a GPU tensor it waits for the device."""
    rows, width = position_ids.shape
    starts = position_ids.reshape(-1) == 0
    starts[::width] = True
    bounds = torch.cat([starts.nonzero().squeeze(1), torch.tensor([rows * width])])
    lengths = (bounds[1:] - bounds[:-1]).tolist()
    return Packing(bounds.to(torch.int32), max(lengths), lengths)


def flash_varlen_runs(query: torch.Tensor) -> bool:
    """Whether torch's flash kernel takes this query: a CUDA tensor in half precision, head_dim a
    multiple of 8 up to 256 (FlashAttention-2's limits)."""
    d = query.shape[-1]
    return query.is_cuda and query.dtype in (torch.bfloat16, torch.float16) and d % 8 == 0 and d <= 256


def choose_kernel(device: torch.device) -> str:
    """Which kernel packed rows run on `device` (FA4 where it runs, else torch's FA2), for the log."""
    global FA4
    if device.type != "cuda":
        FA4 = False
        return "sdpa once per sample (no flash kernel off a GPU)"
    why = fa4.available()
    FA4 = why is None
    return f"FlashAttention-4 (flash-attn-4 {fa4.PINNED})" if FA4 else f"torch's FlashAttention-2: {why}"


def _fa4(q, k, v, cu: torch.Tensor, longest: int, scale: float | None, window: int | None) -> torch.Tensor:
    return fa4.fa4_varlen(q, k, v, cu, longest, scale, None if not window else window - 1)[0]


def _flash(q, k, v, cu: torch.Tensor, longest: int, scale: float | None, window: int | None) -> torch.Tensor:
    left = None if not window else window - 1
    out = torch.ops.aten._flash_attention_forward(
        q, k, v, cu, cu, longest, longest, 0.0, True, False,
        scale=scale, window_size_left=left, window_size_right=0 if left is not None else None,
    )  # fmt: skip
    return out[0]


def _per_sample(
    q, k, v, cu: torch.Tensor, longest: int, scale: float | None, window: int | None
) -> torch.Tensor:
    """[total, heads, dim] -> the same, one causal sdpa per sample (no mask across samples)."""
    out = torch.empty_like(q)
    groups = q.shape[1] // k.shape[1]
    at = 0
    for n in (cu[1:] - cu[:-1]).tolist():
        qs, ks, vs = (x[at : at + n].transpose(0, 1) for x in (q, k, v))
        if groups > 1:
            ks, vs = ks.repeat_interleave(groups, 0), vs.repeat_interleave(groups, 0)
        mask = None
        if window and n > window:  # a sliding window: causal and at most `window` back
            i = torch.arange(n, device=q.device)
            mask = (i[:, None] >= i[None, :]) & (i[:, None] - i[None, :] < window)
        o = F.scaled_dot_product_attention(qs, ks, vs, attn_mask=mask, is_causal=mask is None, scale=scale)
        out[at : at + n] = o.transpose(0, 1)
        at += n
    return out


UNSAID = object()


def _read(position_ids: torch.Tensor | None, rows: int) -> Packing | None:
    """The samples of rows whose position ids restart; None for plain ramps (one sample a row)."""
    if position_ids is None:
        return None
    found = packing(position_ids.detach().cpu().expand(rows, -1))
    return found if len(found.lengths) > rows else None


def varlen_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    sliding_window: int | None = None,
    rlfleet_cu_seqlens: Any = UNSAID,
    rlfleet_max_seqlen: int = 0,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' attention interface: query [B, H, T, D], key/value [B, Hkv, T, D] in; the
    output [B, T, H, D] out. `rlfleet_cu_seqlens` (on the query's device) and `rlfleet_max_seqlen`
    are a micro-batch's `Packing`, or None for rows of one sample each (Policy always says which:
    `kwargs`); a caller that does not say gets its position ids read, which waits on the GPU at
    every layer. Only tensors and an int come in, so a compiled layer needs no guard on a sample."""
    if rlfleet_cu_seqlens is UNSAID:
        found = _read(kwargs.get("position_ids"), query.shape[0])
        rlfleet_cu_seqlens = None if found is None else found.cu_seqlens.to(query.device)
        rlfleet_max_seqlen = 0 if found is None else found.max_seqlen
    b, h, t, d = query.shape
    if rlfleet_cu_seqlens is None and sliding_window and t > sliding_window:
        # rows of one sample each, but a sliding window that plain causal sdpa would not apply
        # (no mask is built for this implementation): each row a sample of the varlen path
        rlfleet_cu_seqlens = torch.arange(0, b * t + 1, t, dtype=torch.int32, device=query.device)
        rlfleet_max_seqlen = t
    if rlfleet_cu_seqlens is None or attention_mask is not None or dropout:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    q, k, v = (x.transpose(1, 2).reshape(b * t, x.shape[1], d) for x in (query, key, value))
    run = (_fa4 if FA4 else _flash) if flash_varlen_runs(q) else _per_sample
    out = run(q, k, v, rlfleet_cu_seqlens, rlfleet_max_seqlen, scaling, sliding_window)
    return out.view(b, t, h, d), None


def kwargs(packed: Packing | None, device: torch.device) -> dict[str, Any]:
    """What a model call passes on to `varlen_attention` for a micro-batch (None: one sample a row)."""
    if packed is None:
        return {"rlfleet_cu_seqlens": None}
    cu = packed.cu_seqlens.to(device, non_blocking=True)
    return {"rlfleet_cu_seqlens": cu, "rlfleet_max_seqlen": packed.max_seqlen}


AttentionInterface.register(VARLEN, varlen_attention)
