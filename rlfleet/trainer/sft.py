"""Supervised fine-tuning: the RL trainer's training loop (loop.py) over a dataset, with its NLL.

`run_sft` resumes one step past the latest complete checkpoint (the data cursor is the step, see
sft_data), trains to `max_steps`, checkpoints every `checkpoint_interval` steps and at the last,
publishes the final weights to `weights/step_N` (an HF directory vLLM and eval load), and writes
`metrics/step_N.json` per step, `summary.json` and `loss_curve.png`.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from transformers import AutoTokenizer

from rlfleet.config.loader import raise_if
from rlfleet.config.lora import check_lora
from rlfleet.config.model import check_model, check_positions
from rlfleet.config.models import SFTConfig
from rlfleet.report import curve_png, mean_or_none, step_progress
from rlfleet.store import RunStore, layout, run_store
from rlfleet.store.records import read_metrics
from rlfleet.store.writable import check_output_dir
from rlfleet.trainer.loop import Batch, train
from rlfleet.trainer.nll import NLL
from rlfleet.trainer.parallel import Parallel
from rlfleet.trainer.resume import discard_stale
from rlfleet.trainer.sft_data import check_data, load_dataset, step_batches
from rlfleet.trainer.train import Policy
from rlfleet.weights.filesystem import FilesystemPublisher

log = logging.getLogger("rlfleet.sft")


def preflight(cfg: SFTConfig) -> None:
    """Model, output dir and every data row are checked before anything is written."""
    problems = check_model(cfg.model) + check_output_dir(cfg.output_dir) + check_lora(cfg.trainer.lora)
    problems += check_data(cfg.data) + check_positions(cfg.model, cfg.data.max_seq_len, "data.max_seq_len")
    raise_if(problems)


def run_sft(cfg: SFTConfig, progress: bool = True) -> dict[str, Any]:
    """Train from the latest checkpoint to `max_steps`; returns the summary (also in summary.json).

    Under torchrun (WORLD_SIZE > 1) every rank runs this; the model is FSDP2-sharded as the
    trainer keys say, and only rank 0 writes metrics and the report.
    """
    t0 = time.perf_counter()
    store = run_store(cfg.output_dir)
    source = DatasetBatches(cfg, store, progress)
    train(cfg.trainer_job(), source)
    if source.par is not None and not source.par.is_main:
        return {}
    return write_sft_report(store, cfg, time.perf_counter() - t0)


class DatasetBatches:
    """SFT's source: the step's rows of the dataset (a pure function of seed and step) and their
    NLL; metrics and a progress bar per step, and the last step's weights as `weights/step_N`."""

    name = "sft"

    def __init__(self, cfg: SFTConfig, store: RunStore, progress: bool):
        self.cfg, self.store, self.progress = cfg, store, progress
        self.par: Parallel | None = None
        self.bar = None

    def start(self, par: Parallel, policy: Policy, step: int) -> str:
        self.par = par
        if par.is_main:
            discard_stale(self.store, step)  # metrics and weights a dead previous life wrote past it
        par.barrier()
        self.ds = load_dataset(self.cfg.data)
        self.tok = AutoTokenizer.from_pretrained(self.cfg.model.path)
        if self.progress and par.is_main:
            self.bar = step_progress("sft", "loss {task.fields[loss]}")
            self.bar.start()
            self.job = self.bar.add_task("sft", total=self.cfg.max_steps, completed=step, loss="-")
        return f", {len(self.ds)} {self.ds.format} rows"

    def batch(self, step: int) -> Batch:
        self.t0 = time.perf_counter()
        micro = step_batches(self.ds, self.tok, self.cfg.data, step, self.cfg.seed)
        return Batch(micro, NLL(micro), {"next_step": step + 1})

    def publish(self, step: int, policy: Policy) -> dict[str, Any]:
        if step == self.cfg.max_steps - 1:
            tc = self.cfg.trainer
            FilesystemPublisher(self.store, self.par, self.cfg.model.path, tc.keep_weights).publish(
                step, policy
            )
        return {}

    def record(self, step: int) -> dict[str, Any]:
        epoch = step * self.cfg.data.batch_size // len(self.ds)
        return {"step": step, "epoch": epoch, "seconds": time.perf_counter() - self.t0}

    def finish(self, step: int, metrics: dict[str, Any]) -> None:
        if self.par.is_main:
            log.info(
                "step %d: loss %.4f (%d tokens, %.2f s)",
                step,
                metrics["loss"],
                metrics["loss_tokens"],
                metrics["seconds"],
            )
        if self.bar is not None:
            self.bar.update(self.job, advance=1, loss=f"{metrics['loss']:.4f}")

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()


def write_sft_report(store: RunStore, cfg: SFTConfig, wall_seconds: float) -> dict[str, Any]:
    steps = [read_metrics(store, s) for s in store.json_steps(layout.METRICS) if s < cfg.max_steps]
    losses = [s["loss"] for s in steps]
    weights = store.complete_steps(layout.WEIGHTS)
    summary = {
        "steps": steps,
        "wall_seconds": wall_seconds,
        "config": store.path(layout.config("sft")),
        "first3_mean_loss": mean_or_none(losses[:3]),
        "last3_mean_loss": mean_or_none(losses[-3:]),
        "weights": store.path(layout.step_dir(layout.WEIGHTS, weights[-1])) if weights else None,
        "loss_curve": store.path(layout.LOSS_CURVE) if steps else None,
    }
    if steps:
        store.write_bytes(
            layout.LOSS_CURVE, curve_png([s["step"] for s in steps], losses, cfg.name, "loss (NLL)")
        )
    store.write_json(layout.SUMMARY, summary)
    return summary
