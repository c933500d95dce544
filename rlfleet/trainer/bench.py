"""`rlfleet trainer --bench` / `rlfleet sft --bench`: the real train step (FSDP2, levers, GRPO or
SFT loss) on fake batches.

No store, no vLLM: what the loop trains, made up: packed rows of `bench.seq_len` random tokens
holding samples of a long-tail job's length mix (up to `bench.sample_len`), warm-up steps (compile,
allocator) and then measured steps. Reports step time, tokens/s, MFU and peak memory as a rich
table and optionally JSON (`--bench.output-json`). A model directory with only `config.json` is
random-init. MFU is the loop's formula (flops.py).
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
from rlfleet.microbatches import PACK_DTYPES, PACK_PAD, pack_rows
from rlfleet.trainer.flops import Work, adapter_params, model_flops, peak_flops
from rlfleet.trainer.losses import PolicyLoss, StepNorm
from rlfleet.trainer.nll import NLL
from rlfleet.trainer.train import Objective, train_step


def sample_lengths(longest: int, total: int, g: torch.Generator) -> list[int]:
    """Sample lengths filling `total` tokens, mixed as a long-tail RL job's: 40% cut at `longest`
    (max_tokens), the rest uniform over [longest / 16, longest); the last one takes what is left."""
    out: list[int] = []
    while (left := total - sum(out)) > 0:
        cut = torch.rand((), generator=g).item() < 0.4
        n = longest if cut else int(torch.randint(max(2, longest // 16), longest, (), generator=g))
        out.append(min(n, left))
    return out


def fake_micro_batches(
    cfg: TrainerJobConfig, vocab: int, n: int, loss: str = "grpo", step: int = 0
) -> list[dict[str, torch.Tensor]]:
    """`n` micro-batches of `micro_batch_size` full packed rows of `seq_len` tokens (the trainer's
    own micro-batches in the loop hold no padding either), samples mixed by `sample_lengths`. The
    token ids are the same every step, the samples' bounds new each `step`, as the loop's are (a
    compiled step that recompiles for new bounds shows it here)."""
    b = cfg.bench
    tokens = torch.Generator().manual_seed(cfg.seed)
    g = torch.Generator().manual_seed(cfg.seed + 1 + step)
    longest = min(b.sample_len, b.seq_len)
    seqs, rows = [], []
    for _ in range(n * b.micro_batch_size):
        ids, at, row = torch.randint(3, vocab, (b.seq_len,), generator=tokens).tolist(), 0, []
        for length in sample_lengths(longest, b.seq_len, g):
            adv = torch.randn((), generator=g).item()
            row.append(len(seqs))
            seqs.append(
                {
                    "input_ids": ids[at : at + length],
                    "loss_mask": [0.0] + [1.0] * (length - 1),  # the first token is a prompt's: no target
                    "old_logprobs": [-math.log(vocab)] * length,
                    "advantages": [adv] * length,
                }
            )
            at += length
        rows.append(row)
    pad = PACK_PAD if loss == "grpo" else {k: PACK_PAD[k] for k in ("input_ids", "loss_mask")}
    per = b.micro_batch_size
    return [pack_rows(seqs, rows[i : i + per], b.seq_len, pad, PACK_DTYPES) for i in range(0, len(rows), per)]


def bench_objective(cfg: TrainerJobConfig, loss: str, micro: list, world: int, ref: Any) -> Objective:
    if loss == "sft":
        return NLL(micro)
    seqs = sum(int((mb["position_ids"] == 0).sum()) for mb in micro)
    tokens = sum(int(mb["loss_mask"].sum()) for mb in micro)
    longest = min(cfg.bench.sample_len, cfg.bench.seq_len)
    return PolicyLoss(cfg.loss, StepNorm(tokens, seqs, cfg.loss.normalizer or longest * seqs), 1.0, ref)


def run_bench(cfg: TrainerJobConfig, loss: str = "grpo") -> dict[str, Any]:
    """Warm-up then measured steps of the GRPO (`rlfleet trainer`) or SFT (`rlfleet sft`) step."""
    from rlfleet.trainer.loop import build
    from rlfleet.trainer.reference import load_reference

    b = cfg.bench
    par, policy, optimizer = build(cfg, cfg.model.path, random_init=True)
    lm_config = policy.lm.config
    ref = load_reference(cfg, par, policy) if loss == "grpo" else None
    cuda = par.device.type == "cuda"
    times, losses, flops = [], [], []
    for i in range(b.warmup_steps + b.steps):
        micro = fake_micro_batches(cfg, lm_config.vocab_size, b.micro_batches * par.world, loss, step=i)
        objective = bench_objective(cfg, loss, micro, par.world, ref)
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        metrics = train_step(policy, optimizer, micro, objective, cfg.trainer.max_grad_norm, par)
        if cuda:
            torch.cuda.synchronize()
        if i >= b.warmup_steps:
            times.append(time.perf_counter() - t0)
            work = Work()  # every rank's micro-batches
            for mb in micro:
                work.add(mb)
            flops.append(model_flops(lm_config, work.tokens, work.square_lengths, adapter_params(policy.lm)))
        losses.append(metrics["loss"])
    step_s = statistics.median(times)
    tokens = work.tokens  # the same every step: full rows
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
        "sample_len": min(b.sample_len, b.seq_len),
        "samples_per_step": sum(int((mb["position_ids"] == 0).sum()) for mb in micro),
        "tokens_per_step": tokens,
        "step_seconds": step_s,
        "step_seconds_all": times,
        "tokens_per_second": tps,
        "tokens_per_second_per_gpu": tps / par.world,
        "mfu": None if peak is None else statistics.mean(flops) / (step_s * peak * par.world),
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
