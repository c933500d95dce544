"""The one training loop of RL (`trainer/rl.py`) and SFT (`trainer/sft.py`), the torchtitan way.

Setup: process group, model (from the latest complete checkpoint, else `model.path`; under LoRA the
base from `model.path` and the adapters from the checkpoint), optimizer, lr schedule at the resumed
step, the data source, a warm-up. Loop: the source's batch and objective (on a GPU, RL's packed
rows regrouped into micro-batches by tokens, sized at the first batch: `TokenBudget`), one
optimizer step, the source's publish (RL: weights to vLLM), a checkpoint when due
(`CheckpointManager`), the step's metrics record (`metrics/step_N.json`, written here only), the
source's finish. Teardown: finish the checkpoint write in flight and leave any error in
`run/trainer_error.json` for whoever launched the trainer (`record_trainer_error`): it decides
between a retry and failing fast.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any, NamedTuple, Protocol

import torch
from transformers import AutoConfig, AutoModelForCausalLM

from rlfleet.config.dtypes import torch_dtype
from rlfleet.config.models import TrainerJobConfig
from rlfleet.errors import is_transient
from rlfleet.store import RunDir, RunStore, layout, local_dir, run_store
from rlfleet.store.records import write_metrics
from rlfleet.trainer.attention import choose_kernel
from rlfleet.trainer.budget import TokenBudget
from rlfleet.trainer.checkpoint import CheckpointManager
from rlfleet.trainer.files import checkpoint_model_path, latest_checkpoint, read_trainer_error
from rlfleet.trainer.parallel import Parallel, parallelize, setup, teardown
from rlfleet.trainer.profile import profiled
from rlfleet.trainer.schedule import make_scheduler
from rlfleet.trainer.train import (
    Objective,
    Policy,
    default_head_chunk,
    load_model,
    make_optimizer,
    pick_device,
    train_step,
    warm_up,
)

log = logging.getLogger("rlfleet.trainer")


class Batch(NamedTuple):
    micro_batches: list[dict[str, torch.Tensor]]
    objective: Objective  # the step's loss (it may hold the step's normalisers)
    cursor: dict[str, Any]  # where the data continues after this step: a checkpoint's manifest holds it
    by_tokens: bool = False  # packed rows a GPU trainer regroups into micro-batches by tokens (TokenBudget)


class Source(Protocol):
    """What a trainer trains on and where each step's results go."""

    name: str  # the start-up log line's first word

    def start(self, par: Parallel, policy: Policy, step: int) -> str:
        """Get ready to train from `step`; a few words for the start-up log line."""

    def batch(self, step: int) -> Batch: ...

    def publish(self, step: int, policy: Policy) -> dict[str, Any]:
        """After the optimizer step, before its checkpoint; extra metrics."""

    def record(self, step: int) -> dict[str, Any]:
        """The source's fields of step `step`'s metrics record (its checkpoint, if due, is copied;
        the last one written)."""

    def finish(self, step: int, metrics: dict[str, Any]) -> None:
        """Step `step` is done: its metrics record is written."""

    def close(self) -> None: ...


def train(cfg: TrainerJobConfig, source: Source) -> None:
    """Train steps from the latest checkpoint's next to `max_steps` (nothing if none are left)."""
    store = run_store(cfg.output_dir)
    resume = latest_checkpoint(store)
    resumed = None if resume is None else resume["step"]
    if resumed is not None and resumed + 1 >= cfg.max_steps:
        return
    tc = cfg.trainer
    # A checkpoint's `model/` is the trained model; under LoRA it is merged, so the adapters
    # (in its trainer state) go back onto the base they were trained on instead.
    from_checkpoint = resumed is not None and tc.lora is None
    par, policy, optimizer = build(
        cfg, checkpoint_model_path(store, resumed) if from_checkpoint else cfg.model.path
    )
    ckpt = CheckpointManager(
        store, par, policy, optimizer, cfg.model.path, tc.keep_checkpoints, tc.checkpoint_interval
    )
    step = start = ckpt.load(resumed)
    budget = TokenBudget(cfg, par, policy, optimizer)
    failed = True
    try:
        scheduler = make_scheduler(optimizer, tc.lr, tc.lr_schedule, cfg.max_steps, start)
        about = source.start(par, policy, start)
        log.info(
            "%s rank %d/%d on %s, starting at step %d (checkpoint: %s)%s; warm-up %.2f s, "
            "checkpoint buffers %.2f s",
            source.name,
            par.rank,
            par.world,
            par.device,
            start,
            resumed,
            about,
            warm_up(policy, par),
            ckpt.prepare(),
        )
        if par.is_main:  # the stall watchdog's sign that the model load is over (runs/stalls.py)
            store.write_json(layout.TRAINER_UP, {"pid": os.getpid(), "at": time.time(), "step": start})
        for step in range(start, cfg.max_steps):
            ckpt.check()
            batch = source.batch(step)
            with profiled(profile_out(cfg, step) if par.is_main else None):
                micro = budget.micro_batches(batch.micro_batches, batch.by_tokens)
                metrics = train_step(policy, optimizer, micro, batch.objective, tc.max_grad_norm, par)
            metrics.update(budget.metrics(len(micro)))
            metrics.update(source.publish(step, policy))
            if (secs := ckpt.save(step, batch.cursor, last=step == cfg.max_steps - 1)) is not None:
                metrics["checkpoint_seconds"] = secs
            metrics.update(source.record(step))
            if par.is_main:  # the record's one writer; its existence says step N is done
                write_metrics(store, step, metrics)
            source.finish(step, metrics)
            scheduler.step()
        par.barrier()
        failed = False
    except BaseException as e:
        record_trainer_error(store, step, e)
        raise
    finally:
        ckpt.close(failed)
        source.close()
        teardown(par)


def profile_out(cfg: TrainerJobConfig, step: int) -> Path | None:
    """Where `trainer.profile_step`'s profile goes, for that step only (on this machine's run dir)."""
    if cfg.trainer.profile_step != step:
        return None
    return RunDir(local_dir(cfg.output_dir)).logs("trainer") / f"profile_step_{step}.txt"


def build(
    cfg: TrainerJobConfig, path: str, random_init: bool = False
) -> tuple[Parallel, Policy, torch.optim.Optimizer]:
    """Process group, model (LoRA-wrapped, checkpointed, compiled, sharded as configured) and optimizer.

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
        lm = AutoModelForCausalLM.from_config(
            AutoConfig.from_pretrained(path), dtype=torch_dtype(cfg.model.dtype)
        )
        lm = lm.to(device).train()
    else:
        lm = load_model(path, cfg.model.dtype, device)
    if tc.lora is not None:
        from rlfleet.trainer.lora import wrap

        lm = wrap(lm, tc.lora)
    policy = Policy(lm)
    if policy.varlen:
        log.info("packed rows: varlen attention, %s", choose_kernel(par.device))
    policy.lm_head_chunk = (
        tc.lm_head_chunk
        if tc.lm_head_chunk is not None
        else default_head_chunk(par.device, lm.get_output_embeddings().weight.shape[0])
    )
    parallelize(policy, par, tc)
    return par, policy, make_optimizer(policy, tc)


def record_trainer_error(store: RunStore, step: int, exc: BaseException) -> None:
    """Leave the cause for the launcher (the RL controller, the SFT task): it decides between a
    relaunch and failing fast.

    Out-of-memory is retried once; the same OOM at the same step a second time is deterministic.
    """
    if isinstance(exc, KeyboardInterrupt | SystemExit):
        return
    previous = read_trainer_error(store) or {}
    oom = isinstance(exc, torch.OutOfMemoryError)
    repeated_oom = oom and previous.get("type") == type(exc).__name__ and previous.get("step") == step
    store.write_json(
        layout.TRAINER_ERROR,
        {
            "pid": os.getpid(),
            "job": os.environ.get("SLURM_JOB_ID"),  # an ExternalTrainer reads only its own job's
            "step": step,
            "type": type(exc).__name__,
            "message": str(exc)[:2000],
            "deterministic": repeated_oom or (not oom and not is_transient(exc)),
        },
    )
