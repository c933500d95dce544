"""The root config of each command, composed of sections that live in their own modules.

One RL config (`RLConfig`) resolves into the job configs of its processes (`TrainerJobConfig`,
`InferenceJobConfig`), which `rlfleet trainer` and `rlfleet inference` also accept on their own;
the orchestrator runs inside the `rl` flow. Every model forbids unknown keys so a
typo fails before anything starts, with the field's dotted path in the message.

Who checks what: a section its own fields (its model, in its module); a root the rules that span
its sections (its validator, one named function each); preflight (runs/configs.py) only what needs
the machine it launches on, through the launch check of each concept's module (check_model,
check_ports, check_gpus, ...).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

from rlfleet.config.advantage import AdvantageConfig
from rlfleet.config.base import FleetName, NonEmptyStr, Strict
from rlfleet.config.deployment import Deployment, DeploymentConfig, SlurmConfig, check_slurm_fit
from rlfleet.config.faults import FaultsConfig
from rlfleet.config.inference import InferenceConfig
from rlfleet.config.loss import WithLoss
from rlfleet.config.model import ModelConfig
from rlfleet.config.rollouts import EvalConfig, OrchestratorConfig
from rlfleet.config.served import POLICY, ServedModelConfig, check_served_gpus, served_ports
from rlfleet.config.trainer import BenchConfig, TrainerConfig
from rlfleet.config.weights import AutoConfig, WeightsConfig


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
    fleet: FleetName | None = Field(
        None, description="The warm fleet whose waiting trainer takes this job, if its device is this one's."
    )


class InferenceJobConfig(Strict):
    """What the vLLM replicas of a run need; the `rl` flow writes it as `configs/inference.toml`.
    A served model (`[[served]]`) gets one too, under its own `name`."""

    name: str = Field(
        POLICY, description="vLLM's served model name; also its replicas' log and pidfile names."
    )
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
    fleet: FleetName | None = Field(
        None, description="`inference.urls` are this warm fleet's: a replica down is waited for, not dropped."
    )

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
    fleet: FleetName | None = Field(
        None,
        description="Evaluate on this warm fleet's replicas (the checkpoint loaded on them) instead of "
        "starting vLLM; holds one replica, waiting while runs hold them all.",
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
    fleet: FleetName | None = Field(
        None,
        description="Attach to this warm fleet's vLLM replicas (`rlfleet fleet up`) instead of starting "
        "them: the same server arguments are required; the run holds one replica and its warm trainer.",
    )
    eval: EvalConfig = Field(default_factory=EvalConfig)
    faults: FaultsConfig = Field(default_factory=FaultsConfig, description="The stall watchdog.")
    served: list[ServedModelConfig] = Field(
        default_factory=list,
        description="[[served]]: frozen models served beside the policy (teachers, judges); weights never "
        "change on them.",
    )

    @model_validator(mode="after")
    def _sections_agree(self) -> RLConfig:
        """The rules that span sections; each section checks its own fields itself."""
        o, i, d = self.orchestrator, self.inference, self.deployment
        samples_fit_context(o, i)
        check_slurm_fit(d, self.slurm, "rl")
        replicas_fit_gpus(d, i)
        self.weights.check(d, i.urls)
        sleep_fits(i, o, d)
        self.faults.check(o.env)
        served_fit(self)
        distill_fits(self)
        return self

    def trainer_job(self, gpu_ids: list[str] | None = None) -> TrainerJobConfig:
        return TrainerJobConfig(
            **self._base(),
            trainer=self.trainer,
            loss=self.loss,
            weights=self.weights,
            inference=self.inference,
            gpu_ids=gpu_ids or [],
            fleet=self.fleet,
        )

    def inference_job(self, gpu_ids: list[str] | None = None) -> InferenceJobConfig:
        return InferenceJobConfig(
            output_dir=self.output_dir,
            seed=self.seed,
            model=self.model,
            inference=self.inference,
            weights=self.weights,
            gpu_ids=gpu_ids or [],
            fleet=self.fleet,
        )

    def served_jobs(self, gpus: dict[str, list[str]] | None = None) -> list[InferenceJobConfig]:
        """One job per served model: its replicas, launched and relaunched as the policy's are."""
        i, gpus = self.inference, gpus or {}
        ports = served_ports(self.served, i.port + i.num_replicas)
        return [
            InferenceJobConfig(
                name=s.name,
                output_dir=self.output_dir,
                seed=self.seed,
                model=ModelConfig(path=s.path, dtype=self.model.dtype),
                inference=InferenceConfig(
                    host=i.host,
                    port=port,
                    num_replicas=s.num_replicas,
                    tensor_parallel_size=s.tensor_parallel_size,
                    max_model_len=s.max_model_len or i.max_model_len + 1,
                    dtype=i.dtype,
                    gpu_memory_utilization=s.gpu_memory_utilization,
                    cpu_kv_cache_gib=i.cpu_kv_cache_gib,
                    cpu_threads_bind=i.cpu_threads_bind,
                    startup_timeout_s=i.startup_timeout_s,
                    extra_args=s.extra_args,
                ),
                weights=self.weights,
                gpu_ids=gpus.get(s.name, []),
            )
            for s, port in zip(self.served, ports, strict=True)
        ]

    def _base(self) -> dict:
        return dict(output_dir=self.output_dir, seed=self.seed, max_steps=self.max_steps, model=self.model)


def samples_fit_context(o: OrchestratorConfig, i: InferenceConfig) -> None:
    """A turn's prompt and its max_tokens fit vLLM's context, and a packed row holds any sample."""
    if o.max_tokens >= i.max_model_len:
        raise ValueError(
            f"orchestrator.max_tokens ({o.max_tokens}) must be below inference.max_model_len ({i.max_model_len})"
        )
    if o.seq_len and o.seq_len < i.max_model_len:
        raise ValueError(
            f"orchestrator.seq_len ({o.seq_len}) must be at least inference.max_model_len "
            f"({i.max_model_len}) so that every sample fits a packed row"
        )


def replicas_fit_gpus(d: Deployment, i: InferenceConfig) -> None:
    """The replicas take exactly the GPUs the deployment gives inference, whole replicas a node."""
    if d.type == "multi_node" and d.gpus_per_node and d.gpus_per_node % i.tensor_parallel_size:
        raise ValueError(
            f"inference.tensor_parallel_size ({i.tensor_parallel_size}) must divide "
            f"deployment.gpus_per_node ({d.gpus_per_node})"
        )
    if d.type == "single_node" and d.num_inference_gpus and d.num_inference_gpus != i.workers:
        raise ValueError(
            f"deployment.num_inference_gpus ({d.num_inference_gpus}) must equal inference.num_replicas x "
            f"inference.tensor_parallel_size ({i.num_replicas} x {i.tensor_parallel_size})"
        )


def served_fit(cfg: RLConfig) -> None:
    """Served models have unique names and their ports do not overlap the policy's."""
    names = [s.name for s in cfg.served]
    if len(set(names)) != len(names):
        raise ValueError(f"served: names must be unique, got {names}")
    check_served_gpus(cfg.served)
    i = cfg.inference
    taken = set(range(i.port, i.port + i.num_replicas))
    for k, (s, port) in enumerate(
        zip(cfg.served, served_ports(cfg.served, i.port + i.num_replicas), strict=True)
    ):
        mine = set(range(port, port + s.num_replicas))
        if mine & taken or port + s.num_replicas - 1 > 65535:
            raise ValueError(f"served.{k}.port: ports {sorted(mine)} overlap another model's or exceed 65535")
        taken |= mine


def distill_fits(cfg: RLConfig) -> None:
    """A teacher (`loss.distill.teacher`) is a served model that sees whole trajectories, and no
    shaping throws away the samples whose only signal is its per-token term."""
    d, i, names = cfg.loss.distill, cfg.inference, [s.name for s in cfg.served]
    if d is None:
        return
    teacher = next((s for s in cfg.served if s.name == d.teacher), None)
    if teacher is None:
        raise ValueError(f"loss.distill.teacher: {d.teacher!r} is not a [[served]] model (served: {names})")
    if teacher.max_model_len is not None and teacher.max_model_len <= i.max_model_len:
        raise ValueError(
            f"served.{names.index(d.teacher)}.max_model_len ({teacher.max_model_len}) must exceed "
            f"inference.max_model_len ({i.max_model_len}): the teacher scores whole trajectories"
        )
    if cfg.orchestrator.shaping.dynamic_sampling:
        raise ValueError(
            "orchestrator.shaping.dynamic_sampling drops groups whose rewards are all equal, but with "
            "loss.distill every sample carries the teacher's per-token term: set dynamic_sampling = false"
        )


def sleep_fits(i: InferenceConfig, o: OrchestratorConfig, d: Deployment) -> None:
    """inference.sleep frees vLLM's GPUs while the trainer steps on them: shared GPUs, on-policy."""
    single = d.type == "single_node"
    shared = single and (d.num_inference_gpus == d.num_train_gpus == 1 or d.placement == "colocated")
    if i.sleep and (o.max_async_level or not shared):
        raise ValueError(
            "inference.sleep: vLLM sleeps while the trainer steps on the GPUs they share, so it needs "
            "deployment.placement = colocated (or deployment.num_inference_gpus = num_train_gpus = 1) and "
            "orchestrator.max_async_level = 0"
        )


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
    def _trainer_only(self) -> SFTConfig:
        check_slurm_fit(self.deployment, self.slurm, "sft")
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
