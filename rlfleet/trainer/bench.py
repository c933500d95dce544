"""`rlfleet trainer --bench` / `rlfleet sft --bench`: the real train step (FSDP2, levers, GRPO or
SFT loss) on fake batches.

No store, no vLLM: random token ids of `bench.seq_len`, warm-up steps (compile, allocator) and
then measured steps. Reports step time, tokens/s, MFU and peak memory as a rich table and
optionally JSON (`--bench.output-json`). A model directory with only `config.json` is random-init.

MFU counts the PaLM / torchtitan model FLOPs, 6 x (matmul params, LM head included) + 12 x layers x
attention width x seq per token (attention counted as non-causal), against the GPU's dense bf16 peak.
Recomputation (activation checkpointing, the chunked head's backward) is not counted as useful work.
"""

from __future__ import annotations

import json
import math
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from rlfleet.config.models import TrainerJobConfig
from rlfleet.trainer.losses import PolicyLoss, StepNorm
from rlfleet.trainer.nll import NLL
from rlfleet.trainer.train import Objective, train_step

PEAK_BF16 = {
    "H100 PCIe": 756e12,
    "H100": 989e12,
    "H200": 989e12,
    "H20": 148e12,
    "A100": 312e12,
    "B200": 2250e12,
}


def peak_flops(device: torch.device) -> float | None:
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    for key, value in PEAK_BF16.items():  # "H100 PCIe" before "H100"
        if key in name:
            return value
    return None


def flops_per_token(config: Any, seq_len: int) -> float:
    h, layers, vocab = config.hidden_size, config.num_hidden_layers, config.vocab_size
    heads, kv = config.num_attention_heads, config.num_key_value_heads
    hd = getattr(config, "head_dim", None) or h // heads
    per_layer = 2 * h * heads * hd + 2 * h * kv * hd + 3 * h * config.intermediate_size
    return 6 * (layers * per_layer + vocab * h) + 12 * layers * heads * hd * seq_len


def fake_micro_batches(
    cfg: TrainerJobConfig, vocab: int, n: int, loss: str = "grpo"
) -> list[dict[str, torch.Tensor]]:
    b = cfg.bench
    g = torch.Generator().manual_seed(cfg.seed)
    shape = (b.micro_batch_size, b.seq_len)
    micro = []
    for _ in range(n):
        mb = {
            "input_ids": torch.randint(3, vocab, shape, generator=g),
            "loss_mask": torch.ones(shape, dtype=torch.long),
        }
        if loss == "grpo":
            mb["old_logprobs"] = torch.full(shape, -math.log(vocab))
            mb["advantages"] = torch.randn(b.micro_batch_size, generator=g)
        micro.append(mb)
    return micro


def _objective(cfg: TrainerJobConfig, loss: str, micro: list, world: int, ref: Any) -> Objective:
    if loss == "sft":
        return NLL(micro)
    b = cfg.bench
    seqs = b.micro_batches * b.micro_batch_size * world
    tokens = len(micro) * b.micro_batch_size * (b.seq_len - 1)
    return PolicyLoss(cfg.loss, StepNorm(tokens, seqs, cfg.loss.normalizer or b.seq_len * seqs), 1.0, ref)


def run_bench(cfg: TrainerJobConfig, loss: str = "grpo") -> dict[str, Any]:
    """Warm-up then measured steps of the GRPO (`rlfleet trainer`) or SFT (`rlfleet sft`) step."""
    from rlfleet.trainer.loop import build
    from rlfleet.trainer.reference import load_reference

    b = cfg.bench
    par, policy, optimizer = build(cfg, cfg.model.path, random_init=True)
    lm_config = policy.lm.config
    micro = fake_micro_batches(cfg, lm_config.vocab_size, b.micro_batches * par.world, loss)
    ref = load_reference(cfg, par, policy) if loss == "grpo" else None
    objective = _objective(cfg, loss, micro, par.world, ref)
    cuda = par.device.type == "cuda"
    times, losses = [], []
    for i in range(b.warmup_steps + b.steps):
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        metrics = train_step(policy, optimizer, micro, objective, cfg.trainer.max_grad_norm, par)
        if cuda:
            torch.cuda.synchronize()
        if i >= b.warmup_steps:
            times.append(time.perf_counter() - t0)
        losses.append(metrics["loss"])
    step_s = statistics.median(times)
    tokens = len(micro) * b.micro_batch_size * b.seq_len
    tps = tokens / step_s
    peak = peak_flops(par.device)
    mem = torch.tensor(
        [torch.cuda.max_memory_allocated(par.device), torch.cuda.max_memory_reserved(par.device)]
        if cuda
        else [0, 0],
        dtype=torch.float64,
        device=par.device,
    )
    if par.enabled and par.world > 1:
        torch.distributed.all_reduce(mem, op=torch.distributed.ReduceOp.MAX)
    tc = cfg.trainer
    result = {
        "model": cfg.model.path,
        "loss": loss,
        "device": torch.cuda.get_device_name(par.device) if cuda else "cpu",
        "world": par.world,
        "seq_len": b.seq_len,
        "tokens_per_step": tokens,
        "step_seconds": step_s,
        "step_seconds_all": times,
        "tokens_per_second": tps,
        "tokens_per_second_per_gpu": tps / par.world,
        "mfu": None if peak is None else flops_per_token(lm_config, b.seq_len) * tps / (peak * par.world),
        "peak_memory_gib": mem[0].item() / 2**30,
        "peak_reserved_gib": mem[1].item() / 2**30,
        "losses": losses,
        "levers": {
            k: getattr(tc, k)
            for k in (
                "fsdp",
                "param_dtype",
                "activation_checkpointing",
                "optimizer_offload",
                "lm_head_chunk",
                "compile",
                "reshard_after_forward",
                "dp_replicate",
            )
        },
        "torch": torch.__version__,
    }
    if par.is_main:
        print_table(result)
        if b.output_json:
            Path(b.output_json).parent.mkdir(parents=True, exist_ok=True)
            Path(b.output_json).write_text(json.dumps(result, indent=2))
    from rlfleet.trainer.parallel import teardown

    teardown(par)
    return result


def print_table(r: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"rlfleet {r['loss']} bench: {r['model']} on {r['world']} x {r['device']}")
    for col in ("seq", "tokens/step", "step s", "tokens/s", "MFU", "peak GiB", "levers"):
        t.add_column(col, justify="right" if col != "levers" else "left")
    short = {"activation_checkpointing": "ac", "optimizer_offload": "offload", "lm_head_chunk": "chunk"}
    levers = " ".join(f"{short.get(k, k)}={v}" for k, v in r["levers"].items() if k in short or v is True)
    t.add_row(
        str(r["seq_len"]),
        f"{r['tokens_per_step']:,}",
        f"{r['step_seconds']:.3f}",
        f"{r['tokens_per_second']:,.0f}",
        "-" if r["mfu"] is None else f"{100 * r['mfu']:.1f}%",
        f"{r['peak_memory_gib']:.1f}",
        levers,
    )
    Console().print(t)
