"""LoRA against full fine-tuning in the rlfleet trainer step, in one run: tokens/s and peak memory.

The real train step (`rlfleet trainer --bench`: GRPO loss, fake batches, random-init weights) at
Qwen2.5-1.5B's shape (benchmarks/trainer_mfu.py's `1.5b`: vocab 151936, tied embeddings), once
fine-tuning every weight and once with `[trainer.lora]` at rank 16 (alpha 32, the config's default
targets: q/k/v/o and gate/up/down of every layer; the embeddings and the tied LM head stay frozen).
Both rows run with the same levers (trainer_mfu's FAST: compiled layers, the chunked LM head),
the same seq, micro-batch size and micro-batches, each in its own process, so peak memory
(torch.cuda.max_memory_allocated of that process) and compile caches start clean. Each
`--micro-batch-sizes` value gives one pair. If a row fails with compile on, the pair is measured
again without compile (`fallback`) so one run still gives a like-for-like ratio.
MFU is the bench's, full fine-tuning's FLOPs for both rows: for LoRA it is tokens/s on the same
scale, not its own utilisation (it skips the frozen weights' gradient matmuls).

Goal (issue 32): LoRA >= 1.8x the tokens/s, <= 0.6x the peak memory of full fine-tuning. The
weight-sync seconds per step under LoRA come from the RL loop instead (merged weights to vLLM):
benchmarks/gpu_loop.py --shapes 15b --transports cuda_ipc -- --trainer.lora.rank 16

    python benchmarks/lora_vs_full.py --out benchmarks/results/lora_vs_full_h100.json
    python benchmarks/lora_vs_full.py --micro-batch-sizes 1,4 --out ...  # two pairs
    python benchmarks/lora_vs_full.py --device cpu --out /tmp/lora_cpu.json  # smoke test, tiny shape
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import Any

import trainer_mfu
from common import table, write
from trainer_mfu import FAST, rlfleet_bench, write_config

LORA = ["--trainer.lora.rank", "16"]  # alpha 32, dropout 0, default targets: LoraConfig's defaults
GOAL = {"tokens_per_second_x": 1.8, "peak_memory_x": 0.6}
# --device cpu: a small body on the 1.5B's vocabulary, only to run every path once
trainer_mfu.SHAPES.setdefault(
    "cpu", dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=2, intermediate_size=256)
)


def without_compile(levers: list[str]) -> list[str]:
    """`levers` with `--trainer.compile true` turned off."""
    out = list(levers)
    for i, x in enumerate(out[:-1]):
        if x == "--trainer.compile":
            out[i + 1] = "false"
    return out


def pair(
    model_dir: str, seq: int, mbs: int, micro_batches: int, warmup: int, steps: int, levers: list[str]
) -> dict[str, dict[str, Any]]:
    """Full fine-tuning, then LoRA, each `rlfleet trainer --bench` in its own process."""
    rows = {}
    for variant, extra in (("full", levers), ("lora", [*levers, *LORA])):
        r = rlfleet_bench(model_dir, seq, mbs, micro_batches, warmup, steps, extra)
        rows[variant] = {"variant": variant, "micro_batch_size": mbs, **r}
        status = (
            r.get("error", "")[-300:]
            or f"{r['tokens_per_second']:,.0f} tok/s, {r['peak_memory_gib']:.2f} GiB"
        )
        print(f"mbs {mbs} {variant}: {status}", flush=True)
    return rows


def ratio(rows: dict[str, dict[str, Any]]) -> dict[str, Any]:
    full, lora = rows["full"], rows["lora"]
    if "error" in full or "error" in lora:
        return {"error": "a row failed"}
    r = {
        "tokens_per_second_x": lora["tokens_per_second"] / full["tokens_per_second"],
        "step_seconds_x": lora["step_seconds"] / full["step_seconds"],
        "peak_memory_x": lora["peak_memory_gib"] / full["peak_memory_gib"]
        if full["peak_memory_gib"]
        else None,
        "peak_reserved_x": lora["peak_reserved_gib"] / full["peak_reserved_gib"]
        if full["peak_reserved_gib"]
        else None,
    }
    r["meets_tokens_per_second_goal"] = r["tokens_per_second_x"] >= GOAL["tokens_per_second_x"]
    r["meets_memory_goal"] = r["peak_memory_x"] is not None and r["peak_memory_x"] <= GOAL["peak_memory_x"]
    return r


def measured(
    model_dir: str, a: argparse.Namespace, mbs: int, levers: dict[str, Any], fallback: bool
) -> dict[str, Any]:
    """One full/LoRA pair at micro-batch size `mbs`, with its ratio."""
    rows = pair(model_dir, a.seq, mbs, a.micro_batches, a.warmup, a.steps, levers)
    return {"micro_batch_size": mbs, "levers": levers, "fallback": fallback, **rows, "ratio": ratio(rows)}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--shape", default="1.5b", choices=sorted(trainer_mfu.SHAPES))
    p.add_argument("--seq", type=int, default=4096)
    p.add_argument("--micro-batches", type=int, default=4)
    p.add_argument("--micro-batch-sizes", default="1", help="one full/LoRA pair per value")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    p.add_argument("--out", required=True)
    a = p.parse_args()
    levers = list(FAST)
    if a.device == "cpu":  # smoke test: the tiny shape, short rows, eager (compile on CPU is minutes)
        levers = ["--trainer.device", "cpu", *without_compile(FAST)]
        if a.shape != "cpu":
            a.shape, a.seq, a.warmup, a.steps = "cpu", min(a.seq, 128), 1, 2
    results: dict[str, Any] = {
        "config": {
            "shape": a.shape,
            "model": trainer_mfu.SHAPES[a.shape],
            "seq": a.seq,
            "micro_batches": a.micro_batches,
            "warmup": a.warmup,
            "steps": a.steps,
            "levers": levers,
            "lora": LORA,
            "goal": GOAL,
        },
        "pairs": [],
    }
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = str(write_config(Path(tmp) / a.shape, a.shape))
        for mbs in [int(x) for x in a.micro_batch_sizes.split(",")]:
            entry = measured(model_dir, a, mbs, levers, fallback=False)
            if "error" in entry["ratio"] and without_compile(levers) != levers:
                results["pairs"].append(entry)  # the failed pair stays in the JSON
                write(a.out, results)
                entry = measured(model_dir, a, mbs, without_compile(levers), fallback=True)
            results["pairs"].append(entry)
            write(a.out, results)  # after every pair: a later failure keeps what was measured
    body = []
    for e in results["pairs"]:
        for v in ("full", "lora"):
            r = e[v]
            if "error" in r:
                body.append([f"mbs {e['micro_batch_size']} {v}", "error", "", "", "", "", ""])
                continue
            x = e["ratio"] if v == "lora" and "error" not in e["ratio"] else {}
            body.append(
                [
                    f"mbs {e['micro_batch_size']} {v}" + (" (eager)" if e["fallback"] else ""),
                    r["step_seconds"],
                    f"{r['tokens_per_second']:,.0f}",
                    "-" if r.get("mfu") is None else f"{100 * r['mfu']:.1f}%",
                    r["peak_memory_gib"],
                    f"{x['tokens_per_second_x']:.2f}x" if x else "",
                    f"{x['peak_memory_x']:.2f}x" if x and x["peak_memory_x"] is not None else "",
                ]
            )
    table(
        f"LoRA r16 vs full fine-tuning, {a.shape} shape, seq {a.seq} x {a.micro_batches} micro-batches "
        f"(goal >= {GOAL['tokens_per_second_x']}x tokens/s, <= {GOAL['peak_memory_x']}x memory)",
        ["run", "step s", "tokens/s", "MFU", "peak GiB", "tok/s vs full", "mem vs full"],
        body,
    )


if __name__ == "__main__":
    main()
