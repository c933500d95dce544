"""What depends on placement once it is decided: vLLM's dtype and share of a shared GPU, the weight
transport placed, a CPU replica's batch, the trainer's micro-batch shape; and, on a CPU box, the cores.

config/placement.py decides where things run (`place`); this fills the defaults that follow from it.
"""

from __future__ import annotations

import os
import subprocess

from rlfleet.config.dtypes import DTYPE_BYTES
from rlfleet.config.loader import ConfigError
from rlfleet.config.models import RLConfig
from rlfleet.config.placement import model_shape, shares
from rlfleet.config.sizing import GIB, most_tokens
from rlfleet.config.weights import placed

# A GPU trainer's packed row when orchestrator.seq_len is unset (at least inference.max_model_len).
PACKED_ROW_TOKENS = 8192


def gpu_defaults(
    cfg: RLConfig, inference_gpus: list[str], trainer_gpus: list[str], gpu_bytes: int | None = None
) -> RLConfig:
    """Fill what depends on placement: vLLM's dtype (bfloat16 on a GPU), which the trainer's
    weight transport must match, the transport itself (`auto` placed), vLLM's share of a GPU it shares with the trainer (0.45), a CPU
    replica's batch of sequences (max_num_seqs), and the trainer's batch shape. A GPU trainer (a
    multi-node job's on GPU nodes included) gets packed rows of max(max_model_len, 8192) tokens and
    micro-batches by tokens (`micro_batch_tokens`); a CPU trainer gets 32 right-padded sequences.
    gpu_bytes: the trainer GPU's memory (unset: nvidia-smi's), for the check that a micro-batch can fit."""
    i, o = cfg.inference, cfg.orchestrator
    update = {"dtype": i.vllm_dtype(cfg.model.dtype, bool(inference_gpus))}
    shared = shares(inference_gpus, trainer_gpus)
    if shared and i.gpu_memory_utilization is None:
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
    trainer = cfg.trainer
    if packed and shape["seq_len"]:
        # vLLM asleep (inference.sleep) leaves the trainer the whole GPU while it steps
        vllm = update.get("gpu_memory_utilization", i.gpu_memory_utilization or 0.0)
        share = 1.0 - vllm if shared and not i.sleep else 1.0
        tokens = micro_batch_tokens(cfg, shape["seq_len"], trainer_gpus, share, gpu_bytes)
        trainer = trainer.model_copy(update={"micro_batch_tokens": tokens})
    return cfg.model_copy(
        update={
            "inference": i.model_copy(update=update),
            "orchestrator": o.model_copy(update=shape),
            "trainer": trainer,
            "weights": placed(cfg.weights, inference_gpus, trainer_gpus),
        }
    )


def micro_batch_tokens(
    cfg: RLConfig, seq_len: int, trainer_gpus: list[str], share: float, gpu_bytes: int | None = None
) -> int | None:
    """A GPU trainer's micro-batch cap in tokens: trainer.micro_batch_tokens as set, else the user's
    sequence count orchestrator.micro_batch_size x inference.max_model_len (its longest sequence),
    else None (the trainer sizes itself at its first batch, trainer/budget.py). A cap is never
    refused: the trainer takes as many tokens under it as fit.

    Refused here, before anything starts, is a job whose smallest micro-batch (one packed row of
    seq_len) exceeds the trainer's `share` of its GPU even by `least_step_bytes` (weights,
    gradients, AdamW and full activation checkpointing); the message names the fields. A model or
    GPU this cannot read (a multi-node controller has neither GPU) is left to the trainer's own probe."""
    t, o, mml = cfg.trainer, cfg.orchestrator, cfg.inference.max_model_len
    if t.micro_batch_tokens is not None:
        tokens = t.micro_batch_tokens
    else:
        tokens = None if o.micro_batch_size is None else o.micro_batch_size * mml
    shape = model_shape(cfg.model.path)
    total = gpu_bytes if gpu_bytes is not None else gpu_memory(trainer_gpus[0]) if trainer_gpus else None
    if shape is None or total is None:
        return tokens
    compute = DTYPE_BYTES.get(t.param_dtype, DTYPE_BYTES[cfg.model.dtype])
    ranks, stored = max(1, len(trainer_gpus)), DTYPE_BYTES[cfg.model.dtype]

    def most(
        share: float = share,
        trains_all: bool = t.lora is None,
        offload: bool = t.optimizer_offload,
        more: int = 1,
    ) -> int:
        return most_tokens(int(total * share), shape, ranks * more, stored, compute, trains_all, offload)

    if seq_len > (fits := most()):
        levers = [f"orchestrator.seq_len = {fits} with inference.max_model_len at most that"] if fits else []
        if not t.optimizer_offload and seq_len <= most(offload=True):
            levers.append("trainer.optimizer_offload = true (weights, gradients and AdamW on the host)")
        if t.lora is None and seq_len <= most(trains_all=False):
            levers.append("[trainer.lora] (adapters on a frozen base)")
        if share < 1.0 and seq_len <= most(share=1.0):
            levers.append("inference.sleep = true (vLLM sleeps while the trainer steps; k = 0)")
        if seq_len <= most(more=8):
            levers.append("more trainer GPUs (FSDP2 shards the weights and AdamW over them)")
        raise ConfigError(
            f"orchestrator.seq_len: one packed row of {seq_len} tokens (at least inference.max_model_len) "
            f"is the smallest micro-batch of a GPU trainer, and at most {fits} tokens can fit the "
            f"trainer's GPU ({share * total / GIB:.1f} of {total / GIB:.1f} GiB"
            f"{', beside vLLM' if share < 1.0 else ''}) even with activation checkpointing. Each of these "
            f"would make it fit: {'; '.join(levers) or 'none: a GPU with more memory'}"
        )
    return tokens


def gpu_memory(gpu: str) -> int | None:
    """A GPU's memory in bytes (nvidia-smi: no CUDA context in this process), None if unknown."""
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits", "-i", gpu],
            capture_output=True,
            text=True,
            timeout=20,
            check=True,
        ).stdout
        return int(out.split()[0]) << 20
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return None


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
