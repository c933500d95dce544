"""TRL's side of vs_trl.py: the GRPOConfig (AsyncGRPOConfig) arguments that mirror a resolved rlfleet
RL config (one place for what vs_trl.py, long_tail.py and learning_vs_trl.py hold TRL to), the
GRPOTrainer worker (`vs_trl.py --_trl-worker SPEC`), how it is launched (one process, or one per GPU
under torchrun as a user launches TRL data parallel) and how its ranks' clocks become one.

Each rank writes its own clock (`rank_result`); `read_clock` merges them: rank 0's step begins, end
and logs (TRL gathers the metrics it logs over ranks), per generation the ranks' tokens summed and
lengths joined, and the slowest rank's seconds (the step's collectives wait for it). AsyncGRPO
(`--trl-async`, `async_worker`) writes one clock, rank 0's, without generation timers.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SECONDS = ("generate_s", "sync_s", "total_s")


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


def processes_argument(ap: argparse.ArgumentParser) -> None:
    """`--trl-processes N`, for every script that runs TRL through vs_trl.run_trl."""

    def count(text: str) -> int:
        if (n := int(text)) < 1:
            raise argparse.ArgumentTypeError(f"{n}: at least 1")
        return n

    ap.add_argument(
        "--trl-processes",
        type=count,
        default=1,
        help="TRL data parallel: N processes under torchrun, one per GPU (each with its own colocated "
        "vLLM with --trl-vllm), sharing each step's batch x group sequences",
    )


def launcher(processes: int) -> list[str]:
    """The interpreter (the same one: torchrun's module, not a `torchrun` on PATH) that starts the
    worker script `processes` times on this host; transformers' Trainer reads the torch.distributed
    env torchrun sets (nccl on GPUs, gloo on a CPU)."""
    if processes == 1:
        return [sys.executable]
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(processes)]


def rank_result(result: str, rank: int, processes: int) -> Path:
    """Where rank `rank` writes its clock: the spec's `result` itself when it runs alone."""
    path = Path(result)
    return path if processes == 1 else path.with_name(f"{path.stem}.rank{rank}{path.suffix}")


def combine(clocks: list[dict[str, Any]]) -> dict[str, Any]:
    """One clock from every rank's (rank 0's first; every rank generates once a step, so their
    generations pair up); a single clock comes back as it was."""
    gens = [
        {"tokens": sum(g["tokens"] for g in per_rank), "lengths": [n for g in per_rank for n in g["lengths"]]}
        | {k: max(g[k] for g in per_rank) for k in SECONDS}
        for per_rank in zip(*(c["gens"] for c in clocks), strict=True)
    ]
    return clocks[0] | {"gens": gens}


def read_clock(result: str, processes: int) -> dict[str, Any]:
    """Every rank's clock, combined."""
    paths = [rank_result(result, r, processes) for r in range(processes)]
    if missing := [str(p) for p in paths if not p.exists()]:
        raise RuntimeError(f"TRL's worker exited 0 without writing {missing}")
    return combine([json.loads(p.read_text()) for p in paths])


@functools.cache
def _tokenizer(model: str) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model)


def repeat_reward(
    completion_ids: list[list[int]], letter: list[str], *, model: str, max_tokens: int, per: str, **_: Any
) -> list[float]:
    """rlfleet's repeat reward as TRL's reward function, over the completion's tokens decoded as
    GRPOTrainer decodes its `completions` (special tokens skipped): AsyncGRPO passes parsed chat
    messages there instead, so both trainers score the same text this way."""
    from rlfleet.orchestrator.envs.repeat import reward

    texts = _tokenizer(model).batch_decode(completion_ids, skip_special_tokens=True)
    return [reward(a, c, max_tokens, per=per) for a, c in zip(letter, texts, strict=True)]


def reward_for(spec: dict[str, Any]) -> functools.partial:
    """The spec's reward function: module-level and picklable, as AsyncGRPO's spawned rollout
    process needs (its name, `repeat_reward`, is what TRL logs it under)."""
    per = spec.get("per", "max_tokens")
    return functools.partial(repeat_reward, model=spec["model"], max_tokens=spec["max_tokens"], per=per)


def clock_callback(clock: dict[str, Any]) -> Any:
    """A TrainerCallback writing into `clock` each step's begin (before its generation), TRL's logs
    and the end of training: the clock both TRL trainers keep."""
    from transformers import TrainerCallback

    class Clock(TrainerCallback):
        def on_step_begin(self, *args: Any, **kw: Any) -> None:
            clock["begins"].append(time.time())

        def on_log(self, *args: Any, logs: Any = None, **kw: Any) -> None:
            clock["logs"].append(dict(logs or {}))

        def on_train_end(self, *args: Any, **kw: Any) -> None:
            clock["end"] = time.time()

    return Clock()


def trl_worker(spec_path: str) -> None:
    """One TRL GRPO run (this rank's share of it) as the spec says; writes step-begin times, TRL's
    logs and generation timers."""
    spec = json.loads(Path(spec_path).read_text())
    sys.path.insert(0, str(ROOT))  # rlfleet from this checkout when it is not installed
    if spec["sampler"] == "async":
        return async_worker(spec)
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    clock: dict[str, Any] = {"begins": [], "logs": [], "gens": []}

    class Timed(GRPOTrainer):
        def _generate(self, prompts: list) -> Any:
            t = time.perf_counter()
            out = super()._generate(prompts)
            clock["gens"][-1]["generate_s"] = time.perf_counter() - t  # a vLLM weight sync included
            return out

        def _generate_and_score_completions(self, inputs: Any) -> Any:
            clock["gens"].append(g := {"sync_s": 0.0})
            t = time.perf_counter()
            out = super()._generate_and_score_completions(inputs)
            # this rank's completions (TRL slices the gathered batch back to each process)
            g["total_s"], g["tokens"] = time.perf_counter() - t, int(out["completion_mask"].sum().item())
            g["lengths"] = out["completion_mask"].sum(1).tolist()
            return out

    rows, args = spec["rows"], GRPOConfig(**spec["grpo"])
    peft = None
    if spec.get("peft"):  # rlfleet's [trainer.lora] as its trainer builds it (trainer/lora.py peft_kwargs)
        from peft import LoraConfig

        peft = LoraConfig(**spec["peft"])
    trainer = Timed(
        model=spec["model"],
        reward_funcs=reward_for(spec),
        args=args,
        train_dataset=Dataset.from_list(rows),
        peft_config=peft,
    )
    processes, rank = trainer.accelerator.num_processes, trainer.accelerator.process_index
    if processes != spec["processes"]:
        raise SystemExit(f"the spec is for {spec['processes']} TRL processes, this one is 1 of {processes}")
    trainer.add_callback(clock_callback(clock))
    if [list(x) for x in trainer._tokenize_prompts([r["prompt"] for r in rows])[0]] != spec["prompt_ids"]:
        raise SystemExit("TRL tokenizes the prompts differently from rlfleet")
    if trainer.use_vllm:
        sync = trainer.vllm_generation.sync_weights

        def timed_sync() -> None:
            t = time.perf_counter()
            sync()
            clock["gens"][-1]["sync_s"] += time.perf_counter() - t

        trainer.vllm_generation.sync_weights = timed_sync
    trainer.train()
    rank_result(spec["result"], rank, processes).write_text(json.dumps(clock))


# AsyncGRPO renders every prompt through the chat template: this one leaves rlfleet's prompt text (BOS +
# characters) as it is. Its rollout worker parses each completion with the tokenizer's response template
# (only for the chat messages it logs: repeat_reward decodes the ids): the content, up to EOS.
PLAIN_CHAT = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
PLAIN_RESPONSE = {
    "defaults": {"role": "assistant"},
    "fields": {"content": {"close_pattern": r"</s>\s*", "content": "text"}},
}


def plain_tokenizer(model: str) -> Any:
    """The model's tokenizer for AsyncGRPO: PLAIN_CHAT and PLAIN_RESPONSE."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model)
    tok.chat_template, tok.response_template = PLAIN_CHAT, PLAIN_RESPONSE
    return tok


def async_worker(spec: dict[str, Any]) -> None:
    """One AsyncGRPO run. Its generation runs in a spawned process against the vLLM server, so no
    timer sees a step's generation: rank 0 (which pulls every rollout and hands each rank its rows)
    writes the one clock, with step begins and end, TRL's logs, and per step the completion lengths
    it trained (in the order its collator took them, batch x group a step), the seconds it waited on
    the rollout queue and its weight sync to the server (its perf/ logs)."""
    import trl.experimental.async_grpo.async_grpo_trainer as agt
    from datasets import Dataset

    clock: dict[str, Any] = {"begins": [], "logs": [], "gens": []}
    lengths: list[int] = []

    log_metrics = agt.DataCollatorForRollout._log_metrics

    def counted(self: Any, rows: Any, all_examples: list[dict[str, Any]], padded: Any) -> None:
        lengths.extend(int(e["completion_mask"].sum()) for e in all_examples)
        log_metrics(self, rows, all_examples, padded)

    agt.DataCollatorForRollout._log_metrics = counted  # runs on rank 0 only (dispatch_batches)
    tok = plain_tokenizer(spec["model"])
    rows = [
        {"prompt": [{"role": "user", "content": r["prompt"]}], "letter": r["letter"]} for r in spec["rows"]
    ]
    ids = [tok.apply_chat_template(r["prompt"], add_generation_prompt=True, return_dict=False) for r in rows]
    if [list(x) for x in ids] != spec["prompt_ids"]:
        raise SystemExit("AsyncGRPO renders the prompts differently from rlfleet's token ids")
    trainer = agt.AsyncGRPOTrainer(
        model=spec["model"],
        reward_funcs=reward_for(spec),
        args=agt.AsyncGRPOConfig(**spec["grpo"]),
        train_dataset=Dataset.from_list(rows),
        processing_class=tok,
    )
    if (processes := trainer.accelerator.num_processes) != spec["processes"]:
        raise SystemExit(f"the spec is for {spec['processes']} TRL processes, this one is 1 of {processes}")
    trainer.add_callback(clock_callback(clock))
    trainer.train()
    if not trainer.accelerator.is_main_process:
        return
    seqs = trainer.args.per_device_train_batch_size * trainer.args.gradient_accumulation_steps * processes
    step_logs = [x for x in clock["logs"] if "reward" in x]
    chunks = [lengths[i * seqs : (i + 1) * seqs] for i in range(len(step_logs))]
    clock["gens"] = [
        {"tokens": sum(n), "lengths": n}
        | {"sync_s": x.get("perf/weight_sync_s") or 0.0, "wait_s": x.get("perf/rollout_wait_s") or 0.0}
        for n, x in zip(chunks, step_logs, strict=True)
    ]
    Path(spec["result"]).write_text(json.dumps(clock))
