"""What depends on placement once it is decided: vLLM's dtype and share of a shared GPU, the weight
transport placed, a CPU replica's batch, the trainer's micro-batch shape; and, on a CPU box, the cores.

config/placement.py decides where things run (`place`); this fills the defaults that follow from it.
"""

from __future__ import annotations

import os
import subprocess

from rlfleet.config.dtypes import DTYPE_BYTES
from rlfleet.config.loader import ConfigError
from rlfleet.config.memory import Job, Levers, MemoryPlan, levers_that_fit, plan
from rlfleet.config.models import RLConfig
from rlfleet.config.placement import model_shape, shares
from rlfleet.config.sizing import GIB
from rlfleet.config.weights import placed

# A GPU trainer's packed row when orchestrator.seq_len is unset (at least inference.max_model_len).
PACKED_ROW_TOKENS = 8192


def gpu_defaults(
    cfg: RLConfig, inference_gpus: list[str], trainer_gpus: list[str], gpu_bytes: int | None = None
) -> tuple[RLConfig, MemoryPlan | None]:
    """Fill what depends on placement: vLLM's dtype (bfloat16 on a GPU), which the trainer's
    weight transport must match, the transport itself (`auto` placed), a CPU replica's batch of
    sequences (max_num_seqs), and the trainer's batch shape. A GPU trainer (a multi-node job's on
    GPU nodes included) gets packed rows of max(max_model_len, 8192) tokens and micro-batches by
    tokens (`micro_batch_tokens`); a CPU trainer gets 32 right-padded sequences. Where the trainer's
    GPU and the model can be read, the memory levers the user left unset are the plan's
    (`memory_plan`); else vLLM takes 0.45 of a GPU it shares with the trainer.
    gpu_bytes: the trainer GPU's memory (unset: nvidia-smi's). Returns the config and the plan."""
    i, o, d = cfg.inference, cfg.orchestrator, cfg.deployment
    update: dict[str, object] = {"dtype": i.vllm_dtype(cfg.model.dtype, bool(inference_gpus))}
    loss = cfg.loss
    if i.quantization:
        if not inference_gpus and not i.urls and d.type != "multi_node":
            raise ConfigError(
                f"inference.quantization: {i.quantization} needs vLLM on GPUs; this run's is on the CPU"
            )
        if "is_correction" not in loss.model_fields_set:  # FP8's sampler drifts further from the trainer
            loss = loss.model_copy(update={"is_correction": "token_tis"})
    shared = shares(inference_gpus, trainer_gpus)
    gpu_nodes = d.type == "multi_node" and d.gpus_per_node > 0
    if i.max_num_seqs is None and not inference_gpus and not gpu_nodes:
        # vLLM-CPU's server decodes 128 sequences at a time: the tiny job's 256 samples a step went
        # in two waves, twice the decode steps
        update["max_num_seqs"] = max(128, -(-in_flight(cfg) // i.num_replicas))
    packed = bool(trainer_gpus) or gpu_nodes
    seq_len, micro = (max(i.max_model_len, PACKED_ROW_TOKENS), 1) if packed else (0, 32)
    shape = {
        "seq_len": seq_len if o.seq_len is None else o.seq_len,
        "micro_batch_size": micro if o.micro_batch_size is None else o.micro_batch_size,
    }
    weights = placed(cfg.weights, inference_gpus, trainer_gpus)
    trainer, chosen = cfg.trainer, None
    if packed and shape["seq_len"]:
        cap = trainer.micro_batch_tokens
        if cap is None and o.micro_batch_size is not None:
            cap = o.micro_batch_size * i.max_model_len  # a sequence count: at most this many of the longest
        trainer = trainer.model_copy(update={"micro_batch_tokens": cap})
        total = gpu_bytes if gpu_bytes is not None else gpu_memory(trainer_gpus[0]) if trainer_gpus else None
        job = plan_job(cfg, shape["seq_len"], len(trainer_gpus), weights.trainer_copies)
        if job is not None and total is not None and (inference_gpus or not shared):
            chosen = memory_plan(cfg, job, total, shared)
            # a lever the user set is the plan's too (`memory_plan` keeps it as set)
            update |= {"gpu_memory_utilization": chosen.vllm_share} if shared else {}
            update["sleep"] = chosen.sleep
            trainer = trainer.model_copy(
                update={"activation_checkpointing": chosen.checkpointing, "optimizer_offload": chosen.offload}
            )
    if shared and i.gpu_memory_utilization is None and "gpu_memory_utilization" not in update:
        update["gpu_memory_utilization"] = 0.45
    resolved = cfg.model_copy(
        update={
            "inference": i.model_copy(update=update),
            "orchestrator": o.model_copy(update=shape),
            "trainer": trainer,
            "weights": weights,
            "loss": loss,
        }
    )
    return resolved, chosen


def in_flight(cfg: RLConfig) -> int:
    """Samples the rollout stream keeps in flight: a step's, once for each step it runs ahead."""
    o = cfg.orchestrator
    return o.batch_size * o.group_size * (1 + o.max_async_level)


def plan_job(cfg: RLConfig, seq_len: int, trainer_ranks: int, copies: int) -> Job | None:
    """What the memory plan reads of a run; None where the model's config cannot be read."""
    shape = model_shape(cfg.model.path)
    if shape is None:
        return None
    t, i = cfg.trainer, cfg.inference
    return Job(
        shape=shape,
        row_tokens=seq_len,
        max_model_len=i.max_model_len,
        in_flight=-(-in_flight(cfg) // i.num_replicas),
        stored_bytes=DTYPE_BYTES[cfg.model.dtype],
        compute_bytes=DTYPE_BYTES.get(t.param_dtype, DTYPE_BYTES[cfg.model.dtype]),
        vllm_bytes=DTYPE_BYTES[i.vllm_dtype(cfg.model.dtype, True)],
        vllm_weight_bytes=1 if i.quantization == "fp8" else 0,
        trains_all=t.lora is None,
        ranks=max(1, trainer_ranks),
        tp=i.tensor_parallel_size,
        transport_copies=copies,
        lm_head_chunk=t.lm_head_chunk,
        on_policy=cfg.orchestrator.max_async_level == 0,
    )


def memory_plan(cfg: RLConfig, job: Job, total: int, shared: bool) -> MemoryPlan:
    """The plan (config/memory.py) with the levers the user set kept as set; a job that fits no
    choice is refused, before anything starts, naming each lever that would make it fit."""
    t, i = cfg.trainer, cfg.inference
    fixed = Levers(
        checkpointing=t.activation_checkpointing
        if "activation_checkpointing" in t.model_fields_set
        else None,
        offload=t.optimizer_offload if "optimizer_offload" in t.model_fields_set else None,
        # a fleet's replica is the fleet's to rest and wake (fleet/rest.py): never put to sleep by a run
        sleep=i.sleep if "sleep" in i.model_fields_set or cfg.fleet else None,
        vllm_share=i.gpu_memory_utilization,
    )
    chosen = plan(job, total, shared, fixed)
    if chosen is not None:
        return chosen
    levers = levers_that_fit(job, total, shared, fixed)
    where = "beside vLLM on one GPU" if shared else "on its own GPU, with vLLM on another"
    raise ConfigError(
        f"orchestrator.seq_len: a trainer step of one packed row of {job.row_tokens} tokens does not fit "
        f"{job.shape.params / 1e9:.2f}B parameters {where} ({total / GIB:.1f} GiB) with any activation "
        f"checkpointing, optimizer offload or vLLM share rlfleet may choose (config/memory.py). Each of "
        f"these would make it fit: {'; '.join(levers) or 'none: a GPU with more memory'}"
    )


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
