"""The picture and summary of benchmarks/learning_vs_trl.py runs: eval pass@1 against training
wall-clock and against steps, one line per (framework, variant), and each one's time to reach TRL's
final pass@1 (`python benchmarks/learning_vs_trl.py --plot A.json B.json --png P --summary S`)."""

from __future__ import annotations

import json
from pathlib import Path
from statistics import fmean
from typing import Any

POINT = ("step", "wall_s", "train_wall_s", "eval_s", "pass@1", "mean_reward")


def point(*values: float) -> dict[str, Any]:
    """One curve point, as each run's JSON holds it."""
    return dict(zip(POINT, values, strict=True))


def reach(curve: list[dict[str, Any]], target: float, key: str) -> float | None:
    return next((p[key] for p in curve if p["pass@1"] >= target - 1e-9), None)


def mean_curve(ds: list[dict[str, Any]]) -> list[dict[str, float]]:
    """The seeds' mean at each step they all evaluated."""
    steps = sorted(set.intersection(*({p["step"] for p in d["curve"]} for d in ds)))
    at = [[next(p for p in d["curve"] if p["step"] == s) for d in ds] for s in steps]
    return [{k: fmean(p[k] for p in ps) for k in ("step", "wall_s", "train_wall_s", "pass@1")} for ps in at]


def summarize(groups: dict[tuple[str, str], list[dict[str, Any]]], base: float | None) -> dict[str, Any]:
    """Final pass@1 per (framework, variant) and when its mean curve reaches TRL's final (mean) pass@1:
    in training seconds from the command's start (the goal's measure) and after each run's start-up
    (`loop_s`: processes, engine and model load taken out, the loop alone)."""
    trl = next((ds for (fw, _), ds in sorted(groups.items()) if fw == "trl"), None)
    target = mean_curve(trl)[-1]["pass@1"] if trl else None
    summary: dict[str, Any] = {"base_pass@1": base, "trl_final_pass@1": target, "groups": {}}
    for (fw, var), ds in sorted(groups.items()):
        last, mean = [d["curve"][-1] for d in ds], mean_curve(ds)
        row: dict[str, Any] = {"seeds": [d["seed"] for d in ds], "final_step": [p["step"] for p in last]}
        row |= {"final_pass@1": mean[-1]["pass@1"], "final_pass@1_per_seed": [p["pass@1"] for p in last]}
        row["train_wall_s_at_end"] = mean[-1]["train_wall_s"]
        for key in ("train_wall_s", "wall_s", "step") if target is not None else ():
            row[f"to_trl_final_{key}"] = reach(mean, target, key)
            row[f"to_trl_final_{key}_per_seed"] = [reach(d["curve"], target, key) for d in ds]
        if target is not None:  # the loop alone: training seconds after the run's start-up
            row["startup_s_per_seed"] = [d.get("startup_s") for d in ds]
            reached = zip(row["to_trl_final_train_wall_s_per_seed"], row["startup_s_per_seed"], strict=True)
            loop = [at - start for at, start in reached if at is not None]
            row["to_trl_final_loop_s"] = fmean(loop) if len(loop) == len(ds) else None
        summary["groups"][f"{fw}/{var}"] = row
    theirs = next((r for k, r in summary["groups"].items() if k.startswith("trl/")), {})
    for k, row in summary["groups"].items():
        if theirs and not k.startswith("trl/"):  # the goal: TRL's time / rlfleet's >= 3
            for key in ("train_wall_s", "wall_s", "loop_s"):
                mine, ref = row[f"to_trl_final_{key}"], theirs[f"to_trl_final_{key}"]
                row[f"trl_over_rlfleet_{key}"] = ref / mine if mine and ref else None
            row["goal_3x_met"] = (row["trl_over_rlfleet_train_wall_s"] or 0) >= 3.0
    return summary


def job_title(docs: list[dict[str, Any]]) -> str:
    """What the runs trained, from their own config: the model's directory, the job TOML, max_tokens."""
    jobs = {
        f"{Path(c['model']).name}, {c['job']}, max_tokens {c['max_tokens']}"
        for d in docs
        if {"model", "job", "max_tokens"} <= (c := d.get("config") or {}).keys()
    }
    return "; ".join(sorted(jobs)) or "learning_vs_trl.py runs"


def plot(files: list[str], png: str | None, summary_path: str | None) -> None:
    docs = [d for f in files if "framework" in (d := json.loads(Path(f).read_text()))]  # not a summary
    base = [p["pass@1"] for d in docs for p in d.get("curve", []) if p["step"] == 0]
    shared = fmean(base) if base else None  # the base model's pass@1, one number for every curve
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for d in docs:
        curve = [p for p in d.get("curve", []) if p["step"] != 0]
        if curve:  # a run cut before its first eval has nothing to draw
            curve = ([point(0, 0.0, 0.0, 0.0, shared, float("nan"))] if base else []) + curve
            groups.setdefault((d["framework"], d["variant"]), []).append(d | {"curve": curve})
    summary = {"files": files} | summarize(groups, shared)
    if summary_path:
        Path(summary_path).write_text(json.dumps(summary, separators=(",", ":")))
    print(json.dumps(summary, indent=2))
    if not png:
        return
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(13, 5))
    for n, ((fw, var), ds) in enumerate(sorted(groups.items())):
        for d in ds:  # each seed thin, the mean over seeds (at the steps all have) thick
            for ax, key in zip(axes, ("train_wall_s", "step"), strict=True):
                ax.plot(
                    [p[key] for p in d["curve"]],
                    [p["pass@1"] for p in d["curve"]],
                    f"C{n}",
                    lw=0.8,
                    alpha=0.35,
                )
        mean = mean_curve(ds)
        ys = [p["pass@1"] for p in mean]
        kw = {"color": f"C{n}", "lw": 2, "marker": "o", "ms": 3, "label": f"{fw} {var} ({len(ds)} seeds)"}
        axes[0].plot([p["train_wall_s"] for p in mean], ys, **kw)
        axes[1].plot([p["step"] for p in mean], ys, **kw)
    for ax, xl in zip(
        axes, ("training wall-clock s (start-up in, evals out)", "optimizer step"), strict=True
    ):
        ax.set(xlabel=xl, ylabel="eval pass@1 (greedy)", ylim=(-0.02, 1.02))
        ax.grid(alpha=0.3)
        if summary["trl_final_pass@1"] is not None:
            ax.axhline(summary["trl_final_pass@1"], color="gray", ls="--", lw=0.8)
    axes[1].legend(fontsize=8, loc="lower right")
    who = "rlfleet vs TRL GRPOTrainer" if any(fw == "trl" for fw, _ in groups) else "rlfleet's variants"
    fig.suptitle(f"{job_title(docs)}: {who} (thin: seeds, thick: mean)")
    fig.tight_layout()
    fig.savefig(png, dpi=120)
