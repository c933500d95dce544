"""torch.profiler over one step of the running trainer (`trainer.profile_step`).

The bench (`rlfleet trainer --bench`) times fake batches; this profiles the step the loop really
trains, with its batch's micro-batches, its host work between them and its optimizer, so the
breakdown in docs/benchmarks/trainer.md can be taken inside the loop.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator
from pathlib import Path

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

log = logging.getLogger("rlfleet.trainer")

# Device kernels by what they do, first match wins (the names of cuBLAS/cutlass GEMMs, torch's
# flash kernels, inductor's fused Triton kernels, NCCL, copies).
KINDS = (
    ("attention", ("flash", "fmha", "attention")),
    ("matmul", ("gemm", "nvjet", "cutlass", "xmma", "cublas", "aten::mm", "aten::addmm", "aten::bmm")),
    ("compiled (triton)", ("triton",)),
    ("collectives", ("nccl",)),
    ("copies", ("memcpy", "memset", "copy")),
)


def kind(name: str) -> str:
    low = name.lower()
    return next((k for k, keys in KINDS if any(key in low for key in keys)), "other")


def summary(events, wall: float, rows: int = 25) -> str:
    """The top ops by device time (by CPU time on a CPU), device time by kind, and how busy the
    device was: kernel time over wall time, well below 1 where the host cannot keep it fed.

    Kinds sum the device's own kernel events only: an op's device time is its kernels' time again."""
    kernels = [e for e in events if e.device_type != DeviceType.CPU]
    key = "self_device_time_total" if kernels else "self_cpu_time_total"
    by_kind: dict[str, float] = {}
    for e in kernels or events:
        by_kind[kind(e.key)] = by_kind.get(kind(e.key), 0.0) + getattr(e, key) / 1e6
    lines = [events.table(sort_by=key, row_limit=rows, max_name_column_width=70), ""]
    busy = sum(by_kind.values())
    lines.append(
        f"wall {wall:.3f} s" + (f", kernels {busy:.3f} s, device busy {busy / wall:.0%}" if kernels else "")
    )
    for k, sec in sorted(by_kind.items(), key=lambda kv: -kv[1]):
        lines.append(f"  {k:<18} {sec:8.3f} s {sec / (busy or 1.0):6.1%}")
    return "\n".join(lines) + "\n"


@contextlib.contextmanager
def profiled(out: Path | None) -> Iterator[None]:
    """Profile the block and write `summary` to `out`; a plain block where `out` is None."""
    if out is None:
        yield
        return
    cuda = torch.cuda.is_available()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        t0 = time.perf_counter()
        yield
        if cuda:
            torch.cuda.synchronize()
        wall = time.perf_counter() - t0
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(summary(prof.key_averages(), wall))
    log.info("profile of the train phase: %s", out)
