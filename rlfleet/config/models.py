"""Pydantic models for every rlfleet config.

One RL config (`RLConfig`) resolves into the job configs of its processes (`TrainerJobConfig`,
`InferenceJobConfig`), which `rlfleet trainer` and `rlfleet inference` also accept on their own;
the orchestrator runs inside the `rl` flow. Every model forbids unknown keys so a
typo fails before anything starts, with the field's dotted path in the message.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator, model_validator

from rlfleet.config.advantage import AdvantageConfig
from rlfleet.config.base import NonEmptyStr, Strict
from rlfleet.config.deployment import (
    Deployment,
    DeploymentConfig,
    SlurmConfig,
    check_slurm_fit,
)
from rlfleet.config.dtypes import Dtype
from rlfleet.config.faults import FaultsConfig
from rlfleet.config.lora import LoraConfig
from rlfleet.config.loss import WithLoss
from rlfleet.config.rollouts import EvalConfig, OrchestratorConfig
from rlfleet.config.schedule import LRScheduleConfig
from rlfleet.config.weights import AutoConfig, WeightsConfig


class ModelConfig(Strict):
    """The policy: what the trainer trains and vLLM serves."""

    path: NonEmptyStr = Field(
        description="A local HF model directory (config.json, safetensors, tokenizer) or a hub id "
        "(`org/name`, `org/name@revision`), resolved to its local snapshot at preflight."
    )
    dtype: Dtype = Field(
        "float32", description="The trainer's weights (and optimizer masters); vLLM's on a CPU."
    )


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
        description="vLLM's share of its GPU; unset = 0.9 on its own GPU, 0.45 on one it shares with the trainer.",
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
        "and wakes to load the new weights; needs one GPU shared with the trainer and max_async_level = 0.",
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


class TrainerConfig(Strict):
    """The long-lived trainer (rlfleet/trainer/): optimizer, checkpoints and its GPU scale; SFT uses it too."""

    lr: float = Field(3e-3, gt=0.0, description="AdamW's peak learning rate (see lr_schedule).")
    weight_decay: float = Field(0.0, ge=0.0, description="AdamW's decoupled weight decay.")
    betas: tuple[float, float] = Field((0.9, 0.99), description="AdamW's (beta1, beta2), each in [0, 1).")
    lr_schedule: LRScheduleConfig = Field(
        default_factory=LRScheduleConfig,
        description='Warm-up and decay of lr; `lr_schedule = "cosine"` is shorthand for its `decay`.',
    )
    max_grad_norm: float = Field(1.0, gt=0.0, description="Gradients are clipped to this global norm.")
    checkpoint_interval: int = Field(5, ge=1, description="Checkpoint every k steps (and the last).")
    keep_weights: int = Field(3, ge=1, description="Weight snapshots kept for broadcast.")
    keep_checkpoints: int = Field(
        0, ge=0, description="Checkpoints kept (0 = all); the one a resume would use is never deleted."
    )
    device: Literal["auto", "cpu", "cuda"] = Field(
        "auto", description="auto = cuda when a GPU is visible to the trainer, else cpu."
    )
    num_threads: int = Field(0, ge=0, description="torch CPU threads; 0 = torch's default.")
    cpu_affinity: list[int] = Field(
        default_factory=list, description="CPUs the trainer process runs on (sched_setaffinity); empty = any."
    )
    poll_interval_s: float = Field(
        0.01, gt=0, description="How often the trainer and the train task look for their file (local store)."
    )
    # GPU scale (rlfleet/trainer/parallel.py); a single CPU process ignores all of these but lm_head_chunk.
    fsdp: Literal["auto", "on", "off"] = Field("auto", description="auto = FSDP2 on a GPU or >1 rank.")
    param_dtype: Literal["bfloat16", "float32", "model"] = Field(
        "bfloat16", description="FSDP2 compute dtype (params stay model.dtype; grads reduce in fp32)."
    )
    dp_replicate: int = Field(1, ge=1, description="HSDP replicas (ranks = replicate x shard).")
    reshard_after_forward: bool = Field(True, description="Free gathered params after forward (ZeRO-3).")
    activation_checkpointing: Literal["none", "full", "selective"] = Field(
        "none",
        description="Recompute each decoder layer in backward; on a GPU, `none` turns to `full` by itself "
        "when the micro-batch would not fit without it (the trainer log says so).",
    )
    micro_batch_tokens: int | None = Field(
        None,
        ge=1,
        description="A GPU trainer's micro-batch: whole packed rows (orchestrator.seq_len) totalling at most "
        "this many tokens, and at least one row; unset = orchestrator.micro_batch_size x "
        "inference.max_model_len when that is set, else sized at the first batch from the memory the "
        "trainer finds free beside vLLM. Unpacked (seq_len 0) and CPU trainers ignore it.",
    )
    optimizer_offload: bool = Field(False, description="FSDP2 CPU offload of params, grads, optim state.")
    lm_head_chunk: int | None = Field(
        None,
        ge=0,
        description="Tokens per LM-head chunk for logprobs; 0 = full logits; unset = 8192 on a GPU, 0 on a CPU.",
    )
    compile: bool = Field(False, description="torch.compile each decoder layer and the chunked LM head.")
    lora: LoraConfig | None = Field(
        None, description="[trainer.lora]: train LoRA adapters on a frozen base; unset = full fine-tuning."
    )

    @field_validator("betas")
    @classmethod
    def _betas(cls, v: tuple[float, float]) -> tuple[float, float]:
        if not all(0.0 <= b < 1.0 for b in v):
            raise ValueError("each beta must be in [0, 1)")
        return v


class TaskPolicy(Strict):
    """`[tasks]`: every Prefect task of a run retries transient failures (a dead trainer or replica,
    a timeout, HTTP 5xx); deterministic ones (bad config, HTTP 4xx, OOM twice) fail the run at once."""

    retries: int = Field(2, ge=0, description="Retries of a task after a transient failure.")
    retry_delay_s: float = Field(2.0, ge=0, description="Seconds before each retry.")
    step_timeout_s: float = Field(900.0, gt=0, description="Timeout of one task of a step.")


class WandbConfig(Strict):
    """Weights & Biases logging, under `<output_dir>/wandb/`."""

    mode: Literal["offline", "online", "disabled", "auto"] = Field(
        "auto", description="auto = online when WANDB_API_KEY is set, else offline."
    )
    project: str = Field("rlfleet", description="The wandb project.")


class _RunBase(Strict):
    output_dir: NonEmptyStr = Field(
        "outputs/run",
        description="The run store: a local path or `s3://bucket/prefix`; the same one again resumes the run.",
    )
    seed: int = Field(0, description="Seeds the prompts' order, vLLM and the trainer.")
    max_steps: int = Field(20, ge=1, description="Optimizer steps of the run.")
    model: ModelConfig


class BenchConfig(Strict):
    """`rlfleet trainer --bench`: fake batches through the real train step, no store, no vLLM."""

    enabled: bool = Field(False, description="Run the benchmark instead of training (`--bench` sets it).")
    warmup_steps: int = Field(2, ge=0, description="Steps run first and not measured (compile, allocator).")
    steps: int = Field(5, ge=1, description="Measured steps.")
    seq_len: int = Field(4096, ge=2, description="Tokens per fake sequence.")
    micro_batch_size: int = Field(1, ge=1, description="Sequences per micro-batch (per rank).")
    micro_batches: int = Field(4, ge=1, description="Micro-batches per optimizer step (per rank).")
    output_json: str | None = Field(None, description="Also write the results to this JSON file.")


class TrainerJobConfig(_RunBase, WithLoss):
    """What one trainer process needs; the `rl` flow writes it as `configs/trainer.toml`."""

    trainer: TrainerConfig = Field(default_factory=TrainerConfig)
    weights: WeightsConfig = Field(
        default_factory=AutoConfig, description="How each step's weights reach vLLM."
    )
    inference: InferenceConfig = Field(
        default_factory=InferenceConfig, description="The replicas the trainer's weights go to."
    )
    bench: BenchConfig = Field(default_factory=BenchConfig)
    gpu_ids: list[str] = Field(default_factory=list, description="CUDA devices of the trainer; empty = CPU.")


class InferenceJobConfig(Strict):
    """What the vLLM replicas of a run need; the `rl` flow writes it as `configs/inference.toml`."""

    output_dir: str = Field("outputs/run", description="The run store (logs, pidfiles, weights to load).")
    seed: int = Field(0, description="vLLM's seed.")
    model: ModelConfig
    inference: InferenceConfig = Field(default_factory=InferenceConfig)
    weights: WeightsConfig = Field(
        default_factory=AutoConfig, description="How each step's weights reach vLLM."
    )
    gpu_ids: list[str] = Field(default_factory=list, description="CUDA devices, tp per replica; empty = CPU.")
    deployment: Deployment = Field(
        default_factory=DeploymentConfig, description="`multi_node`: the inference nodes of a SLURM job."
    )
    slurm: SlurmConfig | None = Field(None, description="Submit the replicas as a SLURM job.")

    @property
    def num_gpus(self) -> int:
        return len(self.gpu_ids)

    @model_validator(mode="after")
    def _gpus(self) -> InferenceJobConfig:
        need = self.inference.num_replicas * self.inference.tensor_parallel_size
        if self.gpu_ids and len(self.gpu_ids) != need:
            raise ValueError(
                f"gpu_ids: {len(self.gpu_ids)} GPUs for num_replicas x tensor_parallel_size = {need}"
            )
        check_slurm_fit(self.deployment, self.slurm, "inference")
        return self


class EvalJobConfig(Strict):
    """The `eval` flow: a checkpoint of the run in `output_dir` (or the base model) on its own vLLM."""

    output_dir: str = Field(
        "outputs/run", description="The run whose checkpoint is evaluated; results go to its evals/."
    )
    seed: int = Field(0, description="Seeds sampling.")
    model: ModelConfig
    checkpoint: Literal["latest", "base"] | int = Field(
        "latest", description="A step, latest, or base model."
    )
    eval: EvalConfig = Field(default_factory=EvalConfig)
    inference: InferenceConfig = Field(
        default_factory=lambda: InferenceConfig(port=8300), description="The eval's own vLLM (port 8300)."
    )


class _FlowRunBase(_RunBase):
    """What an `rl` and an `sft` run share: a name, the trainer, task retries, placement, SLURM."""

    run_name: str | None = Field(None, description="The flow run's name; unset = output_dir's last part.")
    trainer: TrainerConfig = Field(default_factory=TrainerConfig)
    tasks: TaskPolicy = Field(default_factory=TaskPolicy)
    deployment: Deployment = Field(
        default_factory=DeploymentConfig,
        description="Where the processes run: GPUs of one node (`single_node`), or a SLURM job's nodes (`multi_node`).",
    )
    slurm: SlurmConfig | None = Field(
        None, description="Run as a SLURM job: render, write and submit an sbatch script."
    )

    @property
    def name(self) -> str:
        return self.run_name or Path(self.output_dir).name


class RLConfig(_FlowRunBase, WithLoss):
    advantage: AdvantageConfig = Field(default_factory=AdvantageConfig)
    orchestrator: OrchestratorConfig = Field(default_factory=OrchestratorConfig)
    inference: InferenceConfig = Field(default_factory=InferenceConfig)
    weights: WeightsConfig = Field(
        default_factory=AutoConfig, description="How each step's weights reach vLLM."
    )
    wandb: WandbConfig = Field(default_factory=WandbConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)
    faults: FaultsConfig = Field(default_factory=FaultsConfig, description="The stall watchdog.")

    @model_validator(mode="after")
    def _consistent(self) -> RLConfig:
        o, i = self.orchestrator, self.inference
        if o.max_tokens >= i.max_model_len:
            raise ValueError(
                f"orchestrator.max_tokens ({o.max_tokens}) must be below inference.max_model_len ({i.max_model_len})"
            )
        if o.seq_len and o.seq_len < i.max_model_len:
            raise ValueError(
                f"orchestrator.seq_len ({o.seq_len}) must be at least inference.max_model_len "
                f"({i.max_model_len}) so that every sample fits a packed row"
            )
        d = self.deployment
        check_slurm_fit(d, self.slurm, "rl")
        if d.type == "multi_node" and d.gpus_per_node and d.gpus_per_node % i.tensor_parallel_size:
            raise ValueError(
                f"inference.tensor_parallel_size ({i.tensor_parallel_size}) must divide "
                f"deployment.gpus_per_node ({d.gpus_per_node})"
            )
        if (
            d.type == "single_node"
            and d.num_inference_gpus
            and d.num_inference_gpus != i.num_replicas * i.tensor_parallel_size
        ):
            raise ValueError(
                f"deployment.num_inference_gpus ({d.num_inference_gpus}) must equal inference.num_replicas x "
                f"inference.tensor_parallel_size ({i.num_replicas} x {i.tensor_parallel_size})"
            )
        if i.port + i.num_replicas - 1 > 65535:
            raise ValueError("inference.port: port + num_replicas - 1 exceeds 65535")
        self.weights.check(d, i.urls)
        self.faults.check(o.env)
        if i.sleep and (o.max_async_level or d.type != "single_node" or d.num_inference_gpus != 1):
            raise ValueError(
                "inference.sleep: vLLM sleeps while the trainer steps on the GPU they share, so it needs "
                "deployment.num_inference_gpus = num_train_gpus = 1 and orchestrator.max_async_level = 0"
            )
        return self

    def trainer_job(self, gpu_ids: list[str] | None = None) -> TrainerJobConfig:
        return TrainerJobConfig(
            **self._base(),
            trainer=self.trainer,
            loss=self.loss,
            weights=self.weights,
            inference=self.inference,
            gpu_ids=gpu_ids or [],
        )

    def inference_job(self, gpu_ids: list[str] | None = None) -> InferenceJobConfig:
        return InferenceJobConfig(
            output_dir=self.output_dir,
            seed=self.seed,
            model=self.model,
            inference=self.inference,
            weights=self.weights,
            gpu_ids=gpu_ids or [],
        )

    def _base(self) -> dict:
        return dict(output_dir=self.output_dir, seed=self.seed, max_steps=self.max_steps, model=self.model)


class SFTDataConfig(Strict):
    """`[data]`: one example per row of a local file."""

    path: NonEmptyStr = Field(description="Local .jsonl or .parquet file.")
    format: Literal["auto", "chat", "prompt_completion"] = Field(
        "auto",
        description="auto: `messages` in the first row = chat, `prompt`/`completion` = prompt_completion.",
    )
    batch_size: int = Field(32, ge=1, description="Sequences per optimizer step.")
    micro_batch_size: int = Field(32, ge=1, description="Sequences per forward/backward pass.")
    max_seq_len: int = Field(512, ge=2, description="Longer sequences are truncated (right).")
    pack: bool = Field(False, description="Pack sequences into rows of max_seq_len (micro_batch_size rows).")
    shuffle: bool = Field(True, description="A fresh permutation per epoch, from the seed.")


class SFTConfig(_FlowRunBase):
    """Supervised fine-tuning with the RL trainer's model, optimizer, checkpoints and resume."""

    data: SFTDataConfig
    bench: BenchConfig = Field(default_factory=BenchConfig)

    @model_validator(mode="after")
    def _placement(self) -> SFTConfig:
        check_slurm_fit(self.deployment, self.slurm, "sft")
        return self

    @model_validator(mode="after")
    def _trainer_only(self) -> SFTConfig:
        if self.deployment.type == "single_node" and self.deployment.num_inference_gpus:
            raise ValueError("deployment.num_inference_gpus: SFT runs no inference; set it to 0")
        return self

    def trainer_job(self, gpu_ids: list[str] | None = None) -> TrainerJobConfig:
        """The trainer's view of this run: same model, trainer keys, seed and bench."""
        return TrainerJobConfig(
            output_dir=self.output_dir,
            seed=self.seed,
            max_steps=self.max_steps,
            model=self.model,
            trainer=self.trainer,
            bench=self.bench,
            gpu_ids=gpu_ids or [],
        )
