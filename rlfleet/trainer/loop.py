"""The long-lived trainer: resume, then for each step wait for its batch, train, publish.

It holds the model and optimizer warm across steps and talks to the rest of the system through
the run store: it executes step N once `batches/step_N` is published and answers with step N's
weights through the configured transport (rlfleet/weights), a checkpoint every
`checkpoint_interval` steps (written in the background; the last one before the last step ends),
and `metrics/step_N.json` written last, which is the signal that step N is done.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from transformers import AutoConfig, AutoModelForCausalLM

from rlfleet.batches import load_micro_batches
from rlfleet.config.models import TrainerJobConfig
from rlfleet.errors import is_transient
from rlfleet.store import RunStore, run_store, step_dir
from rlfleet.trainer.checkpoint import load_trainer_state
from rlfleet.trainer.checkpointer import Checkpointer
from rlfleet.trainer.files import (
    ERROR_FILE,
    checkpoint_model_path,
    is_checkpoint_step,
    latest_checkpoint,
    poll_interval,
    read_trainer_error,
)
from rlfleet.trainer.losses import StepNorm
from rlfleet.trainer.parallel import Parallel, parallelize, setup, teardown
from rlfleet.trainer.reference import load_reference
from rlfleet.trainer.schedule import make_scheduler
from rlfleet.trainer.train import (
    DTYPES,
    LM_HEAD_CHUNK,
    Policy,
    load_model,
    make_optimizer,
    pick_device,
    train_step,
    warm_up,
)
from rlfleet.weights.publisher import Publisher, make_publisher

log = logging.getLogger("rlfleet.trainer")


def wait_for_batch(store: RunStore, step: int, poll_s: float, idle: Callable[[], None]) -> None:
    """Until step N's batch is published; `idle` runs at each poll (the publisher's requests)."""
    rel = step_dir("batches", step)
    while store.manifest(rel) is None:
        idle()
        time.sleep(poll_interval(store, poll_s))


def step_norm(manifest: dict[str, Any], normalizer: float | None) -> StepNorm:
    """The step's normalisers from its batch manifest (rlfleet/orchestrator/batch.py); the constant
    one is `loss.normalizer`, or max_tokens x sequences (Dr.GRPO's generation budget)."""
    seqs = manifest.get("num_sequences", 0)
    return StepNorm(manifest["num_loss_tokens"], seqs, normalizer or manifest.get("max_tokens", 0) * seqs)


def record_trainer_error(store: RunStore, step: int, exc: BaseException) -> None:
    """Leave the cause for the controller: it decides between relaunch and failing fast.

    Out-of-memory is retried once; the same OOM at the same step a second time is deterministic.
    """
    if isinstance(exc, KeyboardInterrupt | SystemExit):
        return
    previous = read_trainer_error(store) or {}
    oom = isinstance(exc, torch.OutOfMemoryError)
    repeated_oom = oom and previous.get("type") == type(exc).__name__ and previous.get("step") == step
    store.write_json(
        ERROR_FILE,
        {
            "pid": os.getpid(),
            "job": os.environ.get("SLURM_JOB_ID"),  # an ExternalTrainer reads only its own job's
            "step": step,
            "type": type(exc).__name__,
            "message": str(exc)[:2000],
            "deterministic": repeated_oom or (not oom and not is_transient(exc)),
        },
    )


def build(
    cfg: TrainerJobConfig, path: str, random_init: bool = False
) -> tuple[Parallel, Policy, torch.optim.Optimizer]:
    """Process group, model (checkpointed, compiled, sharded as configured) and optimizer.

    random_init (the bench): a directory with only config.json gives a seeded random-init model.
    """
    tc = cfg.trainer
    par = setup(tc, pick_device(tc.device))
    if tc.num_threads:
        torch.set_num_threads(tc.num_threads)
    if tc.cpu_affinity:  # keep off the cores vLLM is bound to (inference.cpu_threads_bind)
        os.sched_setaffinity(0, tc.cpu_affinity)
    torch.manual_seed(cfg.seed)
    # Sharded: load on CPU; fully_shard moves each rank's shard to its GPU (or keeps it on CPU: offload).
    device = torch.device("cpu") if par.enabled else par.device
    if random_init and not any(Path(path).glob("*.safetensors")):
        lm = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(path), dtype=DTYPES[cfg.model.dtype])
        lm = lm.to(device).train()
    else:
        lm = load_model(path, cfg.model.dtype, device)
    policy = Policy(lm)
    policy.lm_head_chunk = (
        tc.lm_head_chunk if tc.lm_head_chunk is not None else LM_HEAD_CHUNK[par.device.type]
    )
    parallelize(policy, par, tc)
    return par, policy, make_optimizer(policy, tc)


def build_resumed(
    cfg: TrainerJobConfig, store: RunStore, ckpt: dict[str, Any] | None
) -> tuple[Parallel, Policy, torch.optim.Optimizer]:
    """`build` from checkpoint `ckpt` (its model, then its optimizer state), or the base model if None."""
    par, policy, optimizer = build(
        cfg, cfg.model.path if ckpt is None else checkpoint_model_path(store, ckpt["step"])
    )
    if ckpt is not None:
        load_trainer_state(store, ckpt["step"], policy, optimizer, par.device)
    return par, policy, optimizer


def checkpoint_if_due(
    cfg: TrainerJobConfig,
    step: int,
    policy: Policy,
    optimizer: torch.optim.Optimizer,
    cursor: dict[str, Any],
    checkpointer: Checkpointer,
) -> float | None:
    """Checkpoint every `checkpoint_interval` steps (written in the background) and at the last
    (written before this returns: the run's result). Seconds the step spent on it, or None."""
    if not is_checkpoint_step(step, cfg.trainer.checkpoint_interval, cfg.max_steps):
        return None
    t0 = time.perf_counter()
    checkpointer.save(step, policy, optimizer, cursor)
    if step == cfg.max_steps - 1:
        checkpointer.wait()
    return time.perf_counter() - t0


def run_trainer(cfg: TrainerJobConfig) -> None:
    store = run_store(cfg.output_dir)
    ckpt = latest_checkpoint(store)
    start = 0 if ckpt is None else ckpt["step"] + 1
    par, model, optimizer = build_resumed(cfg, store, ckpt)
    tc = cfg.trainer
    scheduler = make_scheduler(optimizer, tc.lr, tc.lr_schedule, cfg.max_steps, start)
    ref = load_reference(cfg, par, model.lm_head_chunk)
    checkpointer = Checkpointer(store, cfg.model.path, cfg.trainer.keep_checkpoints, par)
    log.info(
        "trainer rank %d/%d on %s, starting at step %d (checkpoint: %s); warm-up %.2f s, "
        "checkpoint buffers %.2f s",
        par.rank,
        par.world,
        par.device,
        start,
        ckpt and ckpt["step"],
        warm_up(model, par),
        checkpointer.prepare(model, optimizer),
    )

    publisher = make_publisher(cfg, store, par)
    step, failed = start, True
    try:
        for step in range(start, cfg.max_steps):
            _train_one(store, cfg, step, model, optimizer, par, publisher, checkpointer, ref)
            scheduler.step()
        failed = False
    except BaseException as e:
        record_trainer_error(store, step, e)
        raise
    finally:
        checkpointer.close(failed)
        publisher.close()
        teardown(par)


def _train_one(
    store: RunStore,
    cfg: TrainerJobConfig,
    step: int,
    model: Policy,
    optimizer: torch.optim.Optimizer,
    par: Parallel,
    publisher: Publisher,
    checkpointer: Checkpointer,
    ref: Policy | None = None,
) -> None:
    tc = cfg.trainer
    checkpointer.check()
    wait_for_batch(store, step, tc.poll_interval_s, publisher.poll)
    t0 = time.perf_counter()
    batch_manifest, micro = load_micro_batches(store, step)
    metrics: dict[str, Any] = train_step(
        model,
        optimizer,
        micro,
        step_norm(batch_manifest, cfg.loss.normalizer),
        tc,
        batch_manifest.get("temperature", 1.0),
        par,
        cfg.loss,
        ref,
    )
    t_pub = time.perf_counter()
    publisher.publish(step, model)
    metrics["publish_seconds"] = time.perf_counter() - t_pub
    if (
        secs := checkpoint_if_due(cfg, step, model, optimizer, batch_manifest["cursor"], checkpointer)
    ) is not None:
        metrics["checkpoint_seconds"] = secs
    if not par.is_main:
        publisher.serve(step)
        return
    metrics.update(
        step=step,
        reward_mean=batch_manifest["reward_mean"],
        step_seconds=time.perf_counter() - t0,
        policy_steps=batch_manifest.get("policy_steps", []),
        max_staleness=batch_manifest.get("max_staleness", 0),
    )
    store.write_json(f"metrics/step_{step}.json", metrics)
    publisher.serve(step)  # after "done": nccl sends while the controller asks vLLM to receive
    if cfg.inference.sleep and par.device.type == "cuda":
        torch.cuda.empty_cache()  # vLLM wakes into the memory the trainer's cache would hold
    log.info("step %d: %s", step, {k: round(v, 4) if isinstance(v, float) else v for k, v in metrics.items()})
