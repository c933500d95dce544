"""Eval tasks: a checkpoint on its own vLLM servers (flow `eval`), or the RL run's live policy."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from prefect import task

from rlfleet.config.models import EvalJobConfig, InferenceJobConfig, RLConfig
from rlfleet.fleet.attach import fleet_hold, fleet_urls, model_ticket, replica_gpus
from rlfleet.fleet.rest import wake
from rlfleet.inference.pool import InferencePool
from rlfleet.inference.server import launch_replicas, stop_replicas
from rlfleet.orchestrator.evaluate import evaluate
from rlfleet.orchestrator.sampler import FixedReplicas
from rlfleet.runs.handles import RunHandles
from rlfleet.store import CorruptArtifact, RunDir, RunStore, layout, run_store
from rlfleet.store.records import EvalRecord
from rlfleet.tasks.rl import step_key
from rlfleet.trainer.files import checkpoint_model_path, latest_checkpoint
from rlfleet.workers.leases import run_lease


def eval_record(store: RunStore, step: int | None, result: dict[str, Any], source: str) -> EvalRecord:
    record: EvalRecord = {"step": step, "source": source, **result}
    store.write_json(layout.eval_record(step), record)
    return record


def resolve_checkpoint(store: RunStore, which: str | int) -> tuple[int | None, str | None]:
    """(step, local model dir) of the checkpoint to evaluate; (None, None) for the base model."""
    if which == "base":
        return None, None
    if which == "latest":
        manifest = latest_checkpoint(store)
        if manifest is None:
            raise FileNotFoundError(f"no complete checkpoint in {store.url}")
        step = manifest["step"]
    else:
        step = int(which)
        rel = layout.step_dir(layout.CHECKPOINTS, step)
        try:
            ok = store.manifest(rel, verify=True) is not None
        except CorruptArtifact as e:
            raise FileNotFoundError(f"{rel} is corrupt: {e}") from None
        if not ok:
            raise FileNotFoundError(f"{rel} is not a complete checkpoint in {store.url}")
    return step, checkpoint_model_path(store, step)


@task(name="evaluate_checkpoint", task_run_name="evaluate_checkpoint-{cfg.checkpoint}")
def evaluate_checkpoint(cfg: EvalJobConfig) -> dict[str, Any]:
    store = run_store(cfg.output_dir)
    step, model_dir = resolve_checkpoint(store, cfg.checkpoint)
    serve = InferenceJobConfig(
        output_dir=str(RunDir(store.local_dir).eval_servers),  # vLLM logs stay on this machine
        seed=cfg.seed,
        model=cfg.model,
        inference=cfg.inference,
        fleet=cfg.fleet,
    )
    if cfg.fleet is not None:
        result = _on_fleet(cfg, serve, step, model_dir or cfg.model.path)
        return eval_record(store, step, result, "eval")
    replicas = launch_replicas(serve, model_dir)
    try:
        fixed = FixedReplicas([r.url for r in replicas], step)
        result = evaluate(fixed, cfg.model.path, cfg.eval, cfg.inference.max_model_len)
    finally:
        stop_replicas(replicas)
    return eval_record(store, step, result, "eval")


@contextmanager
def held_replica(fleet: str, holder: str, tp: int) -> Iterator[int]:
    """One replica of `fleet` held for `holder` (the first free one, waited for), its GPUs' slots
    leased as a run on the fleet leases them; yields its index."""
    with fleet_hold(fleet, holder) as slot, run_lease(holder, replica_gpus(fleet, holder, tp)):
        assert slot is not None
        yield slot


def _on_fleet(
    cfg: EvalJobConfig, serve: InferenceJobConfig, step: int | None, model_dir: str
) -> dict[str, Any]:
    """The checkpoint loaded on one of the fleet's replicas, held for the eval (a run holding the
    fleet is waited for) with its GPUs' slots leased, as a run on the fleet leases them; the next
    run on the fleet loads its own weights first, as it always does."""
    assert cfg.fleet is not None
    with held_replica(cfg.fleet, f"eval of {cfg.output_dir}", cfg.inference.tensor_parallel_size) as slot:
        urls = fleet_urls(cfg.fleet, cfg.model, cfg.inference, cfg.seed)[slot : slot + 1]
        wake(urls)  # it rested asleep while no run held it
        job = serve.model_copy(
            update={"inference": cfg.inference.model_copy(update={"urls": urls, "num_replicas": len(urls)})}
        )
        pool = InferencePool(job)
        try:
            pool.broadcast(model_ticket(-1 if step is None else step, model_dir))
            return evaluate(pool, cfg.model.path, cfg.eval, cfg.inference.max_model_len)
        finally:
            pool.shutdown()  # the pool's watch; the fleet's replicas are not its to stop


@task(name="evaluate_policy", task_run_name="evaluate_policy-{step}", cache_key_fn=step_key)
def evaluate_policy(cfg: RLConfig, step: int | None, run: RunHandles) -> dict[str, Any]:
    """Evaluate the weights of `step` on the run's own servers (called right after their broadcast);
    step None: the starting weights, before step 0 (`eval.before_training`)."""
    result = evaluate(run.pool, cfg.model.path, cfg.eval, cfg.inference.max_model_len, run.progress)
    return eval_record(run_store(cfg.output_dir), step, result, "rl")
