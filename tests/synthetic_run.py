"""A trainer run on synthetic GRPO rollouts: in this process, as a CLI process or under torchrun,
and the losses it logged. tests/test_fsdp.py checks 2 gloo ranks against one process with it (the
same claims over NCCL: `git show d1694e7:benchmarks/fsdp_gpu_check.py`, docs/benchmarks/trainer.md)."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

from rlfleet.config.loader import to_toml
from rlfleet.config.models import ModelConfig, TrainerConfig, TrainerJobConfig
from rlfleet.orchestrator.rollout import publish_rollout, single_turn
from rlfleet.orchestrator.step_batches import BatchSpec, publish_batches
from rlfleet.store import RunStore
from rlfleet.trainer.launch import torchrun_cmd
from rlfleet.trainer.rl import run_trainer


def publish_steps(store: RunStore, steps: int) -> None:
    """Synthetic GRPO rollouts, 24 sequences a step -> 3 micro-batches of 8 (uneven over 2 ranks)."""
    rng = random.Random(0)
    for step in range(steps):
        records = []
        for g in range(6):
            prompt = [1] + [rng.randrange(4, 100) for _ in range(rng.randint(4, 8))]
            for _ in range(4):
                completion = [rng.randrange(4, 100) for _ in range(rng.randint(4, 10))]
                records.append(
                    {
                        "group": g,
                        "prompt_uid": f"{step}-{g}",
                        **single_turn(prompt, completion, [-4.8] * len(completion)),
                        "reward": rng.random(),
                        "policy_step": step - 1,
                        "completion": "",
                    }
                )
        publish_rollout(store, step, records, {"policy_step": step - 1})
        publish_batches(store, step, records, BatchSpec(micro_batch_size=8))


def run_job(out: Path, model: Path, max_steps: int, nproc: int | None, gpus: str = "") -> None:
    cfg = TrainerJobConfig(
        output_dir=str(out),
        max_steps=max_steps,
        model=ModelConfig(path=str(model)),
        trainer=TrainerConfig(lr=1e-2, checkpoint_interval=1, lm_head_chunk=16, param_dtype="float32"),
    )
    if nproc is None and not gpus:  # one CPU process: in this one (saves an interpreter start)
        run_trainer(cfg)
        return
    path = out / "trainer.toml"
    path.write_text(to_toml(cfg))
    args = ["trainer", "@", str(path)]
    cmd = (
        torchrun_cmd(nproc, [*args, "--trainer.fsdp", "on"])
        if nproc
        else [sys.executable, "-m", "rlfleet.cli", *args]
    )
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": gpus}
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]


def logged_losses(out: Path, steps: range) -> list[float]:
    return [json.loads((out / "metrics" / f"step_{s}.json").read_text())["loss"] for s in steps]
