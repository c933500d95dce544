"""The trainer's side of the seam: one publisher per trainer process, the one its `weights.transport`
names in the registry (config/weights.py)."""

from __future__ import annotations

from typing import Protocol

import torch

from rlfleet.config.models import TrainerJobConfig
from rlfleet.store import RunStore
from rlfleet.trainer.parallel import Parallel


class Publisher(Protocol):
    def publish(self, step: int, model: torch.nn.Module) -> None:
        """Make step N's weights loadable; runs before the step's metrics (the "done" signal)."""

    def serve(self, step: int) -> None:
        """Hand them over if the transport pushes (nccl); runs after the step's metrics."""

    def poll(self) -> None:
        """Between steps, while the trainer waits for a batch: answer the controller's requests
        (nccl: a new group for a relaunched replica)."""

    def close(self) -> None: ...


class Follower:
    """A trainer rank that sends nothing (nccl sends from rank 0 only): it takes its part in the
    full-tensor gather each publish is (`sent_state`, a collective), and nothing else."""

    def __init__(self, par: Parallel):
        self.par = par

    def publish(self, step: int, model: torch.nn.Module) -> None:
        from rlfleet.trainer.hf_export import sent_state

        sent_state(model, self.par)

    def serve(self, step: int) -> None:
        """Rank 0 sends; this rank goes on to the next batch and waits in its first collective."""

    def poll(self) -> None:
        """Rank 0 answers the controller's requests."""

    def close(self) -> None: ...


def make_publisher(cfg: TrainerJobConfig, store: RunStore, par: Parallel) -> Publisher:
    return cfg.weights.part("publisher")(cfg, store, par)


def vllm_dtype(cfg: TrainerJobConfig, par: Parallel) -> str:
    """The dtype vLLM serves in: what a transport that fills buffers casts to."""
    return cfg.inference.vllm_dtype(cfg.model.dtype, par.device.type == "cuda")
