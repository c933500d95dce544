"""`[inference]`: the vLLM replicas of a run, and the launch check that their ports are free."""

from __future__ import annotations

import socket
from typing import Literal

from pydantic import Field, model_validator

from rlfleet.config.base import Strict
from rlfleet.config.dtypes import Dtype


class InferenceConfig(Strict):
    """The vLLM replicas (rlfleet/inference/): one OpenAI-compatible server per replica."""

    host: str = Field("127.0.0.1", description="Address the replicas bind to and are reached at.")
    port: int = Field(8000, ge=1024, le=65535, description="Port of replica 0; replica i uses port + i.")
    num_replicas: int = Field(1, ge=1, description="vLLM servers (data parallel); each on its own GPUs.")
    tensor_parallel_size: int = Field(1, ge=1, description="GPUs per replica (vLLM's tensor parallelism).")
    max_model_len: int = Field(
        512, ge=16, description="vLLM's context length: prompt and every turn of a rollout must fit."
    )
    dtype: Dtype | None = Field(
        None, description="vLLM's dtype; unset = bfloat16 on a GPU, model.dtype on a CPU."
    )
    gpu_memory_utilization: float | None = Field(
        None,
        gt=0.0,
        le=1.0,
        description="vLLM's share of its GPU; unset = 0.9 on its own GPU, and on one it shares with the "
        "trainer the memory plan's (KV for every rollout in flight where that fits; config/memory.py), "
        "0.45 where the GPU's memory cannot be read.",
    )
    quantization: Literal["fp8"] | None = Field(
        None,
        description="fp8: vLLM quantizes the bf16 weights to FP8 online, at its start and at every "
        "weight load (GPU replicas, Hopper or newer); the trainer stays bf16, and [loss] is_correction "
        "defaults to token_tis for the sampler's larger mismatch. Unset: vLLM serves in its dtype.",
    )
    max_num_seqs: int | None = Field(
        None,
        ge=1,
        description="vLLM's --max-num-seqs per replica; unset on a CPU = the samples the rollout stream "
        "keeps in flight per replica (at least 128, vLLM-CPU's own default), on a GPU = vLLM's default.",
    )
    cpu_kv_cache_gib: int = Field(1, ge=1, description="VLLM_CPU_KVCACHE_SPACE on CPU hosts.")
    cpu_threads_bind: str = Field(
        "",
        description="VLLM_CPU_OMP_THREADS_BIND on CPU hosts (e.g. '0' or '0-3'); empty = the cores but one, unbound.",
    )
    enforce_eager: bool | None = Field(
        None, description="Skip CUDA graphs; unset = eager on a CPU (starts faster), graphs on a GPU."
    )
    sleep: bool = Field(
        False,
        description="Colocated: vLLM frees its GPU memory (weights and KV cache) while the trainer steps "
        "and wakes to load the new weights; needs one GPU shared with the trainer and max_async_level = 0. "
        "Unset on such a GPU, the memory plan turns it on where the trainer fits no other way without "
        "recomputing every layer (config/memory.py).",
    )
    startup_timeout_s: float = Field(
        600.0, gt=0, description="How long a replica may take to report healthy."
    )
    stream_interval: int = Field(
        16, ge=1, description="vLLM streams a request's tokens in chunks of this many (--stream-interval)."
    )
    extra_args: list[str] = Field(
        default_factory=list, description="More command-line arguments for each vLLM server, appended last."
    )
    urls: list[str] = Field(
        default_factory=list,
        description="Externally started replicas (a SLURM job's inference nodes): used, never launched.",
    )
    replica_offset: int = Field(
        0, ge=0, description="Index of this node's first replica (its log and pidfile names)."
    )

    def vllm_dtype(self, model_dtype: str, on_gpu: bool) -> str:
        return self.dtype or ("bfloat16" if on_gpu else model_dtype)

    @property
    def workers(self) -> int:
        """vLLM worker processes across replicas: each loads every step's weights."""
        return self.num_replicas * self.tensor_parallel_size

    @model_validator(mode="after")
    def _ports(self) -> InferenceConfig:
        if self.port + self.num_replicas - 1 > 65535:
            raise ValueError(
                f"port: port + num_replicas - 1 ({self.port} + {self.num_replicas} - 1) exceeds 65535"
            )
        return self


def port_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def check_ports(inference: InferenceConfig) -> list[str]:
    """Each replica's port is free on its host (checked at launch: another run may hold it)."""
    if inference.urls:  # external replicas: their nodes own the ports
        return []
    busy = [
        inference.port + r
        for r in range(inference.num_replicas)
        if not port_free(inference.host, inference.port + r)
    ]
    return [f"inference.port: port(s) {busy} on {inference.host} are in use"] if busy else []
