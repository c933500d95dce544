"""Model, optimizer and one optimizer step over a step's micro-batches."""

from __future__ import annotations

import time
from typing import Any

import torch
from transformers import AutoModelForCausalLM, PreTrainedModel

from rlfleet.config.models import TrainerConfig
from rlfleet.trainer.loss import grpo_loss, token_logprobs

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def pick_device(choice: str) -> torch.device:
    if choice == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("trainer.device = 'cuda' but no CUDA device is visible")
    if choice == "auto":
        choice = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device(choice)


def load_model(path: str, dtype: str, device: torch.device) -> PreTrainedModel:
    model = AutoModelForCausalLM.from_pretrained(path, dtype=DTYPES[dtype])
    return model.to(device).train()


def make_optimizer(model: torch.nn.Module, cfg: TrainerConfig) -> torch.optim.Optimizer:
    return torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay)


def train_step(
    model: PreTrainedModel,
    optimizer: torch.optim.Optimizer,
    micro_batches: list[dict[str, torch.Tensor]],
    num_loss_tokens: int,
    cfg: TrainerConfig,
    temperature: float = 1.0,
) -> dict[str, Any]:
    """Accumulate the token-normalized loss over all micro-batches, clip, one AdamW step."""
    device = next(model.parameters()).device
    start = time.perf_counter()
    optimizer.zero_grad(set_to_none=True)
    totals = {"loss": 0.0, "clipped_tokens": 0.0, "ratio_sum": 0.0, "mismatch_kl_sum": 0.0}
    for mb in micro_batches:
        mb = {k: v.to(device) for k, v in mb.items()}
        input_ids = mb["input_ids"]
        # Padding sits only at the right end, so causal attention never looks at it: no mask needed.
        logits = model(input_ids=input_ids).logits[:, :-1]
        logprobs = token_logprobs(logits, input_ids[:, 1:], temperature)
        loss, stats = grpo_loss(
            logprobs,
            mb["old_logprobs"][:, 1:],
            mb["advantages"],
            mb["loss_mask"][:, 1:],
            num_loss_tokens,
            cfg.clip_low,
            cfg.clip_high,
        )
        loss.backward()
        totals["loss"] += float(loss.detach())
        for k, v in stats.items():
            totals[k] += v
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)
    optimizer.step()
    n = max(num_loss_tokens, 1)
    return {
        "loss": totals["loss"],
        "grad_norm": float(grad_norm),
        "clip_frac": totals["clipped_tokens"] / n,
        "ratio_mean": totals["ratio_sum"] / n,
        "mismatch_kl": totals["mismatch_kl_sum"] / n,
        "num_loss_tokens": num_loss_tokens,
        "train_seconds": time.perf_counter() - start,
    }
