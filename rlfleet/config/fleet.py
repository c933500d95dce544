"""`rlfleet fleet up @ fleet.toml`: vLLM replicas of one base model kept running between runs
(rlfleet/fleet/). A run attaches with a top-level `fleet = "NAME"`."""

from __future__ import annotations

from pydantic import Field, model_validator

from rlfleet.config.base import FleetName, Strict
from rlfleet.config.inference import InferenceConfig
from rlfleet.config.model import ModelConfig
from rlfleet.config.models import InferenceJobConfig
from rlfleet.config.served import POLICY


class FleetConfig(Strict):
    name: FleetName = Field(description="What runs name in `fleet = NAME`.")
    model: ModelConfig
    inference: InferenceConfig = Field(
        default_factory=InferenceConfig,
        description="The replicas' server shape; a run must ask for the same one to attach.",
    )
    gpu_ids: list[str] = Field(
        default_factory=list, description="CUDA devices, tensor_parallel_size per replica; empty = CPU."
    )
    seed: int = Field(0, description="vLLM's seed: the fleet's, whichever run attaches.")
    trainer: bool = Field(
        True,
        description="Keep a warm trainer process beside each replica (imports paid, on `trainer_gpu_ids`) "
        "for the run that holds the replica.",
    )
    trainer_gpu_ids: list[str] = Field(
        default_factory=list,
        description="One CUDA device per replica, for the warm trainer beside it; empty = CPU. It may be "
        "its own replica's GPU (a one-GPU fleet: vLLM's `inference.gpu_memory_utilization` must leave the "
        "trainer room, as 0.45 does a one-GPU run), never another replica's. A run whose trainer is "
        "placed elsewhere starts its own.",
    )
    api_port: int = Field(
        4280,
        ge=1,
        le=65535,
        description="The Prefect server the fleet starts when PREFECT_API_URL is unset; attached runs use it.",
    )

    @model_validator(mode="after")
    def _no_urls(self) -> FleetConfig:
        if self.inference.urls:
            raise ValueError("inference.urls: a fleet starts its own replicas")
        if self.trainer_gpu_ids and len(self.trainer_gpu_ids) != self.inference.num_replicas:
            raise ValueError(
                f"trainer_gpu_ids: one per replica ({self.inference.num_replicas}), or none for the CPU"
            )
        self.job()  # replicas x TP against gpu_ids
        tp = self.inference.tensor_parallel_size
        for i, gpu in enumerate(self.trainer_gpu_ids):
            own = self.gpu_ids[i * tp : (i + 1) * tp]
            if gpu in self.gpu_ids and gpu not in own:
                raise ValueError(
                    f"trainer_gpu_ids: {gpu} is another replica's GPU; replica {i}'s warm trainer goes on "
                    f"its own replica's ({','.join(own)}) or on one no replica uses"
                )
            if gpu in own and self.inference.gpu_memory_utilization is None:
                raise ValueError(
                    f"inference.gpu_memory_utilization: replica {i} shares GPU {gpu} with its warm trainer; "
                    "set vLLM's share so that the trainer has room (a one-GPU run takes 0.45)"
                )
        return self

    def job(self, output_dir: str = "outputs/fleet") -> InferenceJobConfig:
        """The replicas' launch job; `output_dir` holds their logs and pidfiles. On GPUs with vLLM's
        sleep mode, whatever `inference.sleep` says: idle replicas rest asleep (fleet/rest.py)."""
        return InferenceJobConfig(
            name=POLICY,
            output_dir=output_dir,
            seed=self.seed,
            model=self.model,
            inference=self.inference.model_copy(update={"sleep": bool(self.gpu_ids)}),
            gpu_ids=self.gpu_ids,
        )
