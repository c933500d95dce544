"""Flow `rl`: preflight, resume, then per step three tasks: rollout-N (take the step's groups
from the rollout stream, batch them) -> train-N (the trainer's step, its checkpoint checked) ->
broadcast_weights-N (loaded with the requests in flight paused in place).

The flow holds no tensors: tasks return manifests and the data moves through the run store. A
rerun with the same output_dir resumes one step past the latest complete checkpoint.

Sampling never waits for a step: the rollout stream (orchestrator/stream.py) keeps the replicas
busy in a thread of this process and buffers finished groups in the run store. The flow holds
the run's processes (vLLM pool, trainer, stream) in one `RunHandles` (runs/handles.py), passes it
to the tasks that act on them and stops them in its `finally`. With
`orchestrator.max_async_level` = k > 0, rollout-N+1 is submitted as soon as rollout-N is done, so
the trainer finds batch N+1 published when it finishes N; k = 0 takes each step's groups on the
newest weights only.
"""

from __future__ import annotations

import time
from datetime import UTC
from datetime import datetime as DateTime
from pathlib import Path
from typing import Any

from prefect import flow, get_client, get_run_logger
from prefect.client.schemas.objects import StateDetails
from prefect.futures import PrefectFuture, wait
from prefect.runtime import flow_run
from prefect.settings import PREFECT_UI_URL
from prefect.states import Completed, State
from prefect.utilities.annotations import quote
from prefect.utilities.urls import url_for

from rlfleet.config.envs import env_name
from rlfleet.config.models import RLConfig
from rlfleet.config.placement import Placement
from rlfleet.fleet.attach import fleet_hold
from rlfleet.flows.artifacts import publish_summary, stall_reporter
from rlfleet.flows.monitor import LiveArtifacts
from rlfleet.flows.server import ServerKeeper, hold_temporary_server
from rlfleet.orchestrator.rollout import warm_tokenizer
from rlfleet.report import WandbSink, step_progress, trainer_speed, wandb_metrics, write_report
from rlfleet.runs.configs import resolve, write_configs
from rlfleet.runs.early import started_early
from rlfleet.runs.handles import RunHandles
from rlfleet.runs.lock import acquire_run_lock, release_run_lock
from rlfleet.runs.logs import sync_logs
from rlfleet.runs.recoveries import recoveries
from rlfleet.store import RunStore, layout, run_store
from rlfleet.store.records import (
    RolloutManifest,
    StepRecord,
    TrainerMetrics,
    read_metrics,
    read_rollout_manifest,
    read_steps,
    write_step,
)
from rlfleet.tasks.eval import evaluate_policy
from rlfleet.tasks.rl import (
    broadcast_weights,
    launch_inference_pool,
    retry_options,
    rollout,
    start_trainer,
    train,
)
from rlfleet.tasks.storage import load_credentials_block
from rlfleet.trainer.resume import resume
from rlfleet.weights.tickets import forget_served
from rlfleet.workers.leases import run_lease


@flow(name="rl", flow_run_name="{config.name}", log_prints=True)
def rl(config: RLConfig) -> State:
    """One RL run; `config` is the resolved RLConfig (the Prefect deployment's parameter)."""
    t0 = time.perf_counter()
    load_credentials_block()  # S3 credentials from $RLFLEET_S3_CREDENTIALS_BLOCK, if it is set
    # a fleet: one of its replicas, before the config names it (held already where `rlfleet rl`
    # took it); the GPUs: held already where `rlfleet rl` took them
    with fleet_hold(config.fleet, config.output_dir):
        # replicas `rlfleet rl` started for this run hold its ports: not a conflict
        cfg, placement = resolve(config, ports=not started_early(config.output_dir))
        tag_run(cfg)
        with run_lease(cfg.output_dir, placement.gpus):
            summary = _run(cfg, placement, t0)
    first, last = summary["first3_mean_reward"], summary["last3_mean_reward"]
    change = "no steps run" if first is None else f"reward {first:.3f} -> {last:.3f}"
    n = len(summary["recoveries"])
    return Completed(message=f"{change} in {len(summary['steps'])} steps; recoveries: {n}", data=summary)


def tag_run(cfg: RLConfig) -> None:
    """Tags that tell runs apart in the runs list: env, model, deployment, weight transport."""
    if not flow_run.id:
        return
    tags = {f"env:{env_name(e)}" for e in cfg.orchestrator.env}
    tags |= {f"model:{Path(cfg.model.path).name}", f"deployment:{cfg.deployment.type}"}
    tags.add(f"weights:{cfg.weights.transport}")
    with get_client(sync_client=True) as client:
        client.update_flow_run(flow_run.id, tags=sorted(set(flow_run.tags) | tags))


def _run(cfg: RLConfig, placement: Placement, t0: float) -> dict[str, Any]:
    log = get_run_logger()
    log.info("placement: %s", placement.describe())
    log.info("%s", cfg.orchestrator.describe_async())
    paths = write_configs(cfg, placement)
    store = run_store(cfg.output_dir)
    acquire_run_lock(store)
    hold_temporary_server(store)  # a SIGKILLed controller's rerun reaps it
    forget_served(store)  # an earlier controller's replicas died with it
    resumed = resume(store)  # None: a fresh output_dir
    start = 0 if resumed is None else resumed.start
    if resumed is not None:
        log.info("%s", resumed.describe())
        if restored := restore_step_records(store, start):
            log.warning(
                "steps %s were trained but had no record (the controller died first): rebuilt", restored
            )

    prefect_run = {"prefect_flow_run_id": str(flow_run.id)}
    if PREFECT_UI_URL.value():  # a UI to open; Prefect's temporary server has none ("None/flow-runs/...")
        # the UI's own route (`runtime.flow_run.ui_url` gives /flow-runs/..., which Prefect 3's UI does not serve)
        prefect_run["prefect_flow_run_url"] = url_for("flow-run", obj_id=flow_run.id)
    # wandb writes under <dir>/wandb; a remote store's local dir is its cache
    sink = WandbSink(
        cfg.wandb.mode,
        cfg.wandb.project,
        cfg.name,
        store.local_dir,
        {**cfg.model_dump(mode="json"), **prefect_run},
    )
    live = LiveArtifacts(store, cfg.name, cfg.max_steps, start)
    ahead: dict[int, PrefectFuture] = {}  # rollouts of later steps
    steps = read_steps(store)  # a resumed run's earlier steps stay on the curve
    run = RunHandles.for_run(cfg, placement)  # starts nothing; the tasks below do
    keeper = ServerKeeper(store, run.progress).start()  # a killed temporary server comes back
    handles = quote(run)
    finished = False
    try:
        after: list[State] = []  # what the next rollout waits for
        if start < cfg.max_steps:
            # the trainer loads its model, and this process the tokenizer (10 s for the 32k-id
            # benchmark one), while vLLM starts: all are ready when step `start` begins
            # no timeout: a future runs in a worker thread, where Prefect cannot enforce one and
            # warns that it cannot; the task only starts the process and returns
            warm = start_trainer.with_options(**dict(retry_options(cfg), timeout_seconds=None)).submit(
                handles
            )
            warm_tokenizer(cfg.model.path)
            launched = launch_inference_pool.with_options(
                **retry_options(cfg, cfg.inference.startup_timeout_s + 60)
            )(quote(cfg), start - 1, handles, return_state=True)
            launched.result()  # raises if the replicas did not start
            after = [edge(launched)]
            run.start_stream(cfg, store, start)
            run.watch_stalls(cfg, store, stall_reporter(cfg.name))  # [faults]: runs/stalls.py
            if start == 0 and cfg.eval.interval and cfg.eval.before_training:
                # while the trainer still loads: the base model's eval needs only the replicas
                base = evaluate_policy.with_options(
                    **retry_options(cfg), task_run_name="evaluate_policy-base"
                )(quote(cfg), None, handles, wait_for=after)
                log.info(
                    "eval before training: %s",
                    ", ".join(f"{e['env']} pass@1 {e['pass@1']:.3f}" for e in base["envs"]),
                )
            warm.result()
        with step_progress("rl", "reward {task.fields[reward]}", "{task.fields[secs]}") as bar:
            job = bar.add_task("rl", total=cfg.max_steps, completed=start, reward="-", secs="")
            for step in range(start, cfg.max_steps):
                record, metrics, after = _step(cfg, step, start, run, ahead, after)
                write_step(store, record)
                steps.append(record)
                sink.log(step, wandb_metrics(record, metrics))
                log.info(
                    "step %d (%d/%d) reward %.3f loss %.4f grad_norm %.3f staleness %d "
                    "tokens %d (%.0f/s) (%.1f s: %s); trainer %s",
                    step,
                    step + 1,
                    cfg.max_steps,
                    record["mean_reward"],
                    record["loss"],
                    metrics["grad_norm"],
                    record["max_staleness"],
                    record["num_completion_tokens"],
                    record["num_completion_tokens"] / max(record["step_seconds"], 1e-9),
                    record["step_seconds"],
                    ", ".join(f"{k} {v:.2f}" for k, v in record["phase_seconds"].items()),
                    trainer_speed(metrics),
                )
                if step == start and "micro_batch_tokens" in metrics:  # the GPU trainer's own sizing
                    log.info(
                        "trainer micro-batches: %d tokens (%d micro-batches this step), activation "
                        "checkpointing %s, peak %.1f GiB; the trainer log says how it was sized",
                        metrics["micro_batch_tokens"],
                        metrics["micro_batches"],
                        metrics["activation_checkpointing"],
                        metrics["peak_memory_gib"],
                    )
                live.step_done(step, steps)
                bar.update(
                    job,
                    advance=1,
                    reward=f"{record['mean_reward']:.3f}",
                    secs=f"{record['step_seconds']:.1f}s/step",
                )
        finished = True
    finally:
        keeper.stop()
        # the stream, then the pool: a rollout waiting for its groups fails fast; a run on a fleet
        # that finished loads its base model back onto its replica for the next holder
        run.stop_sampling(give_back=cfg if finished and cfg.fleet else None)
        wait(list(ahead.values()), timeout=60)
        run.stop_trainer()
        sync_logs(store)
        release_run_lock(store)
        live.publish(steps)  # also what a failing run got to
        sink.finish()

    extra = {"recoveries": recoveries(store), "wandb": sink.path, **prefect_run}
    summary = write_report(store, steps, time.perf_counter() - t0, paths["rl"], extra)
    publish_summary(store, cfg.name, summary)
    log.info(
        "run %s: first-3 reward %.3f, last-3 reward %.3f, %.0f s; summary at %s",
        cfg.name,
        summary["first3_mean_reward"],
        summary["last3_mean_reward"],
        summary["wall_seconds"],
        store.uri(layout.SUMMARY),
    )
    return summary


def _step(
    cfg: RLConfig,
    step: int,
    start: int,
    run: RunHandles,
    ahead: dict[int, PrefectFuture],
    after: list[State],
) -> tuple[StepRecord, TrainerMetrics, list[State]]:
    """One step; returns its record, the trainer's metrics and the states the next step's rollout
    waits for (the weight version now served is `run.served`).

    The config and the run's handles go to every task `quote`d: Prefect would otherwise hash them
    and link task inputs to earlier results through objects inside them, drawing edges the step
    does not have. The real ones are `wait_for`: rollout <- the previous broadcast (k = 0) or the
    previous rollout (k > 0), train <- rollout, broadcast <- train."""
    s0 = time.perf_counter()
    c, handles = quote(cfg), quote(run)
    opts = retry_options(cfg)
    # A resume discarded rollouts and batches after `start` and everything the trainer wrote from
    # `start` on: those must not come back from a retried run's cache.
    kept = dict(opts, refresh_cache=step > start)
    redo = dict(opts, refresh_cache=True)
    walls: dict[
        str, float
    ] = {}  # each phase as the flow sees it (docs/benchmarks/cpu.md: control-plane overhead)
    t = time.perf_counter()
    rolled: State | PrefectFuture
    if step in ahead:
        rolled = ahead.pop(step)
    else:  # k = 0, or the first step: called in the flow's thread
        rolled = rollout.with_options(**kept)(c, step, handles, wait_for=after, return_state=True)
    roll: RolloutManifest = rolled.result()  # plus its batches' manifest, less the file table
    t = _lap(walls, "rollout", t)
    if cfg.orchestrator.max_async_level and step + 1 < cfg.max_steps:
        # the trainer takes batch N+1 as soon as it is done with N; a future runs in a worker
        # thread, where Prefect cannot enforce timeout_seconds (the stream's stall bound holds)
        later = dict(opts, refresh_cache=step + 1 > start, timeout_seconds=None)
        ahead[step + 1] = rollout.with_options(**later).submit(c, step + 1, handles, wait_for=[edge(rolled)])
    trained = train.with_options(**redo)(c, step, handles, wait_for=[edge(rolled)], return_state=True)
    metrics: TrainerMetrics = trained.result()
    t = _lap(walls, "train", t)
    casted = broadcast_weights.with_options(**opts)(
        c, step, handles, wait_for=[edge(trained)], return_state=True
    )
    cast = casted.result()
    assert run.stream is not None  # started before the first step
    run.stream.notify()  # new weights: the groups the next steps need start now
    t = _lap(walls, "broadcast", t)
    evaluated = None
    if cfg.eval.interval and (step + 1) % cfg.eval.interval == 0:
        evaluated = evaluate_policy.with_options(**redo)(c, step, handles, wait_for=[edge(casted)])
        _lap(walls, "eval", t)
    record = step_record(step, roll, metrics, cast, walls, time.perf_counter() - s0)
    if router := {k.removeprefix("router/"): v for k, v in metrics.items() if k.startswith("router/")}:
        record["router"] = router  # MoE: the router's load balance over the step (trainer/router.py)
    if "shaping" in roll:  # orchestrator.shaping: groups dropped and refilled, overlong samples
        record["shaping"] = roll["shaping"]
    if evaluated is not None:
        record["eval"] = {e["env"]: {k: e[k] for k in ("mean_reward", "pass@1")} for e in evaluated["envs"]}
    return record, metrics, [edge(casted)]


def step_record(
    step: int,
    roll: RolloutManifest,
    metrics: TrainerMetrics,
    cast: dict[str, Any] | None,
    walls: dict[str, float],
    seconds: float,
) -> StepRecord:
    """A step's record from its rollout, its trainer metrics and its broadcast (None: unknown)."""
    return {
        "step": step,
        "mean_reward": roll["mean_reward"],
        "reward_errors": roll["reward_errors"],
        "env_metrics": roll["metrics"],
        "step_seconds": seconds,
        "loss": metrics["loss"],
        "train_seconds": metrics["train_seconds"],
        "policy_step": roll["policy_step"],
        "policy_steps": roll["policy_steps"],
        "max_staleness": metrics["max_staleness"],
        "clip_frac": metrics["clip_frac"],
        "mask_frac": metrics["mask_frac"],
        "sample_seconds": roll["sample_seconds"],
        "num_completion_tokens": roll["num_completion_tokens"],
        "trainer_seconds": metrics["step_seconds"],
        "broadcast_seconds": cast["seconds"] if cast else 0.0,
        "broadcast_parts": ((cast["calls"] if cast else None) or [{}])[0],  # none after a regroup
        "phase_seconds": walls,
        "stream": roll["stream"] | {"buffered_groups": roll["buffered_groups"]},
        "finished_at": time.time(),
    }


def restore_step_records(store: RunStore, start: int) -> list[int]:
    """Write the record of each step before `start` that has none, from its rollout manifest and
    trainer metrics: a controller killed between the step's checkpoint and its record leaves the
    step trained, and the rerun resumes past it. What only the dead flow timed (its phases, the
    broadcast) is unknown: empty."""
    done, restored = set(store.json_steps(layout.STEPS)), []
    for s in range(start):
        roll, metrics = read_rollout_manifest(store, s), read_metrics(store, s)
        if s in done or roll is None or metrics is None:
            continue
        write_step(store, step_record(s, roll, metrics, None, {}, metrics["step_seconds"]))
        restored.append(s)
    return restored


_NO_TIME = DateTime(2000, 1, 1, tzinfo=UTC)  # one object for every edge: never a task's


def edge(dep: State | PrefectFuture) -> State | PrefectFuture:
    """A finished task's state as a `wait_for` item that says only which task run it is.

    Prefect walks every field of a state in `wait_for` and links each object it meets to whichever
    task returned an object with that `id()` (for str, dict, datetime: by `id()` alone, so a freed
    result's address reused by this state's timestamp, message or cache key drew an edge from an
    unrelated task, about one run in several hundred). So the copy keeps the task run's id and state
    type, and nothing freshly allocated: its result True, one shared timestamp, no message."""
    if not isinstance(dep, State):
        return dep
    details = StateDetails(
        flow_run_id=dep.state_details.flow_run_id, task_run_id=dep.state_details.task_run_id
    )
    return State(type=dep.type, name=dep.name, data=True, timestamp=_NO_TIME, state_details=details)


def _lap(walls: dict[str, float], name: str, since: float) -> float:
    now = time.perf_counter()
    walls[name] = now - since
    return now
