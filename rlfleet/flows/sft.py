"""Flow `sft`: preflight, resolved config, one retried training task, loss artifacts.

A rerun with the same output_dir resumes one step past the latest complete checkpoint; a finished
run only rewrites its report.
"""

from __future__ import annotations

from typing import Any

from prefect import flow, get_run_logger
from prefect.artifacts import create_markdown_artifact, create_table_artifact

from rlfleet.config.loader import to_toml
from rlfleet.config.models import SFTConfig
from rlfleet.flows.artifacts import artifact_key
from rlfleet.flows.server import hold_temporary_server
from rlfleet.runs.lock import acquire_run_lock, release_run_lock
from rlfleet.store import layout, run_store
from rlfleet.tasks.rl import retry_options
from rlfleet.tasks.sft import sft_train
from rlfleet.trainer.sft import preflight

RETRY_OPTIONS = ("retries", "retry_delay_seconds", "retry_condition_fn", "timeout_seconds")


@flow(name="sft", flow_run_name="{config.output_dir}", log_prints=True)
def sft(config: SFTConfig) -> dict[str, Any]:
    cfg = config
    log = get_run_logger()
    preflight(cfg)
    store = run_store(cfg.output_dir)
    # The RL tasks' retry policy; one task runs every step, so its timeout is the per-step budget
    # times the steps. Result persistence is left out: the task is never cached (tasks/sft.py).
    opts = retry_options(cfg, cfg.tasks.step_timeout_s * cfg.max_steps)
    opts = {k: v for k, v in opts.items() if k in RETRY_OPTIONS}
    acquire_run_lock(store)  # before any write: a second controller must not touch a live run
    hold_temporary_server(store)  # a SIGKILLed controller's rerun reaps it
    try:
        store.write_text(layout.config("sft"), to_toml(cfg))
        summary = sft_train.with_options(**opts)(cfg)
    finally:
        release_run_lock(store)

    steps = summary["steps"]
    if steps:
        create_table_artifact(
            key=artifact_key(cfg.name, "sft-loss"),
            table=[
                {
                    "step": s["step"],
                    "loss": round(s["loss"], 5),
                    "loss_tokens": s["loss_tokens"],
                    "seconds": round(s["seconds"], 3),
                }
                for s in steps
            ],
            description=f"per-step loss of sft run {cfg.name}",
        )
    first, last = summary["first3_mean_loss"], summary["last3_mean_loss"]
    create_markdown_artifact(
        key=artifact_key(cfg.name, "sft-summary"),
        markdown=(
            f"# sft run `{cfg.name}`\n\n| steps | first-3 loss | last-3 loss | wall (s) |\n|---|---|---|---|\n"
            f"| {len(steps)} | {_fmt(first)} | {_fmt(last)} | {summary['wall_seconds']:.0f} |\n\n"
            f"Weights: `{summary['weights']}`  \nLoss curve: `{summary['loss_curve']}`\n"
        ),
        description="sft summary",
    )
    log.info(
        "run %s: first-3 loss %s, last-3 loss %s, %.1f s; summary at %s",
        cfg.name,
        _fmt(first),
        _fmt(last),
        summary["wall_seconds"],
        store.path(layout.SUMMARY),
    )
    return summary


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.4f}"
