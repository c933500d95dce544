"""TRL GRPOConfig (and AsyncGRPOConfig) arguments that mirror a resolved rlfleet RL config: one place
for what benchmarks/vs_trl.py and benchmarks/learning_vs_trl.py both hold TRL to."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def trl_batch(seqs: int, micro: int, processes: int = 1) -> dict[str, int]:
    """One generation of `seqs` sequences = one optimizer step on `processes` ranks (data parallel):
    each rank trains its share in micro-batches of `micro` sequences (at most the share), accumulated
    over the rest. TRL 1.16 derives generation_batch_size = micro x processes x gradient_accumulation_steps
    (its steps_per_generation default), so that product must be `seqs`, the same batch on any number
    of ranks; it also needs whole groups in it, which batch x group always is."""
    share, rest = divmod(seqs, processes)
    per_device = min(micro, share)
    if rest or per_device < 1 or share % per_device:
        raise SystemExit(
            f"TRL: {seqs} sequences a step (batch x group) do not split into {processes} processes x "
            f"micro-batches of {micro} sequences x gradient accumulation steps ({seqs / processes:g} a process)"
        )
    return {"per_device_train_batch_size": per_device, "gradient_accumulation_steps": share // per_device}


def shared_kwargs(cfg: Any, output_dir: Path, micro: int, cuda: bool, processes: int) -> dict[str, Any]:
    """What GRPOConfig and AsyncGRPOConfig (both TrainingArguments) take alike: one generation of batch x
    group prompts = one optimizer step, in micro-batches of `micro` sequences on each of `processes`
    ranks (`trl_batch`); rlfleet's lr, AdamW, clipping, completion length, temperature, steps, seed.
    Checkpoints: model + optimizer every trainer.checkpoint_interval steps."""
    o, t, loss = cfg.orchestrator, cfg.trainer, cfg.loss
    # fmt: off
    return {
        "output_dir": str(output_dir), "max_steps": cfg.max_steps, "seed": cfg.seed,
        "num_generations": o.group_size, **trl_batch(o.batch_size * o.group_size, micro, processes),
        "max_completion_length": o.max_tokens, "temperature": o.temperature,
        "learning_rate": t.lr, "lr_scheduler_type": "constant", "warmup_steps": 0, "weight_decay": t.weight_decay,
        "adam_beta1": t.betas[0], "adam_beta2": t.betas[1], "adam_epsilon": 1e-8, "max_grad_norm": t.max_grad_norm,
        "optim": "adamw_torch_fused" if cuda else "adamw_torch", "gradient_checkpointing": False,
        "epsilon": loss.clip_low, "epsilon_high": loss.clip_high,
        "bf16": cuda, "use_cpu": not cuda,
        "logging_steps": 1, "report_to": "none", "disable_tqdm": True,
        "save_strategy": "steps", "save_steps": t.checkpoint_interval, "save_only_model": False,
        # DDP (processes > 1): every parameter gets a gradient; else Trainer has DDP walk the graph for unused ones
        **({"ddp_find_unused_parameters": False} if processes > 1 else {}),
    }
    # fmt: on


def grpo_kwargs(
    cfg: Any,
    output_dir: Path,
    micro: int,
    cuda: bool,
    vllm_share: float | None,
    processes: int = 1,
    server_url: str | None = None,
) -> dict[str, Any]:
    """`shared_kwargs` and GRPOTrainer's own: rlfleet's prompt order; no KL and no reference model;
    DAPO's token sum over the step's loss tokens (rlfleet's grpo token_mean). `vllm_share`: the
    colocated vLLM's share of each rank's GPU (one vLLM per rank, no tensor parallelism); None: HF
    generate, unless `server_url` names TRL's vLLM server (vllm_mode="server", on a GPU of its own,
    sized by its command line: trl_servers.py). Either vLLM's importance-sampling correction takes the
    role of rlfleet's ratio mask (the same bounds)."""
    loss = cfg.loss
    vllm = {
        "vllm_importance_sampling_mode": "token_mask",
        "vllm_importance_sampling_clip_min": loss.mask_ratio_low,
        "vllm_importance_sampling_clip_max": loss.mask_ratio_high,
    }
    if server_url is not None:
        vllm |= {"vllm_mode": "server", "vllm_server_base_url": server_url}
    else:
        vllm |= {
            "vllm_mode": "colocate",
            "vllm_tensor_parallel_size": 1,
            "vllm_gpu_memory_utilization": vllm_share,
            "vllm_max_model_length": cfg.inference.max_model_len,
        }
    use_vllm = vllm_share is not None or server_url is not None
    return shared_kwargs(cfg, output_dir, micro, cuda, processes) | {
        "shuffle_dataset": False,
        "mask_truncated_completions": False,
        "beta": 0.0,
        "num_iterations": 1,
        "loss_type": "dapo",
        "scale_rewards": "group",
        "use_vllm": use_vllm,
        **(vllm if use_vllm else {}),
    }


def async_grpo_kwargs(
    cfg: Any, output_dir: Path, micro: int, cuda: bool, server_url: str, processes: int = 1
) -> dict[str, Any]:
    """`shared_kwargs` and AsyncGRPOTrainer's own: its vLLM server at `server_url`; a rollout at most
    orchestrator.max_staleness policy versions old (older ones are dropped, as rlfleet drops them);
    weights to the server after every step; no token budget, so a step trains exactly `trl_batch`'s
    batch x group sequences (a budget makes the micro-batches' sample count vary). Its loss and
    advantages are its own (no loss_type, beta or scale_rewards to set)."""
    return shared_kwargs(cfg, output_dir, micro, cuda, processes) | {
        "vllm_server_base_url": server_url,
        "max_staleness": cfg.orchestrator.max_staleness,
        "weight_sync_steps": 1,
        "token_budget": 0,
        "dtype": "bfloat16" if cuda else "float32",
    }
