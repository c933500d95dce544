"""`[weights]`: how each step's weights reach vLLM, and the registry of weight transports.

Each transport is one entry here, a config model picked by `transport`: its settings, what the
config alone tells about it (`check`), where vLLM and the trainer must run for it (`placement`,
the launch check config/placement.py's check_gpus runs), and where its parts live, imported only by the process that runs each: the
trainer's publisher, a vLLM worker's receiver and the controller's rules (rlfleet/weights/). `auto`
is placed by `placed`. Outside this registry only a transport's own module names it.
"""

from __future__ import annotations

import importlib
from typing import Annotated, Any, ClassVar, Literal

from pydantic import Discriminator, Field, Tag

from rlfleet.config.base import Strict
from rlfleet.config.deployment import Deployment, all_shared, not_shared

FILES = "filesystem"
"""The transport that loads files: what a resumed run and a relaunched replica load, any transport."""


class TransportConfig(Strict):
    """What every transport's `[weights]` holds; checkpoints always go to the run store."""

    timeout_s: float = Field(600.0, gt=0, description="How long the trainer waits for vLLM to take a step.")
    nccl_port: int = Field(
        29650, ge=1024, le=65535, description="Rendezvous port of the nccl transport (the others ignore it)."
    )
    in_flight_kv: Literal["recompute", "keep"] = Field(
        "recompute",
        description="Requests in flight during a load stay scheduled (vLLM's pause keep mode). recompute: their "
        "KV cache is dropped and recomputed by the new weights on resume; keep: the old weights' KV is reused.",
    )

    # Each side's part as `module:name`, imported by the process that runs it (`part`):
    publisher: ClassVar[str]  # the trainer's: (TrainerJobConfig, RunStore, Parallel) -> Publisher
    receiver: ClassVar[str]  # a vLLM worker's: (worker, ticket, rank_base, device) -> (name, tensor) pairs
    controller: ClassVar[str]  # the controller's rules, a class of weights/controller.py built with the name
    trainer_copies: ClassVar[int] = 0  # copies of the weights the publisher keeps on the trainer's GPU

    def check(self, d: Deployment, urls: list[str]) -> None:
        """Refuse what the config alone shows cannot run (the GPUs themselves: `placement`)."""

    def placement(self, inference_gpus: list[str], trainer_gpus: list[str]) -> str | None:
        """Why this transport cannot run with vLLM and the trainer on these GPUs, else None."""
        return None

    @classmethod
    def part(cls, side: Literal["publisher", "receiver", "controller"]) -> Any:
        """One side's part, imported now: torch and vLLM stay out of the processes that do not run it."""
        module, _, attr = getattr(cls, side).partition(":")
        return getattr(importlib.import_module(module), attr)


def _one_node(t: str, d: Deployment, urls: list[str]) -> None:
    if d.type != "single_node" or urls:
        raise ValueError(f"weights.transport: {t} runs on one node with replicas it starts; use filesystem")


class FilesystemConfig(TransportConfig):
    """`weights/step_N` as an HF directory, reloaded in place by each replica."""

    transport: Literal["filesystem"] = Field("filesystem", description="weights/step_N + in-place reload.")
    publisher: ClassVar[str] = "rlfleet.weights.filesystem:publisher"
    receiver: ClassVar[str] = "rlfleet.weights.filesystem:worker_receive"
    controller: ClassVar[str] = "rlfleet.weights.controller:Filesystem"


class CudaIpcConfig(TransportConfig):
    """vLLM maps the trainer's GPU memory: two buffers, one copy of the weights each, on every
    trainer rank; each vLLM worker maps those of the rank on its own GPU."""

    transport: Literal["cuda_ipc"] = Field(
        "cuda_ipc", description="vLLM reads the trainer's GPU memory (a trainer rank on every vLLM GPU)."
    )
    publisher: ClassVar[str] = "rlfleet.weights.cuda_ipc:publisher"
    receiver: ClassVar[str] = "rlfleet.weights.cuda_ipc:worker_receive"
    controller: ClassVar[str] = "rlfleet.weights.controller:CudaIpc"
    trainer_copies: ClassVar[int] = 2  # the served step's buffer and the one the next step fills

    def check(self, d: Deployment, urls: list[str]) -> None:
        _one_node(self.transport, d, urls)
        one_each = d.num_inference_gpus == d.num_train_gpus == 1
        if not one_each and d.placement != "colocated":
            raise ValueError(
                "weights.transport: cuda_ipc needs a trainer rank on every vLLM GPU: deployment.placement = "
                "colocated, or deployment.num_inference_gpus = num_train_gpus = 1 on one GPU; use nccl or "
                "filesystem across GPUs"
            )

    def placement(self, inference_gpus: list[str], trainer_gpus: list[str]) -> str | None:
        what = "weights.transport: cuda_ipc maps the trainer's GPU memory into vLLM, so it"
        return not_shared(what, inference_gpus, trainer_gpus)


class NcclConfig(TransportConfig):
    """A broadcast from trainer rank 0 to every vLLM worker over a group of their own."""

    transport: Literal["nccl"] = Field(
        "nccl",
        description="A broadcast from trainer rank 0 to every vLLM worker (gloo when the trainer is on a CPU).",
    )
    publisher: ClassVar[str] = "rlfleet.weights.nccl:publisher"
    receiver: ClassVar[str] = "rlfleet.weights.nccl:worker_receive"
    controller: ClassVar[str] = "rlfleet.weights.controller:Nccl"
    trainer_copies: ClassVar[int] = 1  # the buckets it sends from

    def check(self, d: Deployment, urls: list[str]) -> None:
        _one_node(self.transport, d, urls)

    def placement(self, inference_gpus: list[str], trainer_gpus: list[str]) -> str | None:
        """Trainer rank 0 (the sender) and every vLLM worker are members of one NCCL group, and NCCL
        refuses two members on one GPU."""
        if trainer_gpus and trainer_gpus[0] in inference_gpus:
            return (
                f"weights.transport: nccl sends from trainer rank 0 to every vLLM worker in one NCCL group, "
                f"which refuses two members on one GPU, and GPU {trainer_gpus[0]} holds both (deployment.placement, "
                "deployment.num_inference_gpus, deployment.num_train_gpus); use cuda_ipc or filesystem there"
            )
        return None


class AutoConfig(FilesystemConfig):
    """Not a transport of its own: the placement picks cuda_ipc or filesystem once the GPUs are
    known (`placed`); a trainer started alone loads files."""

    transport: Literal["auto"] = Field(
        "auto", description="cuda_ipc when a trainer rank sits on every vLLM GPU, else filesystem."
    )


TRANSPORTS: dict[str, type[TransportConfig]] = {
    c.model_fields["transport"].default: c for c in (FilesystemConfig, CudaIpcConfig, NcclConfig)
}


def _transport(v: Any) -> str:
    return v.get("transport", "auto") if isinstance(v, dict) else getattr(v, "transport", "auto")


WeightsConfig = Annotated[
    Annotated[AutoConfig, Tag("auto")]
    | Annotated[FilesystemConfig, Tag("filesystem")]
    | Annotated[CudaIpcConfig, Tag("cuda_ipc")]
    | Annotated[NcclConfig, Tag("nccl")],
    Discriminator(
        _transport,
        custom_error_type="transport",
        custom_error_message="weights.transport: must be auto, filesystem, cuda_ipc or nccl",
    ),
]
"""`[weights]`: `transport` picks the entry; it defaults to auto."""


def transport_config(name: str) -> type[TransportConfig]:
    """The registry entry of `name`: `weights.transport` placed, or a held ticket's."""
    try:
        return TRANSPORTS[name]
    except KeyError:
        raise ValueError(f"unknown weights transport {name!r}; known: {sorted(TRANSPORTS)}") from None


def placed(w: TransportConfig, inference_gpus: list[str], trainer_gpus: list[str]) -> TransportConfig:
    """`auto` placed: cuda_ipc where a trainer rank sits on every vLLM GPU (one shared GPU, or
    colocated on all: no copy through files, as a colocated TRL's in-process sync), else filesystem;
    any other choice as it is."""
    if not isinstance(w, AutoConfig):
        return w
    entry = CudaIpcConfig if all_shared(inference_gpus, trainer_gpus) else FilesystemConfig
    return entry.model_validate(w.model_dump(exclude={"transport"}))
