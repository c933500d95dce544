"""Flow `rl`: preflight, resume, then per step rollout -> aggregate -> train -> broadcast -> checkpoint.

The flow holds no tensors: tasks return manifests and the data moves through the run store. A
rerun with the same output_dir resumes one step past the latest complete checkpoint.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger
from prefect.artifacts import create_markdown_artifact
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from rlfleet.config.models import RLConfig
from rlfleet.inference.pool import shutdown_pool
from rlfleet.report import WandbSink, write_report
from rlfleet.runs import (
    acquire_run_lock,
    discard_stale,
    preflight,
    release_run_lock,
    resume_step,
    step_records,
    write_configs,
)
from rlfleet.store import RunStore
from rlfleet.tasks.rl import (
    aggregate,
    broadcast_weights,
    checkpoint,
    launch_inference_pool,
    policy,
    rollout,
    train,
)
from rlfleet.trainer.launch import stop_trainer


def _progress() -> Progress:
    return Progress(
        TextColumn("[bold]rl[/] step"),
        MofNCompleteColumn(),
        BarColumn(),
        TextColumn("reward {task.fields[reward]}"),
        TextColumn("{task.fields[secs]}"),
        TimeElapsedColumn(),
        console=Console(stderr=True),
    )


@flow(name="rl", flow_run_name="{config.output_dir}", log_prints=True)
def rl(config: RLConfig) -> dict[str, Any]:
    cfg = config
    log = get_run_logger()
    t0 = time.perf_counter()
    inf_gpus, train_gpus = preflight(cfg)
    paths = write_configs(cfg, inf_gpus, train_gpus)
    store = RunStore(cfg.output_dir)
    acquire_run_lock(store)
    start = resume_step(store)
    if start:
        log.info("resuming at step %d; discarded %s", start, discard_stale(store, start) or "nothing")

    opts = policy(cfg)
    sink = (
        WandbSink(
            cfg.wandb.mode,
            cfg.wandb.project,
            cfg.name,
            Path(store.path("wandb")),
            cfg.model_dump(mode="json"),
        )
        if store.is_local
        else None
    )
    try:
        if start < cfg.max_steps:
            launch_inference_pool.with_options(**policy(cfg, cfg.inference.startup_timeout_s + 60))(
                cfg, inf_gpus, start - 1
            )
        with _progress() as bar:
            job = bar.add_task("rl", total=cfg.max_steps, completed=start, reward="-", secs="")
            for step in range(start, cfg.max_steps):
                s0 = time.perf_counter()
                roll = rollout.with_options(**opts)(cfg, inf_gpus, step)
                aggregate.with_options(**opts)(cfg, step)
                metrics = train.with_options(**opts)(cfg, train_gpus, step)
                broadcast_weights.with_options(**opts)(cfg, inf_gpus, step)
                checkpoint.with_options(**opts)(cfg, step)
                record = {
                    "step": step,
                    "mean_reward": roll["reward_mean"],
                    "step_seconds": time.perf_counter() - s0,
                    "loss": metrics["loss"],
                    "train_seconds": metrics["train_seconds"],
                }
                store.write_json(f"steps/step_{step}.json", record)
                if sink:
                    sink.log(step, {**record, **{f"train/{k}": v for k, v in metrics.items()}})
                log.info(
                    "step %d (%d/%d) reward %.3f loss %.4f (%.1f s)",
                    step,
                    step + 1,
                    cfg.max_steps,
                    record["mean_reward"],
                    record["loss"],
                    record["step_seconds"],
                )
                bar.update(
                    job,
                    advance=1,
                    reward=f"{record['mean_reward']:.3f}",
                    secs=f"{record['step_seconds']:.1f}s/step",
                )
    finally:
        shutdown_pool(cfg.output_dir)
        stop_trainer(cfg.output_dir)
        release_run_lock(store)
        if sink:
            sink.finish()

    summary = write_report(store, step_records(store), time.perf_counter() - t0, paths["rl"], cfg.name)
    create_markdown_artifact(
        key="rl-summary",
        markdown=(
            f"# rl run `{cfg.name}`\n\n| steps | first-3 reward | last-3 reward | wall (s) |\n|---|---|---|---|\n"
            f"| {len(summary['steps'])} | {summary['first3_mean_reward']:.3f} | {summary['last3_mean_reward']:.3f}"
            f" | {summary['wall_seconds']:.0f} |\n\nReward curve: `{summary['reward_curve']}`\n"
        ),
        description="reward summary",
    )
    log.info(
        "run %s: first-3 reward %.3f, last-3 reward %.3f, %.0f s; summary at %s",
        cfg.name,
        summary["first3_mean_reward"],
        summary["last3_mean_reward"],
        summary["wall_seconds"],
        store.path("summary.json"),
    )
    return summary
