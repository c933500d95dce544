"""rlfleet's `rl` flow vs TRL's GRPOTrainer: the same job, one after the other, on one machine.

Both get the embedded job (examples/tiny/rl.toml; any `--section.key value` left over overrides it
for both): the same random-init model, the same `repeat` prompts (rlfleet's own examples, as the
same token ids: BOS + characters), the same reward function (imported from rlfleet), group size,
completion length, batch and micro-batch size, learning rate, AdamW and clipping, step count.
Each runs as its own command (`rlfleet rl`; this file with `--_trl-worker` for TRL), so imports,
model load and engine start count for both. Per framework: wall time of the command, start-up
(command start -> first step begins), median step seconds, steps/s and generated tokens/s over the
step loop, the median time split (rlfleet: the flow's `steps/step_N.json`; TRL: timers around its
generate / weight sync / scoring methods, the rest of its step is training), the mean reward of
the first and last 3 steps; then rlfleet/TRL ratios of wall time and steps/s. TRL settings that
cannot match rlfleet's are listed in the JSON's config.differs.

    python benchmarks/vs_trl.py --out benchmarks/results/vs_trl_cpu_2core.json
    python benchmarks/vs_trl.py --device cuda --shape 05b --trl-vllm --out benchmarks/results/vs_trl_h100_05b.json
    python benchmarks/vs_trl.py --device cuda --shape 05b --only trl --trl-vllm --trl-processes 4 --out ...
    python benchmarks/vs_trl.py --device cuda --shape 05b --only trl --trl-vllm --trl-vllm-mode server \
        --trl-processes 2 --out ...   # TRL's vLLM server on the last visible GPU, trainers on the others
    python benchmarks/vs_trl.py --device cuda --shape 05b --only trl --trl-async --trl-processes 2 --out ...

`--dry-run` builds the configs only (model config + tokenizer, rlfleet's config, TRL's GRPOConfig).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from common import (
    ROOT,
    command,
    exit_on_sigterm,
    free_port,
    keep_logs,
    loop_summary,
    median,
    run_rlfleet,
    table_of,
    versions,
    write,
)
from trl_servers import HOST, placement, sampler, sampler_arguments, serving, visible_gpus
from trl_worker import async_grpo_kwargs, grpo_kwargs, launcher, processes_argument, read_clock, trl_worker

from rlfleet.trainer.shapes import BODIES, REAL

JOB = ROOT / "examples" / "tiny" / "rl.toml"
# Qwen2-0.5B's / -1.5B's bodies as Llamas (no qkv bias, untied LM head); the char tokenizer padded to 32768 ids.
SHAPES: dict[str, dict[str, Any]] = {"tiny": {}, "05b": BODIES["05b"], "15b": BODIES["15b"]}
DIFFERS = [
    "advantages: rlfleet divides by the population std + 1e-6, TRL (scale_rewards='group') by the "
    "Bessel-corrected std + 1e-4: x sqrt(7/8) for groups of 8, which AdamW all but cancels",
    "PPO ratio: rlfleet's is against the sampler's (vLLM's) logprobs, tokens outside [mask_ratio_low, "
    "mask_ratio_high] masked; TRL's (num_iterations=1) against its own detached logprobs, exactly 1 with HF "
    "generate; with --trl-vllm its vLLM IS correction (token_mask, the same bounds) takes that role",
    "sampling: rlfleet = a vLLM server (the CPU build on a CPU) in its own process, over HTTP; TRL = HF generate "
    "in process (colocated vLLM with --trl-vllm); the random samples differ",
    "micro-batches: rlfleet sorts a step's sequences by length, TRL shuffles them",
    "checkpoints: both save model + optimizer every trainer.checkpoint_interval steps and at the end (rlfleet: "
    "HF safetensors + DCP, checked by the flow's checkpoint task; TRL: save_steps, save_only_model=False)",
    "processes: rlfleet = controller (Prefect flow) + vLLM server + trainer; TRL = one process, or with "
    "--trl-processes N one per GPU under torchrun (DDP; with --trl-vllm a colocated vLLM each), sharing the batch; "
    "with --trl-vllm-mode server or --trl-async, plus a vLLM server on a GPU of its own",
    "--trl-async: TRL's experimental AsyncGRPOTrainer has its own loss and advantages (no loss_type, beta or "
    "scale_rewards to set), drops rollouts more than rlfleet's max_off_policy_steps versions old, and packs a "
    "step's rows into prefix trees (flash-attn 3 from the `kernels` package)",
    "GPU: rlfleet trains through FSDP2 on one GPU (param_dtype bf16), TRL a plain module with bf16=True; both "
    "hold bf16 weights and step AdamW on them",
]
COLS = {"wall_s": "wall s", "startup_s": "start-up s", "median_step_s": "step s", "steps_per_s": "steps/s"}
COLS |= {"gen_tokens_per_s": "tokens/s", "reward_first3": "reward first 3", "reward_last3": "last 3"}


def run_trl(spec: dict[str, Any], tmp: Path, log: Path) -> dict[str, Any]:
    """TRL's worker on the spec's number of processes (trl_worker.py), after its vLLM server where it
    has one (trl_servers.py: wall and start-up then count the server's start), its ranks' clocks read
    back as one. The time split: generate (weight sync excluded), weight_sync, score_and_prep, train;
    AsyncGRPO's generation runs beside training, unseen by a timer, so its split is rollout_wait
    (the trainer blocked on its rollout queue), weight_sync and train (the rest of the step), and its
    per_step has rollout_wait in place of generate."""
    (tmp / "trl_spec.json").write_text(json.dumps(spec))
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_HUB_DISABLE_TELEMETRY="1", TRANSFORMERS_OFFLINE="1")
    worker = [str(Path(__file__).resolve()), "--_trl-worker", str(tmp / "trl_spec.json")]
    t0 = time.time()
    with serving(spec, env, log.with_name(f"{log.stem}_server.log")) as worker_env:
        command([*launcher(spec["processes"]), *worker], log, worker_env)
        wall = time.time() - t0
    is_async = spec["sampler"] == "async"
    return trl_result(read_clock(spec["result"], 1 if is_async else spec["processes"]), t0, wall, is_async)


def trl_result(clock: dict[str, Any], t0: float, wall: float, is_async: bool) -> dict[str, Any]:
    """run_trl's summary of a TRL clock (trl_worker.py) of a command that started at `t0`."""
    begins, gens = clock["begins"], clock["gens"]
    steps = [b - a for a, b in zip(begins, [*begins[1:], clock["end"]], strict=True)]
    tokens, rewards = [g["tokens"] for g in gens], [x["reward"] for x in clock["logs"] if "reward" in x]
    if is_async:
        split = {
            "rollout_wait": median([g["wait_s"] for g in gens]),
            "weight_sync": median([g["sync_s"] for g in gens]),
            "train": median([s - g["wait_s"] - g["sync_s"] for s, g in zip(steps, gens, strict=True)]),
        }
        per_step: dict[str, Any] = {"step": steps, "rollout_wait": [g["wait_s"] for g in gens]}
    else:
        split = {
            "generate": median([g["generate_s"] - g["sync_s"] for g in gens]),
            "weight_sync": median([g["sync_s"] for g in gens]),
            "score_and_prep": median([g["total_s"] - g["generate_s"] for g in gens]),
            "train": median([s - g["total_s"] for s, g in zip(steps, gens, strict=True)]),
        }
        per_step = {"step": steps, "generate": [g["generate_s"] for g in gens]}
    per_step |= {
        "reward": rewards,
        "tokens": tokens,
        "lengths": [g["lengths"] for g in gens],  # completion tokens of each sample
    }
    res = loop_summary(wall, begins[0] - t0, clock["end"] - begins[0], steps, tokens, rewards)
    return res | {"split_median_s": split, "per_step": per_step}


def positions_for(model: Path, max_model_len: int) -> None:
    """RoPE positions for max_model_len in the model's config: vLLM refuses a longer max_model_len
    than max_position_embeddings (the tiny config's 1024), and past it its rotary cache is indexed
    out of bounds (a device-side assert)."""
    path = model / "config.json"
    cfg = json.loads(path.read_text())
    cfg["max_position_embeddings"] = max(cfg["max_position_embeddings"], max_model_len)
    path.write_text(json.dumps(cfg, indent=2))


def trl_spec(
    cfg: Any, model: Path, tmp: Path, device: str, sampler: str, processes: int = 1
) -> dict[str, Any]:
    """rlfleet's prompts (text and token ids) and the GRPOConfig (AsyncGRPOConfig) kwargs that mirror
    its config, for TRL data parallel on `processes` ranks (one per GPU) that share each step's batch;
    `sampler` is trl_servers.SAMPLERS': "server" and "async" add their vLLM server's settings (its
    own GPU: vLLM's default share unless inference.gpu_memory_utilization says)."""
    from transformers import AutoTokenizer

    from rlfleet.chat import prompt_ids
    from rlfleet.orchestrator.envs import load_envs

    o, cuda = cfg.orchestrator, device == "cuda"
    envs = load_envs(o.env)
    if [e.name for e in envs] != ["repeat"]:
        raise SystemExit("vs_trl compares on the `repeat` env only (its reward is TRL's reward function)")
    tok = AutoTokenizer.from_pretrained(model)
    examples = [ex for s in range(cfg.max_steps) for ex in envs[0].examples(s, o.batch_size, cfg.seed)]
    # BOS as text: TRL tokenizes `prompt` with add_special_tokens=True, and this tokenizer adds none
    rows = [{"prompt": tok.bos_token + ex.prompt, "letter": ex.answer} for ex in examples]
    ids = [prompt_ids(tok, ex.prompt, [], False) for ex in examples]
    if [tok(r["prompt"])["input_ids"] for r in rows] != ids:
        raise SystemExit("prompt token ids differ between rlfleet and TRL's input text")
    seqs = o.batch_size * o.group_size
    mbs = o.micro_batch_size or 32  # TRL's micro-batches count sequences, as rlfleet's unpacked ones
    per_rank = seqs // processes  # trl_batch refuses a batch that does not split
    micro = mbs if per_rank % mbs == 0 else per_rank
    dtype = "bfloat16" if cuda else "float32"
    server = None
    if sampler in ("server", "async"):
        server = {"kind": sampler, "model": str(model), "port": free_port(), "dtype": dtype, "seed": cfg.seed}
        server |= {"gpu_memory_utilization": cfg.inference.gpu_memory_utilization or 0.9}
        server |= {"max_model_len": cfg.inference.max_model_len}
    url = f"http://{HOST}:{server['port']}" if server else None
    if sampler == "async":
        grpo = async_grpo_kwargs(cfg, tmp / "trl", micro, cuda, url, processes)
    else:
        # a share set for the job is both sides'; unset, rlfleet's memory plan chooses its own and TRL's
        # colocated vLLM takes 0.45 (in the JSON's trl_grpo_config)
        share = (cfg.inference.gpu_memory_utilization or 0.45) if sampler == "colocate" else None
        grpo = grpo_kwargs(cfg, tmp / "trl", micro, cuda, share, processes, url)
    grpo["model_init_kwargs"] = {"dtype": dtype}
    out = {
        "model": str(model),
        "rows": rows,
        "prompt_ids": ids,
        "max_tokens": o.max_tokens,
        "per": envs[0].args.per,
        "processes": processes,
        "sampler": sampler,
        "server": server,
    }
    if cfg.trainer.lora is not None:  # the trainer's own adapters, for TRL's PEFT
        from rlfleet.trainer.lora import peft_kwargs

        out["peft"] = peft_kwargs(cfg.trainer.lora)
    return out | {"grpo": grpo, "result": str(tmp / "trl_clock.json")}


def make_model(name: str, out: Path, cuda: bool, weights: bool = True) -> dict[str, Any]:
    """The job's model at shape `name` (SHAPES' tiny Llamas, or a real config of rlfleet/trainer/
    shapes.py, e.g. qwen3-8b) with the character tokenizer padded to its vocabulary; without weights
    the config and tokenizer only (a dry run). Returns its config."""
    from rlfleet.trainer.shapes import make_shape_model, real_config
    from rlfleet.trainer.tiny import build_tokenizer, make_tiny_model, tiny_config

    dtype = "bfloat16" if cuda else "float32"
    if name in SHAPES:
        config = tiny_config(**SHAPES[name] | {"dtype": dtype})
        if weights:
            make_tiny_model(out, seed=0, **SHAPES[name] | {"dtype": dtype})
    else:
        config = real_config(name, dtype)
        if weights:
            make_shape_model(name, out, dtype=dtype, device="cuda" if cuda else "cpu")
    if not weights:
        config.save_pretrained(out)
        build_tokenizer(config.vocab_size).save_pretrained(out)
    return config.to_dict()


def describe(
    a: argparse.Namespace, cfg: Any, model_config: dict[str, Any], argv: list[str], spec: dict[str, Any]
) -> dict[str, Any]:
    o = cfg.orchestrator
    return {
        "device": a.device,
        "shape": a.shape,
        "trl_vllm": a.trl_vllm,
        "trl_sampler": spec["sampler"],
        "trl_processes": a.trl_processes,
        "model": model_config,
        "lora": spec.get("peft"),
        "job": str(JOB.relative_to(ROOT)),
        "rlfleet_args": argv[2:],
        "steps": cfg.max_steps,
        "prompts_per_step": o.batch_size,
        "group_size": o.group_size,
        "max_tokens": o.max_tokens,
        "trl_grpo_config": spec["grpo"],
        "differs": DIFFERS,
        "prefect_api_url": os.environ.get("PREFECT_API_URL"),
    }


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--_trl-worker":
        return trl_worker(sys.argv[2])
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--shape", choices=sorted([*SHAPES, *REAL]), default="tiny")
    ap.add_argument("--lora", type=int, help="LoRA adapters of this rank on both sides (TRL: PEFT)")
    ap.add_argument("--steps", type=int, default=None, help="default: the job's max_steps")
    sampler_arguments(ap)
    processes_argument(ap)
    ap.add_argument("--only", choices=["both", "rlfleet", "trl"], default="both")
    ap.add_argument("--dry-run", action="store_true", help="build the configs (no weights), run nothing")
    ap.add_argument("--logs", help="keep both commands' output in this directory")
    ap.add_argument("--out", required=True)
    a, overrides = ap.parse_known_args()  # the rest overrides the job, for both frameworks
    trl_sampler = sampler(ap, a)

    exit_on_sigterm()  # a cut run unwinds: TRL's vLLM server (trl_servers.serving) is stopped on the way out
    if trl_sampler in ("server", "async") and not a.dry_run and a.only != "rlfleet":
        placement(visible_gpus(), a.trl_processes)  # before rlfleet's run, not after it

    from rlfleet.config.loader import load
    from rlfleet.config.models import RLConfig

    env: dict[str, Any] = {"loadavg_at_start": os.getloadavg()}
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp_s:
        tmp = Path(tmp_s)
        logs = Path(a.logs) if a.logs else tmp
        logs.mkdir(parents=True, exist_ok=True)
        model = tmp / "model"
        model_config = make_model(a.shape, model, a.device == "cuda", weights=not a.dry_run)
        argv = ["@", str(JOB), "--model.path", str(model), "--output-dir", str(tmp / "rlfleet")]
        argv += ["--inference.port", str(free_port()), "--wandb.mode", "disabled"]
        argv += ["--max-steps", str(a.steps)] if a.steps else []
        argv += ["--trainer.lora.rank", str(a.lora)] if a.lora else []
        if a.device == "cuda":
            argv += ["--model.dtype", "bfloat16", "--deployment.num-inference-gpus", "1"]
            argv += ["--deployment.num-train-gpus", "1"]
        argv += overrides
        cfg = load(RLConfig, argv)
        if not a.dry_run:
            positions_for(model, cfg.inference.max_model_len)
        spec = trl_spec(cfg, model, tmp, a.device, trl_sampler, a.trl_processes)
        if a.dry_run:
            from trl import GRPOConfig
            from trl.experimental.async_grpo import AsyncGRPOConfig

            config = AsyncGRPOConfig if trl_sampler == "async" else GRPOConfig
            config(**spec["grpo"] | {"bf16": False, "use_cpu": True})  # bf16 needs a GPU to validate
            print(
                json.dumps(
                    {"model": model_config, "rlfleet": argv, "trl": spec["grpo"], "peft": spec.get("peft")}
                )
            )
            return
        if a.only != "trl":
            results["rlfleet"] = run_rlfleet(argv, tmp / "rlfleet", logs / "rlfleet.log")
            if a.logs:  # the trainer's and vLLM's own logs beside the command's, as rlfleet_<dir>_<file>
                keep_logs(tmp / "rlfleet", logs, "rlfleet")
            print("rlfleet", {k: v for k, v in results["rlfleet"].items() if k != "per_step"}, flush=True)
        env["loadavg_between"] = os.getloadavg()
        if a.only != "rlfleet":
            results["trl"] = run_trl(spec, tmp, logs / "trl.log")
            print("trl", {k: v for k, v in results["trl"].items() if k != "per_step"}, flush=True)
    if len(results) == 2:
        r, t = results["rlfleet"], results["trl"]
        ratio = {"wall": r["wall_s"] / t["wall_s"], "steps_per_s": r["steps_per_s"] / t["steps_per_s"]}
        results["ratio_rlfleet_over_trl"] = ratio
    write(a.out, results, describe(a, cfg, model_config, argv, spec), env | versions())
    runs = {n: results[n] for n in ("rlfleet", "trl") if n in results}
    table_of(f"rlfleet vs TRL GRPOTrainer: {a.shape} on {a.device}, {cfg.max_steps} steps", COLS, runs)
    if "ratio_rlfleet_over_trl" in results:
        print("rlfleet / TRL:", results["ratio_rlfleet_over_trl"])


if __name__ == "__main__":
    main()
