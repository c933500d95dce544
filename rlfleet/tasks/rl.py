"""The Prefect tasks of one RL step. Thin: each calls the engine and returns a small manifest.

Every task is idempotent at the store level: if its artifact for (run, step) is already
published it returns that manifest instead of redoing the work, so Prefect retries and reruns
resume at the first unfinished piece. Within one flow run the Prefect cache mirrors the store
(`step_key`), so a flow run retried from the UI shows finished tasks as `Cached` and re-executes
only the failed and later ones. Tasks that act on processes (launching the pool, starting the
trainer, broadcasting weights) are never cached: the processes die with the controller. `train`
(re)starts the trainer too, so the flow always refreshes its cache entry (`refresh_cache=True`):
it runs every time, and the trainer's `metrics/step_N.json` says whether step N is done.

The run's processes (pool, trainer, rollout stream) come in as the flow's `RunHandles`, `quote`d
so that Prefect neither hashes nor links it; `step_key` reads only the step.
"""

from __future__ import annotations

import time
from typing import Any

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE
from prefect.context import TaskRunContext
from prefect.utilities.hashing import hash_objects

from rlfleet.config.models import RLConfig
from rlfleet.errors import is_transient
from rlfleet.fleet.attach import base_ticket, serves_base
from rlfleet.fleet.rest import wake
from rlfleet.inference.pool import InferencePool
from rlfleet.orchestrator.step_batches import BatchSpec, step_batches
from rlfleet.runs.handles import RunHandles
from rlfleet.store import RunDir, RunStore, layout, run_store
from rlfleet.store.layout import rank_log
from rlfleet.tasks.events import recovered
from rlfleet.tasks.storage import result_storage
from rlfleet.trainer.files import is_checkpoint_step, latest_checkpoint
from rlfleet.trainer.launch import TrainerProcess
from rlfleet.weights.controller import Sender, files_ticket, make_controller


def retry_if_transient(task: Any, task_run: Any, state: Any) -> bool:
    """Prefect retry condition: retry transient failures only; deterministic ones fail fast."""
    exc = state.data
    return not isinstance(exc, BaseException) or is_transient(exc)


def retry_options(cfg: RLConfig, timeout_s: float | None = None) -> dict[str, Any]:
    """Retries after a fixed delay (one number, which the UI shows; a list of backoff delays shows
    there as NaN), transient-only, and a timeout, for every task of the run; results persist in
    the run store (`prefect/results/`) so cache hits survive the controller."""
    return dict(
        retries=cfg.tasks.retries,
        retry_delay_seconds=cfg.tasks.retry_delay_s,
        retry_condition_fn=retry_if_transient,
        timeout_seconds=timeout_s or cfg.tasks.step_timeout_s,
        persist_result=True,
        result_storage=result_storage(_store(cfg)),
    )


def step_key(ctx: TaskRunContext, inputs: dict[str, Any]) -> str:
    """Cache key: (flow run, task, step). A retried flow run finds what its first attempt finished;
    the flow refreshes the steps whose artifacts a resume discarded (`refresh_cache`)."""
    return hash_objects(str(ctx.task_run.flow_run_id), ctx.task.name, inputs["step"])


def brief(manifest: dict[str, Any]) -> dict[str, Any]:
    """A manifest as a task result: everything but the per-file table, plus the file count."""
    return {**{k: v for k, v in manifest.items() if k != "files"}, "num_files": len(manifest["files"])}


def _store(cfg: RLConfig) -> RunStore:
    return run_store(cfg.output_dir)


def report_relaunches(cfg: RLConfig, pool: InferencePool) -> None:
    for r in pool.take_relaunched():
        what = "with the weights of step {}".format(r["weights"]) if not pool.frozen else "(frozen)"
        recovered(
            _store(cfg),
            cfg.name,
            "replica.relaunched",
            f"vLLM {pool.cfg.name + ' ' if pool.frozen else ''}replica {r['replica']} exited with code {r['exit_code']} and was "
            f"relaunched {what}",
            **r,
            model=pool.cfg.name,
        )


@task(name="launch_inference_pool", task_run_name="launch_inference_pool", cache_policy=NO_CACHE)
def launch_inference_pool(cfg: RLConfig, resume_from: int, run: RunHandles) -> dict[str, Any]:
    """Start (or health-check) the vLLM replicas; a resumed run loads its checkpointed weights."""
    pool = run.pool
    for p in run.served_pools.values():  # [[served]] start beside the policy's replicas
        p.start()
    if cfg.fleet is not None and (woke := wake(pool.urls)) > 0.5:  # it rested asleep between runs
        get_run_logger().info("fleet %s: woke its replica in %.1f s", cfg.fleet, woke)
    if resume_from >= 0 and pool.policy_step != resume_from:
        out = pool.broadcast(files_ticket(_store(cfg), resume_from))
    elif cfg.fleet is not None:  # a fleet's replica holds what its last holder left: the run's own first
        clean = serves_base(cfg)  # unless that holder loaded this base back (or the fleet just started)
        out = pool.adopt(base_ticket(cfg)) if clean else pool.broadcast(base_ticket(cfg))
        get_run_logger().info(
            "fleet %s: its replica %s",
            cfg.fleet,
            "serves this base model already (given back clean): nothing to load"
            if clean
            else f"loaded this run's base model in {out['seconds']:.1f} s",
        )
    else:
        out = {"step": pool.policy_step, "replicas": pool.ensure()}
    for rep in pool.replicas:  # start time and KV cache size, where the user looks
        get_run_logger().info(rep.started)
    for line in run.ensure_served():
        get_run_logger().info(line)
    return out


@task(name="rollout", task_run_name="rollout-{step}", cache_key_fn=step_key)
def rollout(cfg: RLConfig, step: int, run: RunHandles) -> dict[str, Any]:
    """Step N's rollout and batches (`orchestrator.step_batches`: the step's groups taken from the
    rollout stream, or the rollout an earlier attempt published while its weights are within
    `max_staleness` of N-1), then what the user should see of them. A colocated pool sleeps
    before the batches are published (`inference.sleep`): the trainer gets the GPU."""
    assert run.stream is not None, "the flow starts the rollout stream before the first rollout"
    pool = run.pool
    data = step_batches(run.stream, step, BatchSpec.of(cfg), free_gpu=pool.sleep)
    out = brief(data.rollout) | {"batches": brief(data.batches)}
    if data.reused:  # reported when it was taken
        return out
    if out["reward_errors"]:  # contained user code, but the user must see it in the run's log
        get_run_logger().warning(
            "rollout %d: %d of %d samples failed to score and got reward 0; first: %s",
            step,
            out["reward_errors"],
            out["num_samples"],
            out["first_error"],
        )
    out["sleep_seconds"] = data.free_gpu_seconds
    for p in [pool, *run.served_pools.values()]:
        report_relaunches(cfg, p)
    if out["resent_samples"]:
        recovered(
            _store(cfg),
            cfg.name,
            "rollout.resent",
            f"rollout {step}: {out['resent_samples']} of {out['num_samples']} samples were continued "
            "on another request after a vLLM replica failed theirs",
            step=step,
            resent_samples=out["resent_samples"],
        )
    return out


def _running_trainer(cfg: RLConfig, run: RunHandles, step: int, replay_until: int) -> TrainerProcess:
    """The run's trainer, relaunched if it died (a recovery the user sees): the new one resumes
    from the latest checkpoint and replays the steps after it, up to `replay_until` (exclusive)."""
    store = _store(cfg)
    trainer = run.trainer
    replaced = trainer.take_relaunched()  # by the trainer's watch, between steps
    if (exit_code := trainer.ensure()) is not None:
        replaced.append(exit_code)
    for exit_code in replaced:
        ckpt = latest_checkpoint(store)
        resume = -1 if ckpt is None else ckpt["step"]
        replayed = list(range(resume + 1, replay_until))
        recovered(
            store,
            cfg.name,
            "trainer.relaunched",
            f"trainer exited with code {exit_code} and was relaunched at step {step}: it resumes from "
            f"{f'checkpoint {resume}' if ckpt else 'the base model'} and replays steps {replayed or 'none'}",
            exit_code=exit_code,
            step=step,
            checkpoint=resume,
            replayed=replayed,
        )
    return trainer


@task(name="start_trainer", task_run_name="start_trainer", cache_policy=NO_CACHE)
def start_trainer(run: RunHandles) -> dict[str, Any]:
    """Start the trainer while vLLM starts, so it has loaded its model when the first batch comes."""
    trainer = run.trainer
    trainer.ensure()
    return {"pid": trainer.process.pid if trainer.process else None}


@task(name="train", task_run_name="train-{step}", cache_key_fn=step_key)
def train(cfg: RLConfig, step: int, run: RunHandles) -> dict[str, Any]:
    """Make sure the long-lived trainer runs, then wait for it to finish step N (or die); on a
    checkpoint step, check its checkpoint (`checkpoint` in the result)."""
    store = _store(cfg)
    trainer = _running_trainer(cfg, run, step, step)
    metrics = trainer.wait_step(store, step, cfg.tasks.step_timeout_s)
    get_run_logger().info(  # on the task's page: the step's numbers and where the process logs are
        "loss %.4f grad_norm %.3f clip_frac %.3f mismatch_kl %.2e in %.2f s; trainer log: %s",
        metrics["loss"],
        metrics["grad_norm"],
        metrics["clip_frac"],
        metrics["mismatch_kl"],
        metrics["step_seconds"],
        rank_log(RunDir(store.local_dir).logs("trainer"), 0),
    )
    return metrics | {"checkpoint": checkpoint(cfg, step)}


@task(name="broadcast_weights", task_run_name="broadcast_weights-{step}", cache_policy=NO_CACHE)
def broadcast_weights(cfg: RLConfig, step: int, run: RunHandles) -> dict[str, Any]:
    """Find step N's weights for the run's transport (`weights.controller`: filesystem checks and
    stages the newest published snapshot), then pause -> load -> resume every replica. A trainer
    that sends the weights itself (nccl) and died, killed mid-send say, is relaunched here; its
    replay of step N writes the ticket the transport waits for."""
    pool = run.pool
    t0 = time.perf_counter()
    sender = Sender(lambda: _running_trainer(cfg, run, step, step + 1), cfg.tasks.step_timeout_s)
    weights = make_controller(cfg.weights.transport).ticket(_store(cfg), step, sender)
    fetch = time.perf_counter() - t0
    out = pool.broadcast(weights)
    for p in [pool, *run.served_pools.values()]:
        report_relaunches(cfg, p)
    return {**out, "fetch_seconds": fetch, "seconds": out["seconds"] + fetch}


def checkpoint(cfg: RLConfig, step: int) -> dict[str, Any] | None:
    """Step N's checkpoint on a checkpoint step, else None. The trainer writes it in the background,
    so on a mid-run step it may still be `pending`; the last step's must be there. Sizes only: the
    trainer hashed the files as it wrote them, and the sha256s are checked where a checkpoint is
    used (a resume); hashing it again here cost 3.5 s at 0.5B, 25 s at 1.5B."""
    if not is_checkpoint_step(step, cfg.trainer.checkpoint_interval, cfg.max_steps):
        return None
    rel = layout.step_dir(layout.CHECKPOINTS, step)
    manifest = _store(cfg).manifest(rel)
    if manifest is None:
        if step < cfg.max_steps - 1:
            return {"step": step, "pending": True}
        raise RuntimeError(f"{rel} is missing after the last train step")
    return {
        "step": step,
        "cursor": manifest["cursor"],
        "files": len(manifest["files"]),
        "bytes": sum(f["size"] for f in manifest["files"].values()),
    }
