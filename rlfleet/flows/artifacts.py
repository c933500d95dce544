"""Prefect artifacts of a run: what a person sees on the flow run's Artifacts tab."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from prefect import get_run_logger
from prefect.artifacts import create_markdown_artifact

from rlfleet.runs.stalls import Stall
from rlfleet.store import RunStore, layout
from rlfleet.store.records import StepRecord, read_metrics


def artifact_key(name: str, kind: str) -> str:
    """Prefect keys allow lowercase letters, digits and dashes only."""
    return re.sub(r"[^a-z0-9-]+", "-", f"{name}-{kind}".lower()).strip("-")


ROW_METRICS = (
    "loss",
    "grad_norm",
    "lr",
    "clip_frac",
    "mismatch_kl",
    "logprob_diff_max",
    "train_seconds",
    "train_tokens_per_s",
    "mfu",
    "padding_frac",
)


def metric_row(store: RunStore, rec: StepRecord) -> dict[str, Any]:
    """A step's row: the flow's step record joined with the trainer's metrics and any eval."""
    step = rec["step"]
    row: dict[str, Any] = {k: rec[k] for k in ("step", "mean_reward", "step_seconds")}
    if (m := read_metrics(store, step)) is not None:
        row |= {k: m[k] for k in ROW_METRICS if k in m}
    if store.exists(evaluated := layout.eval_record(step)):
        row["eval_reward"] = store.read_json(evaluated)["mean_reward"]
    return {k: round(v, 4) if isinstance(v, float) else v for k, v in row.items()}


def publish_summary(store: RunStore, name: str, summary: dict[str, Any]) -> None:
    """The run's last word: reward change, recoveries, wandb, and where everything is."""
    paths = "\n".join(
        f"- {what}: `{store.uri(rel)}`"
        for what, rel in (
            ("summary", layout.SUMMARY),
            ("reward curve", layout.REWARD_CURVE),
            ("resolved config", layout.config("rl")),
            ("weights", layout.WEIGHTS),
            ("checkpoints", layout.CHECKPOINTS),
            ("rollouts", layout.ROLLOUTS),
            ("logs", layout.LOGS),
        )
    )
    first, last = summary["first3_mean_reward"], summary["last3_mean_reward"]
    recovered = "".join(f"- {r['message']}\n" for r in summary["recoveries"]) or "none\n"
    create_markdown_artifact(
        key=artifact_key(name, "summary"),
        markdown=(
            f"# rl run `{name}`\n\n| steps | first-3 reward | last-3 reward | wall (s) | recoveries |\n"
            f"|---|---|---|---|---|\n| {len(summary['steps'])} | {_fmt(first)} | {_fmt(last)} | "
            f"{summary['wall_seconds']:.0f} | {len(summary['recoveries'])} |\n\n"
            f"## Recoveries\n{recovered}\n## wandb\n{summary.get('wandb') or 'disabled'}\n\n"
            f"## Run store\n{paths}\n"
        ),
        description="reward summary, recoveries, wandb and run store paths",
    )


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


def stall_reporter(name: str) -> Callable[[Stall], None]:
    """The stall watchdog's callback (runs/stalls.py, called on its thread in the flow run's
    context): an ERROR line in the flow run's log and the `<run>-stall` artifact."""

    def report(stall: Stall) -> None:
        get_run_logger().error(
            "run stalled: %s; %s; dumps and summary.txt in %s", stall["why"], stall["action"], stall["path"]
        )
        create_markdown_artifact(
            key=artifact_key(name, "stall"),
            markdown=stall_markdown(name, stall),
            description=f"rl run {name} stalled at {stall['at']}: who waits for whom",
        )

    return report


def stall_markdown(name: str, stall: Stall) -> str:
    return (
        f"# rl run `{name}` stalled ({stall['at']})\n\n"
        f"**Stuck:** {stall['culprit']}: {stall['why']}\n\n**Action:** {stall['action']}\n\n"
        f"## summary.txt\n```text\n{stall['summary']}```\n\n"
        f"py-spy dumps of every process of the run: `{stall['path']}`\n"
    )
