"""Supervised fine-tuning with the RL trainer's model, optimizer, checkpoints and resume.

`run_sft` resumes one step past the latest complete checkpoint (the data cursor is the step, see
sft_data), trains to `max_steps`, checkpoints every `checkpoint_interval` steps and at the last,
publishes the final weights to `weights/step_N` (an HF directory vLLM and eval load), and writes
`metrics/step_N.json` per step, `summary.json` and `loss_curve.png`.
"""

from __future__ import annotations

import json
import logging
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import torch
from transformers import AutoTokenizer

from rlfleet.config.checks import check_model, check_output_dir, raise_if
from rlfleet.config.models import SFTConfig
from rlfleet.report import curve_png, mean_or_none, step_progress
from rlfleet.runs.resume import discard_stale
from rlfleet.store import RunStore, run_store, step_dir
from rlfleet.trainer.checkpoint import prune_weights, publish_weights
from rlfleet.trainer.checkpointer import Checkpointer
from rlfleet.trainer.files import latest_checkpoint
from rlfleet.trainer.loop import build_resumed, checkpoint_if_due
from rlfleet.trainer.loss import sft_loss
from rlfleet.trainer.parallel import Parallel, teardown
from rlfleet.trainer.schedule import make_scheduler
from rlfleet.trainer.sft_data import (
    check_data,
    load_dataset,
    num_targets,
    step_batches,
)
from rlfleet.trainer.train import Policy, accumulate, optimizer_step

log = logging.getLogger("rlfleet.sft")


def preflight(cfg: SFTConfig) -> None:
    """Model, output dir and every data row are checked before anything is written."""
    problems = check_model(cfg.model) + check_output_dir(cfg.output_dir) + check_data(cfg.data)
    config_json = Path(cfg.model.path) / "config.json"
    if config_json.is_file():
        max_pos = json.loads(config_json.read_text()).get("max_position_embeddings")
        if max_pos and cfg.data.max_seq_len > max_pos:
            problems.append(f"data.max_seq_len: {cfg.data.max_seq_len} > the model's {max_pos} positions")
    raise_if(problems)


def sft_step(
    policy: Policy,
    optimizer: torch.optim.Optimizer,
    batches: list[dict[str, torch.Tensor]],
    max_grad_norm: float,
    par: Parallel | None = None,
) -> dict[str, Any]:
    """Accumulate the step's token-mean NLL over its micro-batches, clip, one optimizer step.

    Every rank builds the whole step's micro-batches (a pure function of seed and step) and
    trains its share, so the normalizer is the step's loss-token count on every rank.
    """
    start = time.perf_counter()
    n = num_targets(batches)
    optimizer.zero_grad(set_to_none=True)
    totals = accumulate(
        policy, batches, lambda mb, lp, _: (sft_loss(lp, mb["loss_mask"][:, 1:], n), {}), par=par
    )
    grad_norm = optimizer_step(policy, optimizer, max_grad_norm)
    return {
        "loss": totals["loss"],
        "grad_norm": grad_norm,
        "loss_tokens": n,
        "tokens": int(sum(mb["input_ids"].numel() for mb in batches)),
        "train_seconds": time.perf_counter() - start,
    }


def run_sft(cfg: SFTConfig, progress: bool = True) -> dict[str, Any]:
    """Train from the latest checkpoint to `max_steps`; returns the summary (also in summary.json).

    Under torchrun (WORLD_SIZE > 1) every rank runs this; the model is FSDP2-sharded as the
    trainer keys say, and only rank 0 writes metrics and the report.
    """
    t0 = time.perf_counter()
    tc = cfg.trainer
    store = run_store(cfg.output_dir)
    ckpt = latest_checkpoint(store)
    start = 0 if ckpt is None else ckpt["step"] + 1
    if start >= cfg.max_steps:
        return write_sft_report(store, cfg, time.perf_counter() - t0)
    trainer_job = cfg.trainer_job()
    par, policy, optimizer = build_resumed(trainer_job, store, ckpt)
    scheduler = make_scheduler(optimizer, tc.lr, tc.lr_schedule, cfg.max_steps, start)
    checkpointer = Checkpointer(store, cfg.model.path, tc.keep_checkpoints, par)
    failed = True
    try:
        if par.is_main:
            discard_stale(store, start)  # metrics and weights a dead previous life wrote past it
        par.barrier()
        ds = load_dataset(cfg.data)
        tok = AutoTokenizer.from_pretrained(cfg.model.path)
        log.info(
            "sft rank %d/%d on %s: %d %s rows, steps %d..%d",
            par.rank,
            par.world,
            par.device,
            len(ds),
            ds.format,
            start,
            cfg.max_steps - 1,
        )
        shown = progress and par.is_main
        with step_progress("sft", "loss {task.fields[loss]}") if shown else nullcontext() as bar:
            job = bar.add_task("sft", total=cfg.max_steps, completed=start, loss="-") if bar else None
            for step in range(start, cfg.max_steps):
                s0 = time.perf_counter()
                batches = step_batches(ds, tok, cfg.data, step, cfg.seed)
                lr = optimizer.param_groups[0]["lr"]
                metrics = sft_step(policy, optimizer, batches, tc.max_grad_norm, par)
                scheduler.step()
                metrics.update(
                    step=step,
                    epoch=step * cfg.data.batch_size // len(ds),
                    lr=lr,
                    seconds=time.perf_counter() - s0,
                )
                # Metrics first: every step a checkpoint covers has its record; a crash in between
                # only redoes the step, which rewrites it.
                if par.is_main:
                    store.write_json(f"metrics/step_{step}.json", metrics)
                    log.info(
                        "step %d: loss %.4f (%d tokens, %.2f s)",
                        step,
                        metrics["loss"],
                        metrics["loss_tokens"],
                        metrics["seconds"],
                    )
                checkpoint_if_due(trainer_job, step, policy, optimizer, {"next_step": step + 1}, checkpointer)
                if step == cfg.max_steps - 1:
                    publish_weights(store, step, policy, cfg.model.path, par)
                    if par.is_main:
                        prune_weights(store, tc.keep_weights)
                if bar:
                    bar.update(job, advance=1, loss=f"{metrics['loss']:.4f}")
        par.barrier()
        failed = False
    finally:
        checkpointer.close(failed)
        teardown(par)
    return write_sft_report(store, cfg, time.perf_counter() - t0) if par.is_main else {}


def write_sft_report(store: RunStore, cfg: SFTConfig, wall_seconds: float) -> dict[str, Any]:
    steps = [
        store.read_json(f"metrics/step_{s}.json") for s in store.json_steps("metrics") if s < cfg.max_steps
    ]
    losses = [s["loss"] for s in steps]
    weights = store.complete_steps("weights")
    summary = {
        "steps": steps,
        "wall_seconds": wall_seconds,
        "config": store.path("configs/sft.toml"),
        "first3_mean_loss": mean_or_none(losses[:3]),
        "last3_mean_loss": mean_or_none(losses[-3:]),
        "weights": store.path(step_dir("weights", weights[-1])) if weights else None,
        "loss_curve": store.path("loss_curve.png") if steps else None,
    }
    if steps:
        store.write_bytes(
            "loss_curve.png", curve_png([s["step"] for s in steps], losses, cfg.name, "loss (NLL)")
        )
    store.write_json("summary.json", summary)
    return summary
