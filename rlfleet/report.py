"""What a person looks at during and after a run: the step progress bar, summary.json, a curve PNG,
and wandb metrics."""

from __future__ import annotations

import contextlib
import io
import os
from pathlib import Path
from typing import Any

import psutil
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from rlfleet.sentinel import watch
from rlfleet.store import RunStore, layout
from rlfleet.store.records import StepRecord, TrainerMetrics


def curve_png(
    xs: list[float],
    ys: list[float],
    title: str,
    ylabel: str,
    ylim: tuple[float, float] | None = None,
    legend_loc: str = "best",
) -> bytes:
    """A per-step metric as a PNG: the points and, from 5 steps on, their moving mean."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4), dpi=110)
    ax.plot(xs, ys, marker="o", markersize=3, label=ylabel)
    if len(ys) >= 5:
        w = 5
        smooth = [
            sum(ys[max(0, i - w + 1) : i + 1]) / len(ys[max(0, i - w + 1) : i + 1]) for i in range(len(ys))
        ]
        ax.plot(xs, smooth, linewidth=2, label=f"moving mean ({w})")
    ax.set(xlabel="step", ylabel=ylabel, title=title)
    if ylim is not None:
        ax.set_ylim(*ylim)
    ax.grid(alpha=0.3)
    ax.legend(loc=legend_loc)
    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return buf.getvalue()


def reward_curve_png(steps: list[StepRecord], title: str) -> bytes:
    """The run's `reward_curve.png`, drawn by the flow's live artifacts (flows/monitor.py)."""
    xs = [s["step"] for s in steps]
    ys = [s["mean_reward"] for s in steps]
    return curve_png(xs, ys, title, "mean reward", ylim=(0, 1.02), legend_loc="lower right")


def write_report(
    store: RunStore,
    steps: list[StepRecord],
    wall_seconds: float,
    config_path: str,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    summary = {
        **(extra or {}),
        "steps": steps,
        "wall_seconds": wall_seconds,
        "config": config_path,
        "first3_mean_reward": mean_or_none([s["mean_reward"] for s in steps[:3]]),
        "last3_mean_reward": mean_or_none([s["mean_reward"] for s in steps[-3:]]),
        "reward_curve": store.uri(layout.REWARD_CURVE) if store.exists(layout.REWARD_CURVE) else None,
    }
    store.write_json(layout.SUMMARY, summary)
    return summary


def mean_or_none(xs: list[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def step_progress(kind: str, *fields: str) -> Progress:
    """The terminal bar of an `rl` or `sft` run: steps done of max_steps, then `fields` (rich column
    templates such as "loss {task.fields[loss]}"), on stderr."""
    return Progress(
        TextColumn(f"[bold]{kind}[/] step"),
        MofNCompleteColumn(),
        BarColumn(),
        *(TextColumn(f) for f in fields),
        TimeElapsedColumn(),
        console=Console(stderr=True),
    )


class WandbSink:
    """wandb logging; offline unless an API key is set (mode 'auto'), so a laptop run never blocks."""

    def __init__(self, mode: str, project: str, name: str, directory: Path, config: dict[str, Any]):
        if mode == "auto":
            mode = "online" if os.environ.get("WANDB_API_KEY") else "offline"
        self.run = None
        self.path: str | None = None  # where the run is: its URL online, its directory offline
        if mode == "disabled":
            return
        import wandb

        directory.mkdir(parents=True, exist_ok=True)
        self.run = wandb.init(
            project=project,
            name=name,
            dir=str(directory),
            mode=mode,
            config=config,
            reinit="finish_previous",
            settings=wandb.Settings(silent=True, console="off"),
        )
        self.path = self.run.url if mode == "online" else str(Path(self.run.dir).parent)
        for child in psutil.Process().children():  # wandb's service: it dies with this process
            with contextlib.suppress(psutil.Error):
                if child.name().startswith("wandb"):
                    watch(child.pid)

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        if self.run is not None:
            self.run.log({k: v for k, v in metrics.items() if isinstance(v, int | float)}, step=step)

    def finish(self) -> None:
        if self.run is not None:
            self.run.finish()
            self.run = None


TIMING = ("step_seconds", "sample_seconds", "trainer_seconds", "broadcast_seconds")
NOT_TRAIN = {
    "step",
    "step_seconds",
    "max_staleness",
    "policy_steps",
    "wait_seconds",
}  # in `timing/`, `rollout/`


def wandb_metrics(record: StepRecord, metrics: TrainerMetrics) -> dict[str, float]:
    """One key per metric, grouped: `train/` (the trainer's), `rollout/` (reward, errors, staleness,
    each env's reward functions and metrics, batch shaping's counts), `timing/` (the step, inside
    vLLM / the trainer / the broadcast, and each phase as the flow saw it), `eval/<env>/` on eval
    steps."""
    out = {f"train/{k}": v for k, v in metrics.items() if k not in NOT_TRAIN}
    out |= {
        "rollout/mean_reward": record["mean_reward"],
        "rollout/reward_errors": record["reward_errors"],
        "rollout/staleness_max": record["max_staleness"],
    }
    out |= {f"rollout/{k}": v for k, v in record["env_metrics"].items()}
    out |= {f"rollout/{k}": v for k, v in record.get("shaping", {}).items()}
    out |= {f"timing/{k}": record[k] for k in TIMING}
    out |= {f"timing/phase_{k}": v for k, v in record["phase_seconds"].items()}
    out |= {f"eval/{env}/{k}": v for env, scores in record.get("eval", {}).items() for k, v in scores.items()}
    return {k: v for k, v in out.items() if isinstance(v, int | float) and not isinstance(v, bool)}


def trainer_speed(metrics: TrainerMetrics) -> str:
    """The flow log's word on the trainer's step: tokens/s, MFU (a GPU), padding."""
    mfu = f", MFU {100 * metrics['mfu']:.1f}%" if "mfu" in metrics else ""
    return (
        f"{metrics.get('train_tokens_per_s', 0.0):,.0f} tokens/s{mfu}, "
        f"padding {100 * metrics.get('padding_frac', 0.0):.1f}%"
    )
