"""The arithmetic example's RL with LoRA, on the 2-core CPU box: the SFT warm start and the 60 GRPO
steps of benchmarks/algorithms.py's `grpo` row, but the trainer trains rank-16 adapters (alpha 32) on
every attention and MLP projection of the frozen SFT model instead of every weight, at lr 1e-3 (LoRA
takes a few times full fine-tuning's lr: the example's full run uses 5e-4). vLLM gets the merged
weights every step. Eval pass@1 (greedy, the 200 problems of eval.jsonl) of the SFT weights before,
then every 10 steps; the full fine-tuning `grpo` row of results/algorithms_arith_cpu_2core.json is
copied beside it for comparison (a different run of the same box).

    python benchmarks/lora_arith.py --out benchmarks/results/lora_arith_cpu_2core.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from algorithms import ARITH, sft, variant
from common import ROOT, free_port, write

from rlfleet.store import layout

LORA = {"rank": 16, "alpha": 32, "lr": 1e-3}
ARGS = (
    "--trainer.lora.rank",
    str(LORA["rank"]),
    "--trainer.lora.alpha",
    str(LORA["alpha"]),
    "--trainer.lr",
    str(LORA["lr"]),
)


def eval_pass_at_1(weights: Path, out: Path) -> float:
    """`rlfleet eval` of `weights` as they are (the example's eval.toml): pass@1."""
    cmd = [sys.executable, "-m", "rlfleet.cli", "eval", "@", str(ARITH / "eval.toml"), "--checkpoint", "base"]
    cmd += ["--model.path", str(weights), "--output-dir", str(out), "--inference.port", str(free_port())]
    subprocess.run(cmd, cwd=ROOT, check=True)
    return json.loads((out / layout.eval_record(None)).read_text())["pass_rate"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--sft", help="an earlier SFT run's weights dir (weights/step_99)")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    a.out = str(Path(a.out).resolve())
    os.chdir(ROOT)  # the example's configs name their files from the repository root
    full = json.loads((ROOT / "benchmarks/results/algorithms_arith_cpu_2core.json").read_text())
    results: dict[str, Any] = {
        "command": f"python benchmarks/lora_arith.py --out {Path(a.out).relative_to(ROOT)}",
        "steps": a.steps,
        "lora": LORA,
        "full_finetuning_grpo": full["results"]["variants"]["grpo"],
    }
    with tempfile.TemporaryDirectory() as tmp_s:
        tmp = Path(tmp_s)
        weights = Path(a.sft) if a.sft else sft(tmp / "sft")
        results["pass_at_1_before"] = eval_pass_at_1(weights, tmp / "before")
        print("before RL: pass@1", results["pass_at_1_before"], flush=True)
        results["lora_grpo"] = variant("grpo", weights, tmp / "lora", a.steps, ARGS)
        print("LoRA grpo:", results["lora_grpo"], flush=True)
    write(a.out, results)


if __name__ == "__main__":
    main()
