"""Trainer step throughput through the real long-lived trainer (`run_trainer`), CPU or GPU.

Publishes `--steps` synthetic GRPO batches (random prompts and completions, sampler logprobs
taken from the model itself so ratios start at 1) into a fresh run store, runs the trainer over
them exactly as the flow does, and reports per-step time and loss tokens/s from its metrics,
skipping the first (warm-up) step. Writes JSON:

    python benchmarks/trainer_step.py --device cpu --sizes tiny --out benchmarks/results/trainer_cpu.json
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import statistics
import tempfile
import time
from pathlib import Path

import torch
from transformers import LlamaForCausalLM

from rlfleet.config.models import ModelConfig, TrainerConfig, TrainerJobConfig
from rlfleet.orchestrator.rollout import publish_rollout, single_turn
from rlfleet.orchestrator.step_batches import BatchSpec
from rlfleet.orchestrator.step_batches import publish_batches as publish_step_batches
from rlfleet.store import RunStore
from rlfleet.store.records import read_metrics
from rlfleet.trainer.rl import run_trainer
from rlfleet.trainer.tiny import build_tokenizer, tiny_config

SIZES = {  # (hidden, layers, heads)
    "tiny": (128, 2, 2),
    "small": (512, 8, 8),
    "medium": (1024, 16, 16),
}


def make_model(out: Path, size: str, vocab: int) -> Path:
    hidden, layers, heads = SIZES[size]
    torch.manual_seed(0)
    LlamaForCausalLM(
        tiny_config(vocab_size=vocab, hidden=hidden, layers=layers, heads=heads)
    ).save_pretrained(out)
    build_tokenizer(vocab).save_pretrained(out)
    return out


def publish_batches(
    store: RunStore, model_dir: Path, steps: int, prompts: int, group: int, tokens: int
) -> None:
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    model = LlamaForCausalLM.from_pretrained(model_dir).to(dev)
    rng = random.Random(0)
    for step in range(steps):
        records = []
        for g in range(prompts):
            prompt = [1] + [rng.randrange(4, 100) for _ in range(rng.randint(8, 16))]
            for _ in range(group):
                completion = [rng.randrange(4, 100) for _ in range(tokens)]
                ids = torch.tensor([prompt + completion], device=dev)
                with torch.no_grad():
                    lp = model(input_ids=ids).logits[0, :-1].float().log_softmax(-1)
                target = torch.tensor(completion, device=dev)[:, None]
                lps = lp[len(prompt) - 1 :].gather(-1, target)[:, 0].tolist()
                records.append(
                    {
                        "group": g,
                        "prompt_uid": f"{step}-{g}",
                        **single_turn(prompt, completion, lps),
                        "reward": rng.random(),
                        "policy_step": step - 1,
                        "completion": "",
                    }
                )
        publish_rollout(store, step, records, {"policy_step": step - 1})
        publish_step_batches(store, step, records, BatchSpec(micro_batch_size=64))


def bench(size: str, device: str, steps: int, prompts: int, group: int, tokens: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = make_model(Path(tmp) / "model", size, vocab=128)
        store = RunStore(Path(tmp) / "run")
        publish_batches(store, model_dir, steps, prompts, group, tokens)
        cfg = TrainerJobConfig(
            output_dir=str(store.root),
            max_steps=steps,
            model=ModelConfig(path=str(model_dir)),
            trainer=TrainerConfig(device=device, checkpoint_interval=steps, lr=1e-4),
        )
        t0 = time.perf_counter()
        run_trainer(cfg)
        wall = time.perf_counter() - t0
        metrics = [read_metrics(store, s) for s in range(steps)]
    timed = metrics[1:]
    train_s = statistics.median(m["train_seconds"] for m in timed)
    step_s = statistics.median(m["step_seconds"] for m in timed)
    n_tok = timed[0]["num_loss_tokens"]
    hidden, layers, heads = SIZES[size]
    return {
        "size": size,
        "hidden": hidden,
        "layers": layers,
        "device": device,
        "steps": steps,
        "sequences_per_step": prompts * group,
        "loss_tokens_per_step": n_tok,
        "median_train_seconds": train_s,
        "median_step_seconds": step_s,
        "loss_tokens_per_second": n_tok / train_s,
        "wall_seconds": wall,
        "loss_first": metrics[0]["loss"],
        "ratio_mean_first": metrics[0]["ratio_mean"],
    }


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--device", default="cpu")
    p.add_argument("--sizes", default="tiny")
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--prompts", type=int, default=32)
    p.add_argument("--group", type=int, default=8)
    p.add_argument("--tokens", type=int, default=16)
    p.add_argument("--out", required=True)
    a = p.parse_args()
    results = [bench(s, a.device, a.steps, a.prompts, a.group, a.tokens) for s in a.sizes.split(",")]
    env = {
        "torch": torch.__version__,
        "machine": platform.machine(),
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
    }
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps({"env": env, "results": results}, separators=(",", ":")))
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
