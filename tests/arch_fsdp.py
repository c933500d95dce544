"""One trainer step per architecture, in one process or under FSDP2, and what the transports would
send after it. tests/test_architectures.py runs `step` here for the reference and this module
under torchrun with 2 gloo ranks (`python -m torch.distributed.run ... -m tests.arch_fsdp OUT DIR...`),
rank 0 saving `OUT/<model dir name>.pt`.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path
from typing import Any

import torch

from rlfleet.config.loss import LossConfig
from rlfleet.config.models import TrainerConfig
from rlfleet.microbatches import micro_batches
from rlfleet.orchestrator.rollout import single_turn
from rlfleet.trainer.hf_export import sent_state
from rlfleet.trainer.losses.objective import PolicyLoss
from rlfleet.trainer.parallel import Parallel, parallelize, setup, teardown
from rlfleet.trainer.train import Policy, load_model, make_optimizer, train_step

TC = TrainerConfig(lr=1e-2, fsdp="on", param_dtype="float32", lm_head_chunk=16)


def batch() -> tuple[list[dict[str, torch.Tensor]], int]:
    """8 sequences in 4 micro-batches (2 per rank), advantages +-1, sampler logprobs -2."""
    rng = random.Random(0)
    recs = []
    for i in range(8):
        prompt = [1] + [rng.randrange(4, 100) for _ in range(rng.randint(3, 6))]
        completion = [rng.randrange(4, 100) for _ in range(rng.randint(4, 10))]
        recs.append({**single_turn(prompt, completion, [-2.0] * len(completion)), "advantage": (-1.0) ** i})
    return micro_batches(recs, 0, 2), sum(sum(r["loss_mask"]) for r in recs)


def step(model_dir: str, par: Parallel | None) -> dict[str, Any]:
    """Load, (shard,) one GRPO step with the chunked LM head, gather what a transport sends."""
    torch.manual_seed(0)
    policy = Policy(load_model(model_dir, "float32", torch.device("cpu")), lm_head_chunk=TC.lm_head_chunk)
    if par is not None:
        parallelize(policy, par, TC)
    opt = make_optimizer(policy, TC)
    micro, n = batch()
    metrics = train_step(policy, opt, micro, PolicyLoss(LossConfig(), n), TC.max_grad_norm, par=par)
    sent = sent_state(policy, par)
    router = {k: v for k, v in metrics.items() if k.startswith("router/")}  # MoE: summed over ranks
    return {
        "loss": metrics["loss"],
        "router": router,
        "sent": {k: v.detach().to("cpu", copy=True) for k, v in sent.items()},
    }


def main(out: str, model_dirs: list[str]) -> None:
    par = setup(TC, torch.device("cpu"))
    try:
        for d in model_dirs:
            got = step(d, par)
            if par.is_main:
                torch.save(got, Path(out) / f"{Path(d).name}.pt")
        par.barrier()  # as the trainer's loop does: neither rank tears gloo down under the other
    finally:
        teardown(par)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
