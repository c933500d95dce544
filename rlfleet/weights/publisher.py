"""The trainer's side of the seam: one publisher per trainer process, picked by `weights.transport`."""

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


def make_publisher(cfg: TrainerJobConfig, store: RunStore, par: Parallel) -> Publisher:
    w = cfg.weights
    vllm_dtype = cfg.inference.vllm_dtype(cfg.model.dtype, par.device.type == "cuda")
    if w.transport == "cuda_ipc":
        from rlfleet.weights.cuda_ipc import IpcPublisher

        return IpcPublisher(store, par, vllm_dtype, w.timeout_s)
    if w.transport == "nccl":
        from rlfleet.weights.nccl import NcclPublisher

        return NcclPublisher(store, par, vllm_dtype, w.nccl_port, cfg.inference.workers, w.timeout_s)
    from rlfleet.weights.filesystem import FilesystemPublisher

    return FilesystemPublisher(store, par, cfg.model.path, cfg.trainer.keep_weights)
