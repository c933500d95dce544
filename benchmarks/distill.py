"""Issue 45's measured comparison: a SmolLM2-135M student learning one-digit addition
(examples/smollm2/rl.toml) by RL, by on-policy distillation from a teacher, and by both, per step and
per second. The teacher is the same model after RL on the task (phase 1 of this script, or `--teacher`).
Not yet run on GPUs; on 2 CPU cores: benchmarks/results/distill_cpu_2core.json.

    python benchmarks/distill.py --out benchmarks/results/distill_h100x2.json              # 2+ GPUs
    python benchmarks/distill.py --out /tmp/d.json --teacher-steps 2 --steps 2 --device cpu  # a smoke run

Other `--section.key value` arguments override every run's config (e.g. `--eval.num-examples 50`).

Arms (same seed, same prompts): `rl` (the task's reward only; without it in `--arms`, the
teacher's own run stands for it), `distill` (`loss.distill` with `with_reward = false`: the
teacher's per-token term only; the reward is still computed, so the curves compare), `mixed` (both).
The distill arms turn dynamic sampling off (config/models.py refuses it with `loss.distill`). An arm
whose run already finished in `--work` is read back, not run again: a cut benchmark goes on. On GPUs
the policy and trainer share GPU 0 (colocated) and the teacher gets GPU 1 (`--teacher-gpus 1`);
`--teacher-gpus 0` serves it on the CPU.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

from common import ROOT, free_port, pyplot, run_rl, save_png, write
from common import steps as step_records

from rlfleet.config.loader import load
from rlfleet.config.models import RLConfig
from rlfleet.store import RunStore, layout

EXAMPLE = ROOT / "examples" / "smollm2" / "rl.toml"


def config(
    a: argparse.Namespace, out: Path, steps: int, extra: list[str], toml: Path | None = None
) -> RLConfig:
    gpu = a.device == "cuda"
    args = ["@", str(EXAMPLE)] + (["@", str(toml)] if toml else [])
    args += [
        "--model.path", a.model, "--output-dir", str(out), "--max-steps", str(steps),
        "--trainer.checkpoint-interval", str(steps),
        "--eval.interval", str(a.eval_interval or max(steps // 2, 1)),
        "--inference.port", str(free_port()), "--wandb.mode", "disabled",
    ]  # fmt: skip
    if gpu:
        # policy and trainer share GPU 0, the teacher takes GPU 1
        args += ["--deployment.placement", "colocated", "--deployment.num-inference-gpus", "1"]
        args += ["--deployment.num-train-gpus", "1"]
    return load(RLConfig, args + a.overrides + extra)


def teacher_toml(path: str, a: argparse.Namespace, with_reward: bool, out: Path) -> Path:
    toml = out / f"teacher_{with_reward}.toml"
    toml.write_text(
        f'[[served]]\nname = "teacher"\npath = "{path}"\nnum_gpus = {a.teacher_gpus}\n\n'
        f'[loss.distill]\nteacher = "teacher"\ncoef = {a.coef}\nwith_reward = {str(with_reward).lower()}\n'
    )
    return toml


def curve(out: Path, steps: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per step: the task's reward, greedy pass@1 where evaluated, the teacher gap, the clock, and
    the seconds the step's groups waited for the teacher (summed over groups, which overlap)."""
    store, t0 = RunStore(out), (steps[0]["finished_at"] - steps[0]["step_seconds"]) if steps else 0.0
    rows, teacher_ms, eval_s = [], 0, 0.0
    for s in steps:
        eval_s += s.get("phase_seconds", {}).get("eval", 0.0)
        metrics = store.read_json(layout.step_json("metrics", s["step"]))
        stream = store.manifest(layout.step_dir(layout.ROLLOUTS, s["step"]))["stream"]
        rows.append(
            {
                "step": s["step"],
                "mean_reward": s["mean_reward"],
                "pass@1": {e: v["pass@1"] for e, v in s.get("eval", {}).items()},
                "distill_kl": metrics.get("distill_kl"),
                "step_seconds": s["step_seconds"],
                "teacher_s": (stream.get("teacher_ms", 0) - teacher_ms) / 1000,
                "elapsed_s": s["finished_at"] - t0,
                "train_s": s["finished_at"] - t0 - eval_s,  # the loop's seconds, evals left out
                "tokens": s["num_completion_tokens"],
            }
        )
        teacher_ms = stream.get("teacher_ms", 0)
    return rows


def done(out: Path, steps: int | None = None) -> list[dict[str, Any]] | None:
    """An arm's finished run in `out`, its step records, so that a rerun of this script reuses it;
    None if there is none (or it has fewer than `steps` steps)."""
    if not (out / "summary.json").exists():
        return None
    records = step_records(out)
    return records if records and (steps is None or len(records) >= steps) else None


def arm(out: Path, steps: list[dict[str, Any]]) -> dict[str, Any]:
    """An arm's curve and figures; `loop_s`: its first step's start to its last step's end (a run
    read back and one just run alike)."""
    rows = curve(out, steps)
    return {
        "loop_s": steps[-1]["finished_at"] - steps[0]["finished_at"] + steps[0]["step_seconds"],
        "base_pass@1": RunStore(out).read_json("evals/base.json")["pass_rate"]
        if (out / "evals/base.json").exists()
        else None,
        "curve": rows,
        "last3_mean_reward": statistics.fmean(r["mean_reward"] for r in rows[-3:]),
        "median_step_s": statistics.median(r["step_seconds"] for r in rows),
        "median_teacher_s": statistics.median(r["teacher_s"] for r in rows),
    }


def reached(rows: list[dict[str, Any]], target: float) -> dict[str, Any] | None:
    """The first row whose greedy pass@1 (mean over envs) reached `target`, or None."""
    return next((r for r in rows if r["pass@1"] and statistics.fmean(r["pass@1"].values()) >= target), None)


def summary(results: dict[str, Any]) -> dict[str, Any]:
    """Issue 45's figure: steps to 90% of the teacher's final pass@1, distillation against RL."""
    teacher = [r for r in results["teacher"]["curve"] if r["pass@1"]][-1] if "teacher" in results else None
    if teacher is None:
        return {}
    target = 0.9 * statistics.fmean(teacher["pass@1"].values())
    at = {name: reached(a["curve"], target) for name, a in results["arms"].items()}
    if results["arms"].get("rl") is not results["teacher"]:  # the teacher's run is RL alone too
        at["teacher_run"] = reached(results["teacher"]["curve"], target)
    steps = {k: r["step"] + 1 for k, r in at.items() if r}
    seconds = {k: round(r["train_s"], 1) for k, r in at.items() if r}
    over_rl = {k: v / steps["rl"] for k, v in steps.items() if k != "rl" and "rl" in steps}
    return {
        "teacher_pass@1": target / 0.9,
        "target_pass@1": target,
        "steps_to_target": steps,
        "steps_over_rl": over_rl,
        "train_s_to_target": seconds,
        "goal_met": over_rl.get("distill", 1.0) <= 1 / 3,  # issue 45: <= 1/3 of RL's steps
    }


def plot(results: dict[str, Any], png: str) -> None:
    """Greedy pass@1 of each arm against steps trained and against the loop's seconds."""
    fig, axes = pyplot().subplots(1, 2, figsize=(12, 4.5))
    lines = dict(results["arms"])
    if "teacher" in results and lines.get("rl") is not results["teacher"]:
        lines["the teacher's run (RL)"] = results["teacher"]
    for name, a in lines.items():
        pts = [(0, 0.0, a["base_pass@1"])] if a["base_pass@1"] is not None else []
        pts += [
            (r["step"] + 1, r["train_s"], statistics.fmean(r["pass@1"].values()))
            for r in a["curve"]
            if r["pass@1"]
        ]
        label = "rl (the teacher's run)" if a is results.get("teacher") and name == "rl" else name
        style = "--" if a is results.get("teacher") and name != "rl" else "-"
        axes[0].plot([p[0] for p in pts], [p[2] for p in pts], style, marker="o", label=label)
        axes[1].plot([p[1] for p in pts], [p[2] for p in pts], style, marker="o", label=label)
    if target := results.get("summary", {}).get("target_pass@1"):
        for ax in axes:
            ax.axhline(target, color="grey", linestyle=":", label="90% of the teacher")
    axes[0].set_xlabel("steps trained")
    axes[1].set_xlabel("seconds in the loop (evals left out)")
    for ax in axes:
        ax.set_ylabel("eval pass@1 (greedy)")
        ax.grid(alpha=0.3)
    axes[0].legend()
    fig.suptitle("SmolLM2-135M-Instruct, one-digit addition: on-policy distillation against RL")
    save_png(fig, png, dpi=120)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True, help="the JSON; its .png beside it")
    ap.add_argument("--model", default="models/smollm2")
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--work", default="outputs/distill_bench")
    ap.add_argument(
        "--teacher",
        default="",
        help="an HF directory, or an earlier teacher run's directory (its curve is the rl arm); "
        "unset: RL the model for --teacher-steps",
    )
    ap.add_argument("--teacher-steps", type=int, default=40)
    ap.add_argument("--teacher-gpus", type=int, default=1)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--coef", type=float, default=1.0)
    ap.add_argument("--arms", default="rl,distill,mixed")
    ap.add_argument("--eval-interval", type=int, default=0, help="0: twice a run")
    a, a.overrides = ap.parse_known_args()
    if a.device == "cpu":
        a.teacher_gpus = 0
    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {"args": vars(a), "arms": {}}
    arms = [x for x in a.arms.split(",") if x]
    teacher = a.teacher
    if not teacher or (Path(teacher) / "summary.json").exists():
        # the teacher's own run (this one's or an earlier one's) is RL alone from the same model,
        # seed and prompts: the `rl` arm unless --arms names one
        out = Path(teacher) if teacher else work / "teacher"
        steps = (
            done(out, None if teacher else a.teacher_steps) or run_rl(config(a, out, a.teacher_steps, []))[0]
        )
        teacher = str(out / f"checkpoints/step_{steps[-1]['step']}/model")
        results["teacher"] = {"path": teacher, **arm(out, steps)}
        if "rl" not in arms:
            results["arms"]["rl"] = results["teacher"]
    for name in arms:
        out = work / name
        toml, extra = None, []
        if name != "rl":  # all-equal rewards still carry the teacher's term (config/models.py)
            toml = teacher_toml(teacher, a, name == "mixed", work)
            extra = ["--orchestrator.shaping.dynamic-sampling", "false"]
        steps = done(out, a.steps) or run_rl(config(a, out, a.steps, extra, toml))[0]
        results["arms"][name] = arm(out, steps)
        print(json.dumps({name: {k: v for k, v in results["arms"][name].items() if k != "curve"}}))
        write(a.out, results)  # each arm as it ends: a cut run keeps what finished
    results["summary"] = summary(results)
    print(json.dumps(results["summary"]))
    write(a.out, results)
    plot(results, str(Path(a.out).with_suffix(".png")))


if __name__ == "__main__":
    main()
