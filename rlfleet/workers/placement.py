"""Single-node GPU placement: inference first, then the trainer, from the visible devices."""

from __future__ import annotations

import os

from rlfleet.config.loader import ConfigError
from rlfleet.config.models import DeploymentConfig, MultiNodeDeployment


def visible_gpus() -> list[str]:
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        return [d.strip() for d in env.split(",") if d.strip()]
    import torch

    return [str(i) for i in range(torch.cuda.device_count())] if torch.cuda.is_available() else []


def assign_gpus(
    d: DeploymentConfig | MultiNodeDeployment, visible: list[str] | None = None
) -> tuple[list[str], list[str]]:
    """(inference GPU ids, trainer GPU ids). One visible GPU may be shared by both (one-GPU mode).

    More than one trainer GPU runs the trainer under torchrun, one FSDP2 rank per GPU. A multi-node
    controller holds none: SLURM gave the nodes' GPUs to the replicas and trainer ranks it started.
    """
    if d.type == "multi_node":
        return [], []
    ni, nt = d.num_inference_gpus, d.num_train_gpus
    if ni == 0 and nt == 0:
        return [], []
    visible = visible_gpus() if visible is None else visible
    if ni + nt <= len(visible):
        return visible[:ni], visible[ni : ni + nt]
    if len(visible) == 1 and ni <= 1 and nt <= 1:
        return visible[:ni], visible[:nt]
    raise ConfigError(
        f"deployment asks for {ni} inference + {nt} trainer GPUs but {len(visible)} are visible "
        "(deployment.num_inference_gpus, deployment.num_train_gpus; "
        f"CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', '<unset>')})"
    )
