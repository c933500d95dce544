"""`[weights]`: how each step's weights reach vLLM, and what the config alone can tell about it."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from rlfleet.config.base import Strict
from rlfleet.config.deployment import Deployment


class WeightsConfig(Strict):
    """How each step's weights reach vLLM (rlfleet/weights/); checkpoints always go to the run store."""

    transport: Literal["auto", "filesystem", "cuda_ipc", "nccl"] = Field(
        "auto",
        description="auto: cuda_ipc when vLLM and the trainer share one GPU, else filesystem; filesystem: "
        "weights/step_N + in-place reload; cuda_ipc: vLLM reads the trainer's GPU memory (one shared GPU); "
        "nccl: a broadcast from trainer rank 0 (gloo when the trainer is on a CPU).",
    )
    timeout_s: float = Field(600.0, gt=0, description="How long the trainer waits for vLLM to take a step.")
    nccl_port: int = Field(29650, ge=1024, le=65535, description="Rendezvous port of the nccl transport.")
    in_flight_kv: Literal["recompute", "keep"] = Field(
        "recompute",
        description="Requests in flight during a load stay scheduled (vLLM's pause keep mode). recompute: their "
        "KV cache is dropped and recomputed by the new weights on resume; keep: the old weights' KV is reused.",
    )


def placed_transport(w: WeightsConfig, inference_gpus: list[str], trainer_gpus: list[str]) -> str:
    """`auto` placed: cuda_ipc where vLLM and the trainer share one GPU (no copy through files, as a
    colocated TRL's in-process sync), else filesystem; any other choice as it is."""
    if w.transport != "auto":
        return w.transport
    shared = len(inference_gpus) == len(trainer_gpus) == 1 and inference_gpus == trainer_gpus
    return "cuda_ipc" if shared else "filesystem"


def check_transport(w: WeightsConfig, d: Deployment, urls: list[str]) -> None:
    """The shared-GPU check needs the GPU ids: preflight does it (`runs.preflight`)."""
    t = w.transport
    if t in ("auto", "filesystem"):
        return
    if d.type != "single_node" or urls:
        raise ValueError(f"weights.transport: {t} runs on one node with replicas it starts; use filesystem")
    if t == "cuda_ipc" and (d.num_inference_gpus != 1 or d.num_train_gpus != 1):
        raise ValueError(
            "weights.transport: cuda_ipc needs vLLM and the trainer on one shared GPU "
            "(deployment.num_inference_gpus = num_train_gpus = 1); use nccl across GPUs"
        )
    if t == "nccl" and d.num_train_gpus > 1:
        raise ValueError("weights.transport: nccl sends from one trainer rank; set num_train_gpus = 1")
