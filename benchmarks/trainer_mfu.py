"""Trainer MFU at GPU scale: `rlfleet trainer --bench` against plain transformers, in one run.

Random-init Qwen2.5-0.5B and -1.5B shapes (vocab 151936), seq 4096, the same fake token ids and
tokens per optimizer step for both. Plain transformers is the usual loop: `model(...).loss`,
backward, fused AdamW, bf16 autocast over fp32 weights, sdpa attention. rlfleet is the real train
step (GRPO loss) with the configured levers. Each measurement runs in its own process so peak
memory and compile caches do not leak between them. MFU uses the formula in rlfleet/trainer/flops.py
for both (unpacked rows: one sample of seq a row). Writes one JSON with every run and prints the ratios:

    python benchmarks/trainer_mfu.py --shapes 0.5b,1.5b --out benchmarks/results/trainer_mfu_h100.json
    python benchmarks/trainer_mfu.py --shapes 1.5b --no-plain --variants levers --out ...levers.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from common import dump, rlfleet_cmd, table

SHAPES = {"0.5b": "qwen2.5-0.5b", "1.5b": "qwen2.5-1.5b"}  # rlfleet/trainer/shapes.py REAL
# Headline: everything that makes one GPU fast. reshard_after_forward only pays with > 1 GPU.
FAST = [
    "--trainer.compile",
    "true",
    "--trainer.lm-head-chunk",
    "8192",
    "--trainer.reshard-after-forward",
    "false",
]
VARIANTS = {
    "fast": [FAST],
    "fast_ac": [FAST, [*FAST, "--trainer.activation-checkpointing", "selective"]],
    # Peak memory with each lever on and off (compiled, 1 GPU).
    "levers": [
        [*FAST[:2], "--trainer.lm-head-chunk", "0", "--trainer.reshard-after-forward", "false"],
        FAST,
        [*FAST, "--trainer.activation-checkpointing", "selective"],
        [*FAST, "--trainer.activation-checkpointing", "full"],
        [*FAST, "--trainer.optimizer-offload", "true"],
    ],
}


def write_config(out: Path, shape: str) -> Path:
    """The shape's config.json (Qwen2.5's: tied embeddings, GQA with 2 KV heads, qkv bias) in `out`."""
    from rlfleet.trainer.shapes import real_config

    out.mkdir(parents=True, exist_ok=True)
    real_config(SHAPES[shape], dtype="float32").save_pretrained(out)
    return out


def plain(model_dir: str, seq: int, mbs: int, micro_batches: int, warmup: int, steps: int) -> dict:
    """The loop most people write: HF loss, autocast, fused AdamW."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from rlfleet.trainer.flops import model_flops, peak_flops

    torch.manual_seed(0)
    config = AutoConfig.from_pretrained(model_dir)
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32, attn_implementation="sdpa")
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=True)
    g = torch.Generator().manual_seed(0)
    data = [torch.randint(3, config.vocab_size, (mbs, seq), generator=g).cuda() for _ in range(micro_batches)]
    times, losses = [], []
    for i in range(warmup + steps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        total = 0.0
        for ids in data:
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = model(input_ids=ids, labels=ids, use_cache=False).loss
            (loss / len(data)).backward()
            total += float(loss)
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        if i >= warmup:
            times.append(time.perf_counter() - t0)
        losses.append(total / len(data))
    step_s = statistics.median(times)
    tps = micro_batches * mbs * seq / step_s
    return {
        "impl": "plain transformers",
        "micro_batch_size": mbs,
        "step_seconds": step_s,
        "step_seconds_all": times,
        "tokens_per_second": tps,
        "mfu": model_flops(config, tps, tps * seq)  # a second's rows: tps / seq samples of seq
        / peak_flops(torch.device("cuda")),
        "peak_memory_gib": torch.cuda.max_memory_allocated() / 2**30,
        "losses": losses,
    }


def rlfleet_bench(
    model_dir: str, seq: int, mbs: int, micro_batches: int, warmup: int, steps: int, extra: list[str]
) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "bench.json"
        cmd = rlfleet_cmd("trainer", "--bench", "--model.path", model_dir)
        cmd += ["--output-dir", str(Path(tmp) / "run"), "--bench.output-json", str(out)]
        cmd += ["--bench.seq-len", str(seq), "--bench.micro-batches", str(micro_batches)]
        cmd += ["--bench.micro-batch-size", str(mbs)]
        cmd += ["--bench.warmup-steps", str(warmup), "--bench.steps", str(steps), *extra]
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True)
        print(proc.stdout[-3000:], flush=True)
        if proc.returncode != 0:
            print(proc.stderr[-6000:], flush=True)
            return {"impl": "rlfleet", "args": extra, "error": proc.stderr[-2000:]}
        r = json.loads(out.read_text())
    return {"impl": "rlfleet", "args": extra, "wall_seconds": time.perf_counter() - t0, **r}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--shapes", default="0.5b,1.5b")
    p.add_argument("--seq", type=int, default=4096)
    p.add_argument("--micro-batches", type=int, default=4)
    p.add_argument("--micro-batch-size", type=int, default=1)
    p.add_argument(
        "--plain-micro-batch-size",
        type=int,
        help="plain transformers' rows per micro-batch (same tokens per step: more micro-batches)",
    )
    p.add_argument("--save-config", help="also write the shape's config.json here (for other benches)")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--variants", default="fast", choices=sorted(VARIANTS))
    p.add_argument("--no-plain", action="store_true")
    p.add_argument("--plain-only", help=argparse.SUPPRESS)  # child process: one plain run, JSON on stdout
    p.add_argument("--out", required=True)
    a = p.parse_args()
    if a.plain_only:
        print(
            "RESULT "
            + json.dumps(plain(a.plain_only, a.seq, a.micro_batch_size, a.micro_batches, a.warmup, a.steps))
        )
        return
    results = []
    env = {"torch": torch.__version__, "gpu": torch.cuda.get_device_name(0)}
    with tempfile.TemporaryDirectory() as tmp:
        for shape in a.shapes.split(","):
            model_dir = str(write_config(Path(tmp) / shape, shape))
            if a.save_config:
                write_config(Path(a.save_config) / shape, shape)
            if not a.no_plain:
                pmbs = a.plain_micro_batch_size or a.micro_batch_size
                cmd = [sys.executable, __file__, "--plain-only", model_dir, "--out", "-", "--seq", str(a.seq)]
                cmd += ["--micro-batches", str(a.micro_batches * a.micro_batch_size // pmbs)]
                cmd += ["--micro-batch-size", str(pmbs), "--warmup", str(a.warmup), "--steps", str(a.steps)]
                proc = subprocess.run(cmd, capture_output=True, text=True)
                line = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
                failed = {"impl": "plain transformers", "error": proc.stderr[-2000:]}
                r = json.loads(line[0][7:]) if line else failed
                results.append({"shape": shape, **r})
                print(json.dumps(results[-1])[:400], flush=True)
            for extra in VARIANTS[a.variants]:
                r = rlfleet_bench(
                    model_dir, a.seq, a.micro_batch_size, a.micro_batches, a.warmup, a.steps, extra
                )
                results.append({"shape": shape, **r})
                dump(a.out, {"env": env, "results": results})  # after each: a cut run keeps what it has
    rows = []
    for shape in a.shapes.split(","):
        done = [r for r in results if r["shape"] == shape and "error" not in r]
        base = next((r["tokens_per_second"] for r in done if r["impl"] == "plain transformers"), None)
        rows += [
            [shape, r["impl"], round(r["tokens_per_second"]), f"{r['mfu']:.1%}", r["peak_memory_gib"]]
            + [r["tokens_per_second"] / base if base else float("nan"), " ".join(r.get("args", []))]
            for r in done
        ]
    table(f"trainer step, seq {a.seq}", ["shape", "impl", "tok/s", "MFU", "peak GiB", "ratio", "args"], rows)


if __name__ == "__main__":
    main()
