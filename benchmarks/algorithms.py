"""The arithmetic example (SFT warm start, then 60 RL steps) under each built-in loss, with and
without dynamic sampling: eval pass@1 along the run, the groups dynamic sampling dropped and
refilled, the median step. Issue 31's table; no variant is expected to win.

One SFT run (or `--sft DIR`, an earlier one's `weights/step_99`), then one `rl` run per variant,
one after the other, each with examples/arithmetic/{rl,eval}.toml and the variant's overrides:
  grpo        today's loss (token-level PPO-clip, clip-higher), GRPO advantages
  dr_grpo     the same term, constant normaliser, advantages without std (`advantage.std_normalize`)
  gspo        sequence-level ratio, GSPO's clip range, sequence-mean aggregation
  cispo       clipped IS weight with a stop-gradient, every token keeps its gradient
each `+ds`: `orchestrator.shaping.dynamic_sampling` (zero-variance groups held aside, refilled).

    python benchmarks/algorithms.py --out benchmarks/results/algorithms_arith_cpu_2core.json
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from common import ROOT, free_port, median, run_rl, table, write

from rlfleet.config.loader import load
from rlfleet.config.models import RLConfig
from rlfleet.store import RunStore, layout
from rlfleet.store.records import read_rollout_manifest

ARITH = ROOT / "examples" / "arithmetic"
LOSSES: dict[str, list[str]] = {
    "grpo": [],
    "dr_grpo": ["--loss.type", "dr_grpo", "--advantage.std-normalize", "false"],
    "gspo": ["--loss.type", "gspo"],
    "cispo": ["--loss.type", "cispo"],
}
DYNAMIC = ["--orchestrator.shaping.dynamic-sampling", "true"]


def sft(out: Path) -> Path:
    subprocess.run([sys.executable, str(ARITH / "make_data.py")], cwd=ROOT, check=True)
    cmd = [sys.executable, "-m", "rlfleet.cli", "sft", "@", str(ARITH / "sft.toml")]
    subprocess.run(
        [*cmd, "--model.path", str(ROOT / "models/tiny"), "--output-dir", str(out)], cwd=ROOT, check=True
    )
    return out / layout.step_dir(layout.WEIGHTS, 99)


def variant(name: str, weights: Path, out: Path, steps: int, extra: tuple[str, ...] = ()) -> dict[str, Any]:
    """One `rl` run of the variant `name` from `weights`; `extra`: more overrides (benchmarks/lora_arith.py)."""
    loss, dynamic = name.removesuffix("+ds"), name.endswith("+ds")
    args = [
        "@",
        str(ARITH / "rl.toml"),
        "@",
        str(ARITH / "eval.toml"),
        *LOSSES[loss],
        *(DYNAMIC if dynamic else []),
        *extra,
    ]
    args += ["--model.path", str(weights), "--output-dir", str(out), "--max-steps", str(steps)]
    args += ["--inference.port", str(free_port()), "--wandb.mode", "disabled"]
    records, wall = run_rl(load(RLConfig, args))
    store = RunStore(str(out))
    evals = {s: store.read_json(layout.eval_record(s))["pass_rate"] for s in store.json_steps(layout.EVALS)}
    shaping = [read_rollout_manifest(store, r["step"]).get("shaping", {}) for r in records]
    return {
        "pass_at_1": dict(sorted(evals.items())),
        "final_pass_at_1": evals[max(evals)] if evals else None,
        "dropped_zero_variance": sum(s.get("dropped_zero_variance", 0) for s in shaping),
        "refilled": sum(s.get("refilled", 0) for s in shaping),
        "zero_variance_groups_trained": sum(s.get("zero_variance_groups", 0) for s in shaping),
        "reward_first3": sum(r["mean_reward"] for r in records[:3]) / 3,
        "reward_last3": sum(r["mean_reward"] for r in records[-3:]) / 3,
        "median_step_s": median([r["step_seconds"] for r in records]),
        "wall_s": wall,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--sft", help="an earlier SFT run's weights dir (weights/step_99)")
    ap.add_argument("--only", nargs="*", help="variants to run (default: all)")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    a.out = str(Path(a.out).resolve())
    os.chdir(ROOT)  # the example's configs name their files from the repository root
    names = a.only or [n + s for n in LOSSES for s in ("", "+ds")]
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp_s:
        tmp = Path(tmp_s)
        weights = Path(a.sft) if a.sft else sft(tmp / "sft")
        for name in names:
            results[name] = variant(name, weights, tmp / name.replace("+", "_"), a.steps)
            print(name, results[name], flush=True)
            write(a.out, {"steps": a.steps, "variants": results})
    cols = [
        "final_pass_at_1",
        "dropped_zero_variance",
        "refilled",
        "reward_first3",
        "reward_last3",
        "median_step_s",
    ]
    table(
        f"arithmetic, {a.steps} RL steps after SFT",
        ["variant", *cols],
        [[n, *(r[c] for c in cols)] for n, r in results.items()],
    )


if __name__ == "__main__":
    main()
