"""The frozen reference model of the KL penalty (`loss.kl_coef` > 0): the run's initial weights.

Under LoRA it is free: the policy itself with its adapters switched off is exactly the frozen base
(`AdaptersOff`), so nothing more is loaded and it is sharded as the policy is.

Otherwise, kept simple: a second, unsharded instance of `model.path` on the trainer's device, in
eval mode and without gradients, computing logprobs the way the policy does (same LM-head chunking,
and bfloat16 where FSDP computes in bfloat16). Its memory is one more full copy of the weights on
every trainer rank (no gradients, no optimizer state): e.g. 3 GB for a 1.5B model in bfloat16. With
kl_coef = 0 (the default) it is never loaded.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM

from rlfleet.config.dtypes import torch_dtype
from rlfleet.config.models import TrainerJobConfig
from rlfleet.trainer.lora import adapters_disabled, peft_model
from rlfleet.trainer.parallel import Parallel
from rlfleet.trainer.train import Policy

# (input_ids, temperature, position_ids) -> (logprobs, entropy or None), as a Policy's forward
Reference = Callable[[torch.Tensor, float, torch.Tensor | None], tuple[torch.Tensor, torch.Tensor | None]]


class AdaptersOff:
    """The reference under LoRA: the policy's forward with its adapters skipped, i.e. the frozen
    base. Called under no_grad between the policy's forward and backward; the backward (and an
    activation-checkpointing recompute in it) runs with the adapters on again."""

    def __init__(self, policy: Policy):
        self.policy = policy

    def __call__(
        self, input_ids: torch.Tensor, temperature: float = 1.0, position_ids: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        with adapters_disabled(self.policy.lm):
            return self.policy(input_ids, temperature, position_ids)


def load_reference(cfg: TrainerJobConfig, par: Parallel, policy: Policy) -> Reference | None:
    """The reference, or None when the loss has no KL term.

    A `model.path` with only config.json (the bench's random init) gives the same seeded
    random weights the policy started from (rlfleet/trainer/loop.py `build`)."""
    if cfg.loss.kl_coef == 0:
        return None
    if peft_model(policy.lm) is not None:
        return AdaptersOff(policy)
    path, dtype = cfg.model.path, torch_dtype(cfg.model.dtype)
    if any(Path(path).glob("*.safetensors")):
        lm = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    else:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(cfg.seed)
            lm = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(path), dtype=dtype)
    tc = cfg.trainer
    if par.enabled and tc.param_dtype == "bfloat16":
        lm = lm.to(torch.bfloat16)
    lm = lm.to(par.device).eval().requires_grad_(False)
    return Policy(lm, policy.lm_head_chunk, routing=False)  # the policy's routing is what is logged
