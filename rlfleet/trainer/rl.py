"""The long-lived RL trainer: the training loop (loop.py) over the batches the controller publishes.

It holds the model and optimizer warm across steps and talks to the rest of the system through
the run store: it executes step N once `batches/step_N` is published and answers with step N's
weights through the configured transport (rlfleet/weights), a checkpoint every
`checkpoint_interval` steps (written in the background; the last one before the last step ends),
and its metrics record, which the loop writes last (`metrics/step_N.json`): the signal that step
N is done.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import torch

from rlfleet.config.models import TrainerJobConfig
from rlfleet.microbatches import load_micro_batches
from rlfleet.store import RunStore, layout, run_store
from rlfleet.store.records import BatchManifest
from rlfleet.trainer.files import poll_interval
from rlfleet.trainer.loop import Batch, train
from rlfleet.trainer.losses import PolicyLoss, StepNorm
from rlfleet.trainer.parallel import Parallel
from rlfleet.trainer.reference import load_reference
from rlfleet.trainer.train import Policy
from rlfleet.weights.publisher import Publisher, make_publisher

log = logging.getLogger("rlfleet.trainer")


def run_trainer(cfg: TrainerJobConfig) -> None:
    train(cfg, ControllerBatches(cfg, run_store(cfg.output_dir)))


def step_norm(manifest: BatchManifest, normalizer: float | None) -> StepNorm:
    """The step's normalisers from its batch manifest (rlfleet/orchestrator/step_batches.py); the constant
    one is `loss.normalizer`, or max_tokens x sequences (Dr.GRPO's generation budget)."""
    seqs = manifest.get("num_sequences", 0)  # absent from batches written before [loss] (0d4f7c5)
    return StepNorm(manifest["num_loss_tokens"], seqs, normalizer or manifest.get("max_tokens", 0) * seqs)


class ControllerBatches:
    """RL's source: `batches/step_N` and the `[loss]` policy loss; step N's weights go out through
    the transport before its metrics, and the nccl transport sends them after."""

    name = "trainer"

    def __init__(self, cfg: TrainerJobConfig, store: RunStore):
        self.cfg, self.store = cfg, store
        self.publisher: Publisher | None = None

    def start(self, par: Parallel, policy: Policy, step: int) -> str:
        self.par = par
        self.ref = load_reference(self.cfg, par, policy)
        self.publisher = make_publisher(self.cfg, self.store, par)
        return ""

    def batch(self, step: int) -> Batch:
        """Once step N's batch is published; meanwhile the publisher answers the controller."""
        while self.store.manifest(layout.step_dir(layout.BATCHES, step)) is None:
            self.publisher.poll()
            time.sleep(poll_interval(self.store, self.cfg.trainer.poll_interval_s))
        self.t0 = time.perf_counter()
        self.manifest, micro = load_micro_batches(self.store, step)
        norm = step_norm(self.manifest, self.cfg.loss.normalizer)
        objective = PolicyLoss(self.cfg.loss, norm, self.manifest.get("temperature", 1.0), self.ref)
        # packed rows: a GPU trainer regroups them into micro-batches by tokens (budget.py TokenBudget)
        return Batch(micro, objective, self.manifest["cursor"], by_tokens=bool(self.manifest.get("seq_len")))

    def publish(self, step: int, policy: Policy) -> dict[str, Any]:
        t0 = time.perf_counter()
        self.publisher.publish(step, policy)
        return {"publish_seconds": time.perf_counter() - t0}

    def record(self, step: int) -> dict[str, Any]:
        m = self.manifest
        return {
            "step": step,
            "step_seconds": time.perf_counter() - self.t0,
            "policy_steps": m.get("policy_steps", []),
            "max_staleness": m.get("max_staleness", 0),
        }

    def finish(self, step: int, metrics: dict[str, Any]) -> None:
        self.publisher.serve(step)  # after "done": nccl sends while the controller asks vLLM to receive
        if not self.par.is_main:
            return
        if self.cfg.inference.sleep and self.par.device.type == "cuda":
            torch.cuda.empty_cache()  # vLLM wakes into the memory the trainer's cache would hold
        log.info(
            "step %d: %s", step, {k: round(v, 4) if isinstance(v, float) else v for k, v in metrics.items()}
        )

    def close(self) -> None:
        if self.publisher is not None:
            self.publisher.close()
