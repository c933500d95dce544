"""Varlen attention kernels on packed rows, forward + backward, against each other on one GPU.

The trainer's packed rows run torch's FlashAttention-2 varlen kernel (trainer/attention.py). On
Hopper, cuDNN's fused attention (in the same torch, no extra package) may be faster. For each
Qwen2.5 shape's attention (heads, KV heads, head_dim) on one packed row of a long-tail length mix,
bf16, this times forward + backward of:
- `flash`: `aten._flash_attention_forward` with the samples' cumulative lengths (today's kernel);
- `cudnn`: `aten._cudnn_attention_forward` with the same lengths, KV heads as they are (GQA);
- `cudnn_rep`: the same with KV heads repeated to the query's (if cuDNN refuses GQA);
- `fa4`: flash-attn-4's varlen function (CuTe DSL), where that package is installed;
- `fa4_aten`: torch's flash op with FA4 registered under it (`activate_flash_attention_impl`);
- `rlfleet` / `rlfleet_compiled`: the trainer's own choice (trainer/attention.py), eager and under
  `torch.compile(dynamic=True, fullgraph=True)`; with FA4 also a sliding-window check against FA2.
Each is checked against float32 sdpa run once per sample (max abs difference of the output and of
the three gradients), beside flash's own difference, so a wrong kernel shows as an outlier.

    python benchmarks/attention_kernels.py --out benchmarks/results/attention_kernels_h200.json
    python benchmarks/attention_kernels.py --plot results/attention_kernels.png results/attention_kernels_*.json
"""

from __future__ import annotations

import argparse
import json
import random
import time
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


_COMPILED: dict = {}


def rlfleet_kernel(compiled: bool):
    """The trainer's own choice (trainer/attention.py): FA4 where it runs, else torch's FA2."""
    import torch

    from rlfleet.trainer import attention

    attention.choose_kernel(torch.device("cuda"))
    fn = attention._fa4 if attention.FA4 else attention._flash
    if compiled:
        fn = _COMPILED.setdefault(fn, torch.compile(fn, dynamic=True, fullgraph=True))
    return fn


def window_check(shape: str, total: int, longest: int, window: int = 1024) -> dict:
    """FA4 against torch's FA2 under a sliding window (Gemma-3's local layers): outputs and grads."""
    import torch

    from rlfleet.trainer import attention

    heads, kv, d, _ = SHAPES[shape]
    lens = lengths(total, longest, 1)
    cu = torch.tensor([0] + [sum(lens[: i + 1]) for i in range(len(lens))], dtype=torch.int32, device="cuda")
    g = torch.Generator(device="cuda").manual_seed(1)
    base = [
        torch.randn(total, h, d, device="cuda", dtype=torch.bfloat16, generator=g) for h in (heads, kv, kv)
    ]
    grad = torch.randn(total, heads, d, device="cuda", dtype=torch.bfloat16, generator=g)
    got = []
    for fn in (attention._fa4, attention._flash):
        q, k, v = (x.clone().requires_grad_() for x in base)
        out = fn(q, k, v, cu, max(lens), None, window)
        out.backward(grad)
        got.append((out, q.grad, k.grad, v.grad))
    names = ("out", "dq", "dk", "dv")
    return {n: (a.float() - b.float()).abs().max().item() for n, a, b in zip(names, *got, strict=True)}


def run(kernel: str, q, k, v, cu, longest: int):
    import torch

    if kernel.startswith("rlfleet"):
        return rlfleet_kernel(kernel == "rlfleet_compiled")(q, k, v, cu, longest, None, None)

    if kernel == "flash":
        return torch.ops.aten._flash_attention_forward(q, k, v, cu, cu, longest, longest, 0.0, True, False)[0]
    if kernel == "fa4":  # flash-attn-4 (CuTe DSL, JIT-compiled), if installed
        from flash_attn.cute.interface import flash_attn_varlen_func

        out = flash_attn_varlen_func(
            q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=longest, max_seqlen_k=longest, causal=True
        )
        return out[0] if isinstance(out, tuple) else out
    if kernel == "fa4_aten":  # torch's own flash op with FA4's kernels registered under it (torch >= 2.11?)
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


def plot(png: str, files: list[str]) -> None:
    """Bars of TFLOP/s per shape and kernel, from every row of `files` that ran (a kernel measured
    in several files: its first row); a kernel whose gradients are wrong is marked on its bar."""
    from common import pyplot, save_png

    rows: dict[tuple[str, str], dict] = {}
    for f in files:
        for r in json.loads(Path(f).read_text())["rows"]:
            if "tflops" in r:
                rows.setdefault((r["shape"], r["kernel"]), r)
    shapes = sorted({s for s, _ in rows})
    kernels = list(dict.fromkeys(k for _, k in rows))
    fig, ax = pyplot().subplots(figsize=(2.2 + 1.6 * len(shapes) * len(kernels) / 3, 3.8))
    width = 0.8 / len(kernels)
    for i, kernel in enumerate(kernels):
        for j, shape in enumerate(shapes):
            r = rows.get((shape, kernel))
            if r is None:
                continue
            x = j + i * width
            ax.bar(x, r["tflops"], width, color=f"C{i}", label=kernel if j == 0 else None)
            wrong = max(r["max_abs_diff"].values()) > 1.0  # flash's own: < 0.05
            ax.text(x, r["tflops"], "wrong grads" if wrong else f"{r['tflops']:.0f}", ha="center", va="bottom",
                    fontsize=7, rotation=90 if wrong else 0)  # fmt: skip
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(shapes))], [f"{s} heads" for s in shapes])
    ax.set_ylabel("TFLOP/s, causal forward + backward")
    ax.set_title("varlen attention on one packed row of 16,384 tokens, one H200, bf16", fontsize=9)
    ax.legend(fontsize=7)
    save_png(fig, png)


def main() -> None:
    import sys

    if sys.argv[1:2] == ["--plot"]:
        return plot(sys.argv[2], sys.argv[3:])
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
            if kernel == "fa4_aten":
                try:
                    from torch.nn.attention import activate_flash_attention_impl

                    activate_flash_attention_impl("FA4")
                except Exception as e:
                    print(
                        json.dumps({"kernel": kernel, "error": f"{type(e).__name__}: {e}"[:300]}), flush=True
                    )
                    continue
            row = measure(kernel, shape, a.tokens, a.longest, a.iters)
            if kernel == "rlfleet":
                from rlfleet.trainer import attention

                row["chose"] = attention.choose_kernel(torch.device("cuda"))
                if attention.FA4:
                    row["window_fa4_vs_fa2"] = window_check(shape, a.tokens, a.longest)
            if kernel == "fa4_aten":
                from torch.nn.attention import restore_flash_attention_impl

                restore_flash_attention_impl()
            rows.append(row)
            print(json.dumps(row), flush=True)
    doc = {
        "date": time.strftime("%Y-%m-%d"),
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "cudnn": torch.backends.cudnn.version(),
        "rows": rows,
    }
    from common import dump

    dump(a.out, doc, indent=2)


if __name__ == "__main__":
    main()
