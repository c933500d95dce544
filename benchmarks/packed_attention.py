"""Packed rows through the trainer's real step, before and after varlen attention, in one run.

For each shape (Qwen2.5 0.5B / 1.5B, random init), `rlfleet trainer --bench`'s step (FSDP on one
rank, GRPO loss, AdamW) on packed rows of a long-tail job's length mix, once per attention:
- `sdpa`: transformers' default, what the trainer ran before: restarting position ids build a dense
  block-diagonal mask, and sdpa with a mask has no flash kernel;
- `varlen`: the trainer's own (rlfleet/trainer/attention.py): FlashAttention-4 where it runs
  (Hopper / Blackwell with flash-attn-4), else torch's flash varlen kernel (FA2);
- `fa2`: the trainer's own with torch's FA2 even where FA4 runs.
Each in its own process (peak memory, allocator). Also, once per shape in bf16 on the GPU: each
sample's logprobs packed against the same sample alone (max abs difference).

    python benchmarks/packed_attention.py --shapes 0.5b,1.5b --out benchmarks/results/packed_attention_h200.json
    python benchmarks/packed_attention.py --plot benchmarks/results/trainer_packed_h200.json

`--plot JSON` draws JSON's rows (tokens/s, MFU on each bar) as the PNG beside it.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ATTENTIONS = ("sdpa", "varlen")


def one(model_dir: str, attention: str, seq: int, micro_batches: int, out: str) -> None:
    """In a child: the bench with `attention`."""
    from rlfleet.cli import main
    from rlfleet.trainer import train

    if attention == "sdpa":  # the trainer as it was: transformers' default attention on packed rows
        train.VARLEN = "sdpa"
    if attention == "fa2":  # varlen through torch's FlashAttention-2 even where FA4 runs
        from rlfleet.trainer import fa4

        fa4.available = lambda: "FA2 asked for (benchmarks/packed_attention.py)"
    argv = ["trainer", "--bench", "--model.path", model_dir, "--output-dir", str(Path(out).parent / "run")]
    argv += ["--bench.seq-len", str(seq), "--bench.micro-batches", str(micro_batches)]
    argv += ["--bench.output-json", out, "--bench.steps", "4"]
    if main(argv) != 0:
        raise SystemExit(1)


def agreement(model_dir: str) -> float:
    """Max |packed - alone| logprob over the loss tokens of 8 samples, bf16 on the GPU."""
    import torch

    from rlfleet.config.models import TrainerJobConfig
    from rlfleet.microbatches import PACK_DTYPES, PACK_PAD, pack_rows
    from rlfleet.trainer.loop import build

    cfg = TrainerJobConfig(model={"path": model_dir, "dtype": "bfloat16"}, output_dir="/tmp/agree")
    _, policy, _ = build(cfg, model_dir, random_init=True)
    g = torch.Generator().manual_seed(0)
    lengths = [3000, 1200, 700, 2500, 64, 400, 33, 290]
    seqs = [
        {"input_ids": torch.randint(3, 150000, (n,), generator=g).tolist(), "loss_mask": [1.0] * n}
        | {"old_logprobs": [0.0] * n, "advantages": [0.0] * n}
        for n in lengths
    ]
    row = pack_rows(seqs, [list(range(len(seqs)))], 8192, PACK_PAD, PACK_DTYPES)
    worst = 0.0
    with torch.no_grad():
        packed, _ = policy(row["input_ids"].cuda(), 1.0, row["position_ids"].cuda())
        at = 0
        for n, s in zip(lengths, seqs, strict=True):
            alone, _ = policy(torch.tensor([s["input_ids"]]).cuda())
            worst = max(worst, (packed[0, at : at + n - 1] - alone[0]).abs().max().item())
            at += n
    return worst


def plot(path: Path) -> None:
    """Bars of tokens/s per shape and attention (MFU written on each), from `rows` of `path`."""
    from common import bar, pyplot, save_png

    doc = json.loads(path.read_text())
    rows = doc["rows"]
    shapes = sorted({r["shape"] for r in rows})
    kinds = []
    for r in rows:
        kind = f"{r['attention']}{' compiled' if r['compile'] else ''}, bounds {r['bounds']}"
        if kind not in kinds:
            kinds.append(kind)
    fig, axes = pyplot().subplots(1, len(shapes), figsize=(5 * len(shapes), 4), squeeze=False)
    for ax, shape in zip(axes[0], shapes, strict=True):
        for i, kind in enumerate(kinds):
            for r in rows:
                if (
                    r["shape"] == shape
                    and kind.startswith(f"{r['attention']}{' compiled' if r['compile'] else ''},")
                    and kind.endswith(r["bounds"])
                ):
                    bar(
                        ax,
                        i,
                        r["tokens_per_second"] / 1e3,
                        f"{100 * r['mfu']:.0f}%",
                        color=f"C{i}",
                        label=kind,
                    )
        ax.set_title(f"{shape} shape, packed rows ({doc['device']})")
        ax.set_ylabel("trained tokens/s (k); MFU on the bar")
        ax.set_xticks([])
    axes[0][0].legend(fontsize=7, loc="upper left")
    save_png(fig, path.with_suffix(".png"))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--shapes", default="0.5b,1.5b")
    p.add_argument("--attentions", default=",".join(ATTENTIONS), help=f"of sdpa, fa2, varlen ({ATTENTIONS})")
    p.add_argument("--seq", type=int, default=16384, help="tokens a packed row (one row a micro-batch)")
    p.add_argument("--micro-batches", type=int, default=4)
    p.add_argument("--out", required=True)
    p.add_argument("--one", nargs=3, metavar=("MODEL", "ATTENTION", "OUT"), help=argparse.SUPPRESS)
    p.add_argument("--agree", help=argparse.SUPPRESS)
    p.add_argument("--plot", help="draw this results JSON as a PNG beside it, and stop")
    a = p.parse_args([*sys.argv[1:], "--out", "-"] if "--plot" in sys.argv else None)
    if a.plot:
        return plot(Path(a.plot))
    if a.one:
        return one(a.one[0], a.one[1], a.seq, a.micro_batches, a.one[2])
    if a.agree:
        print(json.dumps({"max_abs_diff": agreement(a.agree)}))
        return None
    sys.path.insert(0, str(Path(__file__).parent))
    from common import dump
    from trainer_mfu import write_config

    rows = []
    for shape in a.shapes.split(","):
        with tempfile.TemporaryDirectory() as tmp:
            model = str(write_config(Path(tmp) / shape, shape))
            row = {"shape": shape, "seq": a.seq}
            for attention in a.attentions.split(","):
                out = Path(tmp) / f"{attention}.json"
                cmd = [sys.executable, __file__, "--out", a.out, "--seq", str(a.seq)]
                cmd += ["--micro-batches", str(a.micro_batches), "--one", model, attention, str(out)]
                subprocess.run(cmd, check=True)
                row[attention] = json.loads(out.read_text())
            got = subprocess.run([sys.executable, __file__, "--out", a.out, "--agree", model],
                                 check=True, capture_output=True, text=True)  # fmt: skip
            row["packed_vs_alone_max_abs_logprob"] = json.loads(got.stdout.strip().splitlines()[-1])[
                "max_abs_diff"
            ]
            first, last = a.attentions.split(",")[0], a.attentions.split(",")[-1]
            row["speedup"] = row[last]["tokens_per_second"] / row[first]["tokens_per_second"]
            rows.append(row)
            said = " | ".join(
                f"{att} {row[att]['tokens_per_second']:,.0f} tok/s {100 * row[att]['mfu']:.1f}%"
                for att in a.attentions.split(",")
            )
            print(f"{shape}: {said} | {last}/{first} {row['speedup']:.2f}x | packed vs alone "
                  f"{row['packed_vs_alone_max_abs_logprob']:.3g}", flush=True)  # fmt: skip
    dump(a.out, {"rows": rows}, indent=2)
    return None


if __name__ == "__main__":
    main()
