"""`[trainer]`: the long-lived trainer's optimizer, checkpoints and GPU scale, and `[bench]`, its
benchmark on fake batches."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from rlfleet.config.base import Strict
from rlfleet.config.lora import LoraConfig
from rlfleet.config.schedule import LRScheduleConfig


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
    keep_weights: int = Field(
        3,
        ge=1,
        description="Weight snapshots kept for broadcast; the one the replicas serve (or are loading) "
        "stays too, so a relaunched replica starts from its files.",
    )
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
        description="Recompute each decoder layer in backward. Unset on a GPU, the memory plan picks the "
        "least that fits before anything starts (config/memory.py; the run log says why), and the "
        "trainer's first-batch probe goes one step further only where a row still does not fit.",
    )
    micro_batch_tokens: int | None = Field(
        None,
        ge=1,
        description="A GPU trainer's micro-batch cap: its samples repacked into one row of at most this many "
        "tokens (at least one packed row's worth), fewer where fewer fit without activation checkpointing; "
        "unset = orchestrator.micro_batch_size x inference.max_model_len when that is set, else sized at "
        "the first batch from the memory the trainer finds free beside vLLM. Unpacked (seq_len 0) and CPU "
        "trainers ignore it.",
    )
    optimizer_offload: bool = Field(
        False,
        description="FSDP2 CPU offload of params, grads and AdamW's state. Unset on a GPU, the memory plan "
        "turns it on where nothing else fits (config/memory.py).",
    )
    lm_head_chunk: int | None = Field(
        None,
        ge=0,
        description="Tokens per LM-head chunk for logprobs; 0 = full logits; unset = on a GPU 8192 up to a 64k "
        "vocabulary, halved until a chunk's fp32 logits are 2 GiB (2048 at 152k), 0 on a CPU.",
    )
    compile: bool | None = Field(
        None,
        description="torch.compile each decoder layer (dynamic shapes: one graph for every micro-batch) and "
        "the chunked LM head; unset = on a GPU (compiled in the warm-up, while vLLM starts), off on a CPU.",
    )
    profile_step: int | None = Field(
        None,
        ge=0,
        description="torch.profiler over this step's train phase (its micro-batches and optimizer step); "
        "the top ops, device time by kind and how busy the device was go to "
        "logs/trainer/profile_step_<N>.txt. Unset = no profiling.",
    )
    lora: LoraConfig | None = Field(
        None, description="[trainer.lora]: train LoRA adapters on a frozen base; unset = full fine-tuning."
    )

    @field_validator("betas")
    @classmethod
    def _betas(cls, v: tuple[float, float]) -> tuple[float, float]:
        if not all(0.0 <= b < 1.0 for b in v):
            raise ValueError("each beta must be in [0, 1)")
        return v


class BenchConfig(Strict):
    """`rlfleet trainer --bench`: fake batches through the real train step, no store, no vLLM."""

    enabled: bool = Field(False, description="Run the benchmark instead of training (`--bench` sets it).")
    warmup_steps: int = Field(2, ge=0, description="Steps run first and not measured (compile, allocator).")
    steps: int = Field(5, ge=1, description="Measured steps.")
    seq_len: int = Field(16384, ge=2, description="Tokens per fake packed row (full: no padding).")
    sample_len: int = Field(
        4096, ge=2, description="The longest fake sample; 40% are this long, the rest shorter (a long tail)."
    )
    micro_batch_size: int = Field(1, ge=1, description="Packed rows per micro-batch (per rank).")
    micro_batches: int = Field(4, ge=1, description="Micro-batches per optimizer step (per rank).")
    output_json: str | None = Field(None, description="Also write the results to this JSON file.")
