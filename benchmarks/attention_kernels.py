"""Varlen attention kernels on packed rows, forward + backward, against each other on one GPU.

The trainer's packed rows run torch's FlashAttention-2 varlen kernel (trainer/attention.py). On
Hopper, cuDNN's fused attention (in the same torch, no extra package) may be faster. For each
Qwen2.5 shape's attention (heads, KV heads, head_dim) on one packed row of a long-tail length mix,
bf16, this times forward + backward of:
- `flash`: `aten._flash_attention_forward` with the samples' cumulative lengths (today's kernel);
- `cudnn`: `aten._cudnn_attention_forward` with the same lengths, KV heads as they are (GQA);
- `cudnn_rep`: the same with KV heads repeated to the query's (if cuDNN refuses GQA).
Each is checked against float32 sdpa run once per sample (max abs difference of the output and of
the three gradients), beside flash's own difference, so a wrong kernel shows as an outlier.

    python benchmarks/attention_kernels.py --out benchmarks/results/attention_kernels_h200.json
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

SHAPES = {"0.5b": (14, 2, 64, 24), "1.5b": (12, 2, 128, 28), "7b": (28, 4, 128, 28)}  # H, Hkv, D, layers


def lengths(total: int, longest: int, seed: int) -> list[int]:
    """A long-tail mix packed into `total` tokens: 40% at `longest`, the rest uniform from 256."""
    rng, out = random.Random(seed), []
    while sum(out) < total:
        out.append(longest if rng.random() < 0.4 else rng.randint(256, longest))
    out[-1] -= sum(out) - total
    return [n for n in out if n > 0]


def reference(q, k, v, cu: list[int], grad):
    """float32 sdpa once per sample, causal: the output and dq, dk, dv."""
    import torch
    import torch.nn.functional as F

    q, k, v = (x.detach().float().requires_grad_() for x in (q, k, v))
    groups = q.shape[1] // k.shape[1]
    outs = []
    for a, b in zip(cu[:-1], cu[1:], strict=True):
        qs, ks, vs = (x[a:b].transpose(0, 1) for x in (q, k, v))
        ks, vs = ks.repeat_interleave(groups, 0), vs.repeat_interleave(groups, 0)
        outs.append(F.scaled_dot_product_attention(qs, ks, vs, is_causal=True).transpose(0, 1))
    out = torch.cat(outs)
    out.backward(grad.float())
    return out.detach(), q.grad, k.grad, v.grad


def run(kernel: str, q, k, v, cu, longest: int):
    import torch

    if kernel == "flash":
        return torch.ops.aten._flash_attention_forward(q, k, v, cu, cu, longest, longest, 0.0, True, False)[0]
    if kernel == "cudnn_rep":
        groups = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)
    got = torch.ops.aten._cudnn_attention_forward(
        q, k, v, None, cu, cu, longest, longest, True, 0.0, True, False
    )
    return got[0]


def direct(q, k, v, cu, longest: int, grad) -> dict:
    """cuDNN's forward and backward ops called directly, as a custom op would: each output's shape
    and dtype, and the backward's gradients against autograd's (already in q.grad, ...)."""
    import torch

    with torch.no_grad():
        got = torch.ops.aten._cudnn_attention_forward(
            q, k, v, None, cu, cu, longest, longest, True, 0.0, True, False
        )
        names = ("out", "lse", "cum_q", "cum_k", "max_q", "max_k", "seed", "offset", "debug")
        shapes = {
            n: [list(x.shape), str(x.dtype)] if isinstance(x, torch.Tensor) else x
            for n, x in zip(names, got, strict=True)
        }
        dq, dk, dv = torch.ops.aten._cudnn_attention_backward(
            grad, q, k, v, got[0], got[1], got[6], got[7], torch.empty(0, device=q.device), cu, cu,
            longest, longest, 0.0, True,
        )  # fmt: skip
    diffs = [
        (a.float() - b.float()).abs().max().item()
        for a, b in zip((dq, dk, dv), (q.grad, k.grad, v.grad), strict=True)
    ]
    return {"shapes": shapes, "direct_vs_autograd": diffs}


def measure(kernel: str, shape: str, total: int, longest: int, iters: int) -> dict:
    import torch

    heads, kv, d, _ = SHAPES[shape]
    lens = lengths(total, longest, 0)
    cu_list = [0]
    for n in lens:
        cu_list.append(cu_list[-1] + n)
    cu = torch.tensor(cu_list, dtype=torch.int32, device="cuda")
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(total, heads, d, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_()
    k = torch.randn(total, kv, d, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_()
    v = torch.randn(total, kv, d, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_()
    grad = torch.randn(total, heads, d, device="cuda", dtype=torch.bfloat16, generator=g)
    row = {"kernel": kernel, "shape": shape, "tokens": total, "samples": len(lens), "longest": max(lens)}
    try:
        out = run(kernel, q, k, v, cu, max(lens))
        out.backward(grad)
    except Exception as e:  # a kernel this torch or GPU refuses: say why, and go on
        return row | {"error": f"{type(e).__name__}: {str(e)[:300]}"}
    if kernel == "cudnn":
        try:
            row["outputs"] = direct(q, k, v, cu, max(lens), grad)
        except Exception as e:
            row["outputs"] = f"{type(e).__name__}: {str(e)[:300]}"
    ref = reference(q, k, v, cu_list, grad)
    row["max_abs_diff"] = {
        name: (got.float() - want).abs().max().item()
        for name, got, want in zip(("out", "dq", "dk", "dv"), (out, q.grad, k.grad, v.grad), ref, strict=True)
    }
    for _ in range(3):
        q.grad = k.grad = v.grad = None
        run(kernel, q, k, v, cu, max(lens)).backward(grad)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(iters):
        q.grad = k.grad = v.grad = None
        run(kernel, q, k, v, cu, max(lens)).backward(grad)
    end.record()
    torch.cuda.synchronize()
    seconds = start.elapsed_time(end) / 1e3 / iters
    flops = 3.5 * sum(2 * heads * d * n * n for n in lens)  # causal fwd = 2 H D n^2; bwd = 2.5x fwd
    return row | {"ms": 1e3 * seconds, "tflops": flops / seconds / 1e12}


def main() -> None:
    import torch

    p = argparse.ArgumentParser()
    p.add_argument("--shapes", default="0.5b,1.5b")
    p.add_argument("--kernels", default="flash,cudnn,cudnn_rep")
    p.add_argument("--tokens", type=int, default=16384)
    p.add_argument("--longest", type=int, default=4096)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--out", required=True)
    a = p.parse_args()
    rows = []
    for shape in a.shapes.split(","):
        for kernel in a.kernels.split(","):
            row = measure(kernel, shape, a.tokens, a.longest, a.iters)
            rows.append(row)
            print(json.dumps(row), flush=True)
    doc = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "cudnn": torch.backends.cudnn.version(),
        "rows": rows,
    }
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(doc, indent=2))


if __name__ == "__main__":
    main()
