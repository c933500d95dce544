"""Where a run's processes go: `[deployment]` (one node, or a SLURM job's nodes) and `[slurm]`.

The TOML section names the run's placement; Prefect's deployments (flows registered with a work
pool, `rlfleet deploy`) are workers/deploy.py's and rlfleet/resources/prefect.yaml's.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Discriminator, Field, Tag, field_validator, model_validator

from rlfleet.config.base import NonEmptyStr, Strict


class DeploymentConfig(Strict):
    """One node's GPUs, laid out by `placement` (config/placement.py decides and says what it chose)."""

    type: Literal["single_node"] = "single_node"
    num_inference_gpus: int = Field(0, ge=0, description="0 = CPU inference.")
    num_train_gpus: int = Field(0, ge=0, description="0 = CPU trainer.")
    placement: Literal["disaggregated", "colocated"] = Field(
        "disaggregated",
        description="disaggregated: inference on the first num_inference_gpus visible GPUs, the trainer on "
        "the next num_train_gpus (one visible GPU is shared when each asks for at most one). colocated: "
        "each of the first N GPUs holds a vLLM replica (or TP shard) and a trainer rank "
        "(N = num_inference_gpus = num_train_gpus).",
    )

    @model_validator(mode="after")
    def _colocated(self) -> DeploymentConfig:
        ni, nt = self.num_inference_gpus, self.num_train_gpus
        if self.placement == "colocated" and (ni != nt or nt < 1):
            raise ValueError(
                "deployment.placement = colocated puts a vLLM replica (or TP shard) and a trainer rank on every "
                f"GPU: deployment.num_inference_gpus ({ni}) must equal deployment.num_train_gpus ({nt}), at least 1"
            )
        return self


class MultiNodeDeployment(Strict):
    """A SLURM job of num_train_nodes + num_infer_nodes nodes (inference nodes first)."""

    type: Literal["multi_node"]
    num_train_nodes: int = Field(1, ge=0, description="Nodes running the torchrun trainer.")
    num_infer_nodes: int = Field(1, ge=0, description="Nodes running vLLM replicas.")
    gpus_per_node: int = Field(0, ge=0, description="0 = CPU nodes.")
    nodes_per_fsdp_group: int = Field(
        1, ge=1, description="Train nodes one FSDP group shards over; groups replicate (HSDP)."
    )

    @model_validator(mode="after")
    def _groups(self) -> MultiNodeDeployment:
        if self.num_train_nodes and self.num_train_nodes % self.nodes_per_fsdp_group:
            raise ValueError(
                f"deployment.nodes_per_fsdp_group ({self.nodes_per_fsdp_group}) must divide "
                f"deployment.num_train_nodes ({self.num_train_nodes})"
            )
        return self

    @property
    def num_nodes(self) -> int:
        return self.num_train_nodes + self.num_infer_nodes


def _deployment_type(v: object) -> str:
    return v.get("type", "single_node") if isinstance(v, dict) else getattr(v, "type", "single_node")


Deployment = Annotated[
    Annotated[DeploymentConfig, Tag("single_node")] | Annotated[MultiNodeDeployment, Tag("multi_node")],
    Discriminator(_deployment_type),
]
"""`[deployment]`: `type` picks the model; it defaults to single_node."""


def all_shared(inference_gpus: list[str], trainer_gpus: list[str]) -> bool:
    """Every vLLM GPU also holds a trainer rank (one shared GPU, or deployment.placement = colocated)."""
    return bool(inference_gpus) and set(inference_gpus) <= set(trainer_gpus)


def not_shared(what: str, inference_gpus: list[str], trainer_gpus: list[str]) -> str | None:
    """Why `what`, which needs a trainer rank on every vLLM GPU, cannot run on these, else None."""
    if all_shared(inference_gpus, trainer_gpus):
        return None
    return (
        f"{what} needs vLLM and a trainer rank on the same GPU(s); they got {inference_gpus or 'none'} and "
        f"{trainer_gpus or 'none'} (deployment.placement = colocated, or one visible GPU, shares them)"
    )


_SLURM_TIME = re.compile(
    r"^(\d+-)?\d+(:\d{1,2}){0,2}$|^(\d+-)?\d+:\d{1,2}(:\d{1,2})?$|^UNLIMITED$|^INFINITE$"
)


class SlurmConfig(Strict):
    """`[slurm]`: render an sbatch script, write it with the resolved configs, submit it."""

    job_name: NonEmptyStr = Field("rlfleet", description="sbatch --job-name.")
    partition: str | None = Field(None, description="sbatch --partition; unset = the cluster's default.")
    account: str | None = Field(None, description="sbatch --account.")
    qos: str | None = Field(None, description="sbatch --qos.")
    time: str = Field("01:00:00", description="sbatch --time: MM, HH:MM:SS, D-HH[:MM[:SS]].")
    template_path: str | None = Field(
        None,
        description="A custom Jinja2 sbatch template; default: rlfleet/resources/templates/rlfleet.sbatch.j2 (packaged).",
    )
    dry_run: bool = Field(False, description="Write the script and configs, do not submit.")
    extra_directives: list[str] = Field(
        default_factory=list, description="More `#SBATCH` lines, e.g. '--exclusive', '--mem=0'."
    )
    rdzv_port: int = Field(29500, ge=1024, le=65535, description="torchrun port on the first train node.")

    @field_validator("time")
    @classmethod
    def _time(cls, v: str) -> str:
        if not _SLURM_TIME.match(v):
            raise ValueError("not a SLURM time (MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS)")
        return v

    @field_validator("template_path")
    @classmethod
    def _template(cls, v: str | None) -> str | None:
        if v is not None and not Path(v).is_file():
            raise ValueError(f"{v} is not a file")
        return v

    @field_validator("extra_directives")
    @classmethod
    def _directives(cls, v: list[str]) -> list[str]:
        for d in v:
            if not d.startswith("-") or "\n" in d:
                raise ValueError(f"{d!r}: each directive is one sbatch option like '--exclusive'")
        return v


def slurm_missing(
    d: DeploymentConfig | MultiNodeDeployment, slurm: SlurmConfig | None, urls: list[str] | None = None
) -> str | None:
    """multi_node runs only as a SLURM job: a config with [slurm] submits one. The job's own configs
    come without it: sft and inference ones as single_node, the rl controller's with the inference
    nodes' `urls` (the sbatch script passes --inference.urls)."""
    if d.type == "multi_node" and slurm is None and not urls:
        return "deployment.type: multi_node runs as a SLURM job; add a [slurm] block"
    return None


def check_slurm_fit(
    d: DeploymentConfig | MultiNodeDeployment, slurm: SlurmConfig | None, command: str
) -> None:
    """Which node counts each command's job needs; multi_node only runs as a SLURM job."""
    if d.type == "single_node":
        return
    if command != "rl" and (problem := slurm_missing(d, slurm)):  # rl: at preflight, with its urls
        raise ValueError(problem)
    need_train, need_infer = {"rl": (True, True), "sft": (True, False), "inference": (False, True)}[command]
    for field, n, need in (
        ("num_train_nodes", d.num_train_nodes, need_train),
        ("num_infer_nodes", d.num_infer_nodes, need_infer),
    ):
        if need and n < 1:
            raise ValueError(f"deployment.{field}: `rlfleet {command}` on multi_node needs at least 1")
        if not need and n:
            raise ValueError(f"deployment.{field}: must be 0 for `rlfleet {command}` (got {n})")
