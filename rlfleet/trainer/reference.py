"""The frozen reference model of the KL penalty (`loss.kl_coef` > 0): the run's initial weights.

Kept simple: a second, unsharded instance of `model.path` on the trainer's device, in eval mode
and without gradients, computing logprobs the way the policy does (same LM-head chunking, and
bfloat16 where FSDP computes in bfloat16). Its memory is one more full copy of the weights on every
trainer rank (no gradients, no optimizer state): e.g. 3 GB for a 1.5B model in bfloat16. With
kl_coef = 0 (the default) it is never loaded.
"""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM

from rlfleet.config.models import TrainerJobConfig
from rlfleet.trainer.parallel import Parallel
from rlfleet.trainer.train import DTYPES, Policy


def load_reference(cfg: TrainerJobConfig, par: Parallel, lm_head_chunk: int) -> Policy | None:
    """The reference Policy, or None when the loss has no KL term.

    A `model.path` with only config.json (the bench's random init) gives the same seeded
    random weights the policy started from (rlfleet/trainer/loop.py `build`)."""
    if cfg.loss.kl_coef == 0:
        return None
    path, dtype = cfg.model.path, DTYPES[cfg.model.dtype]
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
    return Policy(lm, lm_head_chunk)
