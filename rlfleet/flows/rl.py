"""Flow `rl`: preflight, resume, then per step rollout -> aggregate -> train -> broadcast -> checkpoint.

The flow holds no tensors: tasks return manifests and the data moves through the run store. A
rerun with the same output_dir resumes one step past the latest complete checkpoint.
"""

from __future__ import annotations

import time
from typing import Any

from prefect import flow, get_run_logger
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from rlfleet.config.models import RLConfig
from rlfleet.flows.artifacts import publish_rl_artifacts
from rlfleet.inference.pool import shutdown_pool
from rlfleet.report import WandbSink, write_report
from rlfleet.runs import (
    acquire_run_lock,
    discard_stale,
    preflight,
    release_run_lock,
    resume_step,
    step_records,
    sync_logs,
    write_configs,
)
from rlfleet.store import RunStore
from rlfleet.tasks.eval import evaluate_policy
from rlfleet.tasks.rl import (
    aggregate,
    broadcast_weights,
    checkpoint,
    launch_inference_pool,
    policy,
    rollout,
    train,
)
from rlfleet.tasks.storage import load_credentials_block
from rlfleet.trainer.launch import stop_trainer
from rlfleet.workers.leases import gpu_lease


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
    """One RL run; `config` is the resolved RLConfig (the deployment's parameter)."""
    cfg = config
    t0 = time.perf_counter()
    load_credentials_block()  # S3 credentials from $RLFLEET_S3_CREDENTIALS_BLOCK, if it is set
    inf_gpus, train_gpus = preflight(cfg)
    with gpu_lease(inf_gpus + train_gpus):
        return _run(cfg, inf_gpus, train_gpus, t0)


def _run(cfg: RLConfig, inf_gpus: list[str], train_gpus: list[str], t0: float) -> dict[str, Any]:
    log = get_run_logger()
    paths = write_configs(cfg, inf_gpus, train_gpus)
    store = RunStore(cfg.output_dir)
    acquire_run_lock(store)
    start = resume_step(store)
    if start:
        log.info("resuming at step %d; discarded %s", start, discard_stale(store, start) or "nothing")

    opts = policy(cfg)
    sink = WandbSink(
        cfg.wandb.mode,
        cfg.wandb.project,
        cfg.name,
        store.local_dir / "wandb",  # wandb writes a local dir; a remote store's is the cache
        cfg.model_dump(mode="json"),
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
                # A resume discarded rollouts and batches after `start` and everything the trainer
                # wrote from `start` on: those must not come back from a retried run's cache.
                kept = dict(opts, refresh_cache=step > start)
                redo = dict(opts, refresh_cache=True)
                roll = rollout.with_options(**kept)(cfg, inf_gpus, step)
                aggregate.with_options(**kept)(cfg, step)
                metrics = train.with_options(**redo)(cfg, train_gpus, step)
                broadcast_weights.with_options(**opts)(cfg, inf_gpus, step)
                checkpoint.with_options(**redo)(cfg, step)
                if cfg.eval.interval and (step + 1) % cfg.eval.interval == 0:
                    evaluate_policy.with_options(**redo)(cfg, inf_gpus, step)
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
        sync_logs(store)
        release_run_lock(store)
        if sink:
            sink.finish()

    summary = write_report(store, step_records(store), time.perf_counter() - t0, paths["rl"], cfg.name)
    publish_rl_artifacts(store, cfg.name, summary)
    log.info(
        "run %s: first-3 reward %.3f, last-3 reward %.3f, %.0f s; summary at %s",
        cfg.name,
        summary["first3_mean_reward"],
        summary["last3_mean_reward"],
        summary["wall_seconds"],
        store.uri("summary.json"),
    )
    return summary
