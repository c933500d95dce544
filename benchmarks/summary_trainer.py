"""The benchmarks table's trainer and four-GPU headlines (benchmarks/summarize.py): the trainer
against plain transformers, packed rows through varlen attention, and the 4x H200 scaling runs."""

from __future__ import annotations

from typing import Any

from summary_rows import Row, date, load, machine, ratio


def host(doc: dict[str, Any], gpus: int) -> str:
    """The host a GPU result ran on, from the device its JSON names: "4x H200"."""
    return f"{gpus}x {doc['device'].removeprefix('NVIDIA ')}"


def best_of_four(doc: dict[str, Any]) -> str:
    """The scaling JSON's 4-GPU layout with the most trained tokens/s."""
    rows = doc["rows"]
    return max((n for n in rows if doc["layouts"][n]["gpus"] == 4), key=lambda n: rows[n]["tokens_per_s"])


def trainer_mfu() -> list[Row]:
    """The trainer's step against plain transformers on the same host (1.5B shape, seq 4096)."""
    doc = load("trainer_mfu_h100_mbs4x4.json")
    by = {(r["shape"], r["impl"]): r for r in doc["results"]}
    mine, plain = by[("1.5b", "rlfleet")], by[("1.5b", "plain transformers")]
    return [
        Row(
            "Trainer MFU, 1.5B shape, 4 x 4096-token rows per micro-batch",
            f"{mine['mfu']:.1%} ({mine['tokens_per_second']:,.0f} tokens/s)",
            f"plain transformers: {plain['mfu']:.1%}",
            ratio(mine["tokens_per_second"] / plain["tokens_per_second"]),
            date(doc, "2026-11-23"),
            machine(doc["env"]),
            "python benchmarks/trainer_mfu.py --shapes 1.5b,0.5b --micro-batch-size 4 --micro-batches 4 "
            "--plain-micro-batch-size 2 --variants fast --warmup 2 --steps 5 --out ...",
            "benchmarks/trainer.md#one-host-sync-per-step-lm-head-chunk-8192-4-micro-batches-per-step-2026-11-23-h100",
        )
    ]


def trainer_packed() -> list[Row]:
    """The trainer's step on packed rows of a long-tail mix: varlen attention, compiled, against the
    trainer as it was (transformers' sdpa with a dense block-diagonal mask), one run on one host;
    and the train phase inside the loop (its step metrics)."""
    doc = load("trainer_packed_h200.json")
    rows = []
    for shape in ("0.5b", "1.5b"):
        by = {(r["attention"], r["compile"]): r for r in doc["rows"] if r["shape"] == shape}
        now, before = by[("varlen", True)], by[("sdpa", False)]
        rows.append(
            Row(
                f"Trainer step on packed rows ({shape[:-1]}B shape, samples up to 4,096 tokens), trained tokens/s",
                f"{now['tokens_per_second']:,.0f} ({now['mfu']:.1%} MFU)",
                f"the trainer before (sdpa, dense mask): {before['tokens_per_second']:,.0f} ({before['mfu']:.1%})",
                ratio(now["tokens_per_second"] / before["tokens_per_second"]),
                doc["date"],
                host(doc, 1),
                "python benchmarks/packed_attention.py --shapes 0.5b,1.5b --out ...; "
                "rlfleet trainer --bench --model.path DIR --bench.output-json ...",
                "benchmarks/trainer.md#packed-rows-through-varlen-attention-2026-11-27",
            )
        )
    kernels = load("attention_kernels_fa4_h200.json")
    for shape in ("0.5b", "1.5b"):
        by = {r["kernel"]: r for r in kernels["rows"] if r["shape"] == shape}
        rows.append(
            Row(
                f"Varlen attention on a packed row ({shape[:-1]}B shape's heads, 16,384 tokens), "
                "causal forward + backward TFLOP/s",
                f"FlashAttention-4: {by['fa4']['tflops']:.0f}",
                f"torch's FlashAttention-2: {by['flash']['tflops']:.0f}",
                ratio(by["fa4"]["tflops"] / by["flash"]["tflops"]),
                kernels["date"],
                host(kernels, 1),
                "python benchmarks/attention_kernels.py --shapes 0.5b,1.5b --kernels flash,fa4 --out ...",
                "benchmarks/trainer.md#flashattention-4-for-packed-rows-2026-11-28",
            )
        )
    loop = load("trainer_in_loop_h100_05b.json")
    steady = [s for s in loop["steps"] if s["step"] > 0]
    tps = sorted(s["train_tokens_per_s"] for s in steady)
    mfu = sorted(s["mfu"] for s in steady)
    rows.append(
        Row(
            "Trainer inside the long-tail loop (0.5B shape, one shared GPU, k = 1), steps 1-5: "
            "trained tokens/s in the train phase",
            f"{tps[0]:,.0f}-{tps[-1]:,.0f} ({mfu[0]:.0%}-{mfu[-1]:.0%} MFU, padding "
            f"{max(s['padding_frac'] for s in steady):.0%})",
            "-",
            "-",
            loop["date"],
            "1x H100",
            "python benchmarks/long_tail.py --device cuda --shape 05b --steps 6 --only rlfleet --no-peak "
            "--eos-rate 0.002 --variants ... --out ...",
            "benchmarks/trainer.md#inside-the-loop-2026-11-27-one-h100-shared-by-vllm-and-the-trainer",
        )
    )
    return rows


def scaling() -> list[Row]:
    """The 4-GPU table (benchmarks/scaling.py): the trainer's in-loop MFU on its own GPU and on a
    shared one, and the best 4-GPU layout against one GPU."""
    doc = load("scaling_h200x4_05b_4steps.json")
    rows, env = doc["rows"], doc["layouts"]["shared-1"]["result"]["env"]
    four = host(doc, 4)
    cmd = "python benchmarks/scaling.py --shape 05b --steps 4 --no-peak --out ..."
    page = "benchmarks/scaling.md"
    own, shared = rows["split-2-nccl"], rows["shared-1"]
    best = best_of_four(doc)
    return [
        Row(
            "Trainer inside the long-tail loop (0.5B shape, k = 1, FlashAttention-4, 8 rows a micro-batch), "
            "median MFU of steps 1-3",
            f"own GPU: {own['trainer_mfu']:.1%}; GPU shared with vLLM: {shared['trainer_mfu']:.1%}",
            "published in-loop: prime-rl 11-27%, TRL AsyncGRPO ~9%",
            "-",
            date(env),
            four,
            cmd,
            page,
        ),
        Row(
            f"Long-tail job (0.5B shape, 4 steps), trained tokens/s: best 4-GPU layout ({best}) against 1 GPU",
            f"{rows[best]['tokens_per_s']:,.0f}",
            f"1 GPU: {shared['tokens_per_s']:,.0f}",
            ratio(rows[best]["tokens_per_s"] / shared["tokens_per_s"]),
            date(env),
            four,
            cmd,
            page,
        ),
        *weak_scaling(),
    ]


def weak_row(name: str, anchor: str) -> Row:
    """One weak-scaling run (`--batch-per-gpu 32`, 32 prompts per GPU): its best 4-GPU layout's
    trained tokens/s against one GPU's x 4."""
    doc = load(name)
    rows, env = doc["rows"], doc["layouts"]["shared-1"]["result"]["env"]
    one, k = rows["shared-1"], doc.get("max_async_level") or 1
    best = best_of_four(doc)
    return Row(
        f"Long-tail job (0.5B shape, {doc['steps']} steps, k = {k}), 32 prompts per GPU: best 4-GPU layout "
        f"({best}), trained tokens/s against 1 GPU x 4",
        f"{rows[best]['tokens_per_s']:,.0f} ({rows[best]['efficiency']:.0%} of linear)",
        f"1 GPU: {one['tokens_per_s']:,.0f}",
        ratio(rows[best]["tokens_per_s"] / one["tokens_per_s"]),
        date(env),
        host(doc, 4),
        f"python benchmarks/scaling.py --shape 05b --steps {doc['steps']} --no-peak --batch-per-gpu 32 "
        + (f"--max-async-level {k} " if k != 1 else "")
        + "--out ...",
        f"benchmarks/scaling.md#{anchor}",
    )


def weak_scaling() -> list[Row]:
    """The same job with 32 prompts per GPU, at k = 1 and k = 2; and the 1.5B shape's in-loop MFU on
    one shared GPU, run beside the first's lanes."""
    big = load("scaling_h200x4_15b_3steps.json")
    b = big["rows"]["shared-1"]
    return [
        weak_row(
            "scaling_h200x4_05b_4steps_bpg32.json", "weak-scaling-32-prompts-a-step-per-gpu-2026-11-28-later"
        ),
        weak_row("scaling_h200x4_05b_6steps_bpg32_k2.json", "two-steps-in-flight-k-2-6-steps-2026-11-29"),
        Row(
            "Trainer inside the long-tail loop at the 1.5B shape (one GPU shared with vLLM, k = 1, "
            "FlashAttention-4), median MFU of steps 1-2",
            f"{b['trainer_mfu']:.1%}",
            "published in-loop: prime-rl 11-27%, TRL AsyncGRPO ~9%",
            "-",
            date(big["layouts"]["shared-1"]["result"]["env"]),
            host(big, 4),
            "python benchmarks/scaling.py --shape 15b --steps 3 --no-peak --only shared-1 --out ...",
            "benchmarks/trainer.md#in-the-loop-on-a-4x-h200-host-2026-11-28-later",
        ),
    ]
