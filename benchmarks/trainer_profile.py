"""Where a bench step's time goes: torch.profiler over one train step after warm-up.

Prints the top kernels / ops by GPU time and the GPU busy fraction of the step (kernel time /
wall time; well below 1 means the host cannot keep the GPU fed). Same arguments as the bench:

    python benchmarks/trainer_profile.py --model.path DIR --trainer.compile true --bench.seq-len 4096
"""

from __future__ import annotations

import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile

from rlfleet.config.loader import load
from rlfleet.config.models import TrainerJobConfig
from rlfleet.trainer.bench import bench_objective, fake_micro_batches
from rlfleet.trainer.loop import build
from rlfleet.trainer.profile import summary
from rlfleet.trainer.train import train_step


def main() -> None:
    cfg = load(TrainerJobConfig, sys.argv[1:])
    par, policy, opt = build(cfg, cfg.model.path, random_init=True)
    b = cfg.bench
    micro = fake_micro_batches(cfg, policy.lm.config.vocab_size, b.micro_batches)
    objective = bench_objective(cfg, "grpo", micro, par.world, None)
    for _ in range(b.warmup_steps):
        train_step(policy, opt, micro, objective, cfg.trainer.max_grad_norm, par)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        t0 = time.perf_counter()
        train_step(policy, opt, micro, objective, cfg.trainer.max_grad_norm, par)
        torch.cuda.synchronize()
        wall = time.perf_counter() - t0
    print(summary(prof.key_averages(), wall, rows=int(b.steps) * 6))


if __name__ == "__main__":
    main()
