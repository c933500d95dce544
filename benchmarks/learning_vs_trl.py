"""Learning against time: eval pass@1 vs wall-clock seconds and vs steps, rlfleet vs TRL GRPOTrainer.

One run = one framework, one variant, one seed, as its own command (imports, model load and engine
start count for both, as in vs_trl.py). Both get the job (`--job`, default examples/smollm2/rl.toml;
reason.toml asks for the working: long, variable samples) resolved by rlfleet's own loader with the
same overrides: the same model, the same reasoning-gym prompts as chat messages (the
system prompt included; TRL's token ids are checked equal to rlfleet's), in rlfleet's stream order
(TRL: shuffle_dataset=False, one generation batch = one optimizer step = batch x group samples, as
rlfleet's k = 0), the same reward (the env's `extract` + the dataset's `score_answer`), group size,
batch, lr, steps, max tokens, temperature, and the same eval: the eval env's 100 examples, greedy,
pass@1 = share of reward >= 1.0, every `--eval-interval` steps. rlfleet evaluates in its flow
(`steps/step_N.json`), TRL in a callback with its colocated vLLM engine after a weight sync (HF
generate with `--trl-no-vllm`, for a CPU smoke test). TRL also evaluates the base model at step 0:
the one shared (0 s, step 0) point of every curve. wall_s = seconds from the command's start to
the step's end; train_wall_s = wall_s minus all eval time up to there (evals are not training time).
The JSON is rewritten after every eval point, so a run cut by a time limit keeps its curve.

    # one GPU per run (4 in parallel on a 4-GPU host: CUDA_VISIBLE_DEVICES=0..3, one command each);
    # --time-limit stops a run (SIGTERM) and keeps the curve it has; unknown --a.b args override rlfleet's config
    python benchmarks/learning_vs_trl.py --framework trl --model M --seed 0 --out r/trl_s0.json
    python benchmarks/learning_vs_trl.py --framework rlfleet --model M --seed 0 --out r/rlfleet_sync_s0.json
    python benchmarks/learning_vs_trl.py --framework rlfleet --model M --seed 0 --variant k1 \\
        --orchestrator.max-async-level 1 --orchestrator.max-off-policy-steps 1 --out r/rlfleet_k1_s0.json
    python benchmarks/learning_vs_trl.py --plot r/*.json --png r/learning.png --summary r/summary.json
    # CPU smoke: --steps 2 --batch-size 4 --group-size 4 --eval-interval 1 --eval-examples 8 (+ --trl-no-vllm)

Overrides apply to both frameworks (TRL reads batch, group, lr, tokens, temperature and the eval from
the same resolved config); async, LoRA and dynamic sampling are rlfleet-only variants. The summary:
per (framework, variant) the final pass@1 (mean over seeds), the time and step at which that mean
curve first reaches TRL's final mean pass@1, and TRL's time / rlfleet's time to get there (goal >= 3).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from statistics import fmean
from typing import Any

from common import ROOT, command, dump, free_port, machine, pyplot, rlfleet_cmd, save_png, steps, versions

JOB = ROOT / "examples" / "smollm2" / "rl.toml"
DIFFERS = [
    "advantages: rlfleet (r - mean) / (population std + 1e-6), TRL (scale_rewards='group') the Bessel-corrected "
    "std + 1e-4: x sqrt(7/8) for groups of 8, which AdamW all but cancels",
    "loss: both token-level PPO-clip (0.2, 0.28), summed over tokens / the step's loss tokens (rlfleet grpo "
    "token_mean, TRL loss_type='dapo'), no KL (beta 0), one update per batch; rlfleet's ratio is against vLLM's "
    "logprobs, tokens outside [mask_ratio_low, mask_ratio_high] masked; TRL's against its own (detached) "
    "logprobs times its vLLM IS correction in token_mask mode with the same bounds",
    "weights: both fp32 master weights, bf16 compute (rlfleet FSDP2 param_dtype bf16, TRL bf16 autocast), "
    "bf16 vLLM (TRL's LLM is given dtype=bfloat16)",
    "sampling: rlfleet = a vLLM server in its own process, TRL = vLLM in the trainer's process (colocate); "
    "the random samples differ",
    "eval: rlfleet's rollout stream may start the next step's groups while an eval runs (the eval's seconds are "
    "subtracted all the same); TRL stops for its eval. TRL's vLLM syncs weights before each eval (counted as eval) "
    "and again before its next step's generation (counted as training)",
    "checkpoints: each saves model + optimizer once, at the last step; rlfleet's save is inside its last step, "
    "TRL's comes after its last point",
    "micro-batches: rlfleet sizes its own (tokens), TRL per_device_train_batch_size = --trl-micro-batch sequences",
]


# ---------------------------------------------------------------- the curves, their summary and picture

POINT = ("step", "wall_s", "train_wall_s", "eval_s", "pass@1", "mean_reward")


def point(*values: float) -> dict[str, Any]:
    """One curve point, as each run's JSON holds it."""
    return dict(zip(POINT, values, strict=True))


def reach(curve: list[dict[str, Any]], target: float, key: str) -> float | None:
    return next((p[key] for p in curve if p["pass@1"] >= target - 1e-9), None)


def mean_curve(ds: list[dict[str, Any]]) -> list[dict[str, float]]:
    """The seeds' mean at each step they all evaluated."""
    steps = sorted(set.intersection(*({p["step"] for p in d["curve"]} for d in ds)))
    at = [[next(p for p in d["curve"] if p["step"] == s) for d in ds] for s in steps]
    return [{k: fmean(p[k] for p in ps) for k in ("step", "wall_s", "train_wall_s", "pass@1")} for ps in at]


def summarize(groups: dict[tuple[str, str], list[dict[str, Any]]], base: float | None) -> dict[str, Any]:
    """Final pass@1 per (framework, variant) and when its mean curve reaches TRL's final (mean) pass@1:
    in training seconds from the command's start (the goal's measure) and after each run's start-up
    (`loop_s`: processes, engine and model load taken out, the loop alone)."""
    trl = next((ds for (fw, _), ds in sorted(groups.items()) if fw == "trl"), None)
    target = mean_curve(trl)[-1]["pass@1"] if trl else None
    summary: dict[str, Any] = {"base_pass@1": base, "trl_final_pass@1": target, "groups": {}}
    for (fw, var), ds in sorted(groups.items()):
        last, mean = [d["curve"][-1] for d in ds], mean_curve(ds)
        row: dict[str, Any] = {"seeds": [d["seed"] for d in ds], "final_step": [p["step"] for p in last]}
        row |= {"final_pass@1": mean[-1]["pass@1"], "final_pass@1_per_seed": [p["pass@1"] for p in last]}
        row["train_wall_s_at_end"] = mean[-1]["train_wall_s"]
        for key in ("train_wall_s", "wall_s", "step") if target is not None else ():
            row[f"to_trl_final_{key}"] = reach(mean, target, key)
            row[f"to_trl_final_{key}_per_seed"] = [reach(d["curve"], target, key) for d in ds]
        if target is not None:  # the loop alone: training seconds after the run's start-up
            row["startup_s_per_seed"] = [d.get("startup_s") for d in ds]
            reached = zip(row["to_trl_final_train_wall_s_per_seed"], row["startup_s_per_seed"], strict=True)
            loop = [at - start for at, start in reached if at is not None]
            row["to_trl_final_loop_s"] = fmean(loop) if len(loop) == len(ds) else None
        summary["groups"][f"{fw}/{var}"] = row
    theirs = next((r for k, r in summary["groups"].items() if k.startswith("trl/")), {})
    for k, row in summary["groups"].items():
        if theirs and not k.startswith("trl/"):  # the goal: TRL's time / rlfleet's >= 3
            for key in ("train_wall_s", "wall_s", "loop_s"):
                mine, ref = row[f"to_trl_final_{key}"], theirs[f"to_trl_final_{key}"]
                row[f"trl_over_rlfleet_{key}"] = ref / mine if mine and ref else None
            row["goal_3x_met"] = (row["trl_over_rlfleet_train_wall_s"] or 0) >= 3.0
    return summary


def job_title(docs: list[dict[str, Any]]) -> str:
    """What the runs trained, from their own config: the model's directory, the job TOML, max_tokens."""
    jobs = {
        f"{Path(c['model']).name}, {c['job']}, max_tokens {c['max_tokens']}"
        for d in docs
        if {"model", "job", "max_tokens"} <= (c := d.get("config") or {}).keys()
    }
    return "; ".join(sorted(jobs)) or "learning_vs_trl.py runs"


def plot(files: list[str], png: str | None, summary_path: str | None) -> None:
    docs = [d for f in files if "framework" in (d := json.loads(Path(f).read_text()))]  # not a summary
    base = [p["pass@1"] for d in docs for p in d.get("curve", []) if p["step"] == 0]
    shared = fmean(base) if base else None  # the base model's pass@1, one number for every curve
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for d in docs:
        curve = [p for p in d.get("curve", []) if p["step"] != 0]
        if curve:  # a run cut before its first eval has nothing to draw
            curve = ([point(0, 0.0, 0.0, 0.0, shared, float("nan"))] if base else []) + curve
            groups.setdefault((d["framework"], d["variant"]), []).append(d | {"curve": curve})
    summary = {"files": files} | summarize(groups, shared)
    if summary_path:
        Path(summary_path).write_text(json.dumps(summary, separators=(",", ":")))
    print(json.dumps(summary, indent=2))
    if not png:
        return
    fig, axes = pyplot().subplots(1, 2, figsize=(13, 5))
    for n, ((fw, var), ds) in enumerate(sorted(groups.items())):
        for d in ds:  # each seed thin, the mean over seeds (at the steps all have) thick
            for ax, key in zip(axes, ("train_wall_s", "step"), strict=True):
                ax.plot(
                    [p[key] for p in d["curve"]],
                    [p["pass@1"] for p in d["curve"]],
                    f"C{n}",
                    lw=0.8,
                    alpha=0.35,
                )
        mean = mean_curve(ds)
        ys = [p["pass@1"] for p in mean]
        kw = {"color": f"C{n}", "lw": 2, "marker": "o", "ms": 3, "label": f"{fw} {var} ({len(ds)} seeds)"}
        axes[0].plot([p["train_wall_s"] for p in mean], ys, **kw)
        axes[1].plot([p["step"] for p in mean], ys, **kw)
    for ax, xl in zip(
        axes, ("training wall-clock s (start-up in, evals out)", "optimizer step"), strict=True
    ):
        ax.set(xlabel=xl, ylabel="eval pass@1 (greedy)", ylim=(-0.02, 1.02))
        ax.grid(alpha=0.3)
        if summary["trl_final_pass@1"] is not None:
            ax.axhline(summary["trl_final_pass@1"], color="gray", ls="--", lw=0.8)
    axes[1].legend(fontsize=8, loc="lower right")
    who = "rlfleet vs TRL GRPOTrainer" if any(fw == "trl" for fw, _ in groups) else "rlfleet's variants"
    fig.suptitle(f"{job_title(docs)}: {who} (thin: seeds, thick: mean)")
    save_png(fig, png, dpi=120)


# ---------------------------------------------------------------- rlfleet


def rlfleet_progress(run: Path, t0: float) -> dict[str, Any]:
    """The curve, training rewards and start-up from the flow's step records so far."""
    try:
        recs, curve, evals = steps(run), [], 0.0
    except (OSError, ValueError):  # a record being replaced: the next tick reads it
        return {}
    for r in recs:
        evals += r["phase_seconds"].get("eval", 0.0)
        if "eval" in r:
            e = next(iter(r["eval"].values()))  # the one eval env
            wall = r["finished_at"] - t0
            at = (wall, wall - evals, r["phase_seconds"]["eval"], e["pass@1"], e["mean_reward"])
            curve.append(point(r["step"] + 1, *at))
    out: dict[str, Any] = {"curve": curve, "train_reward": [r["mean_reward"] for r in recs]}
    out["step_seconds"] = [r["step_seconds"] for r in recs]
    if recs:
        out["startup_s"] = recs[0]["finished_at"] - recs[0]["step_seconds"] - t0
    return out


def run_rlfleet(
    argv: list[str], doc: dict[str, Any], out: Path, work: Path, limit: float | None
) -> int | None:
    # its own Prefect home: parallel runs on one host must not share one SQLite database
    env = dict(os.environ, PREFECT_HOME=str(work / "prefect"))
    doc["t0"] = t0 = time.time()

    def tick() -> None:
        seen = len(doc["train_reward"])
        doc.update(rlfleet_progress(work / "rlfleet", t0))
        if len(doc["train_reward"]) != seen:
            dump(out, doc)

    rc, _, _ = command(
        rlfleet_cmd("rl", *argv), out.with_suffix(".log"), env, limit=limit, tick=tick, check=False
    )
    doc["total_wall_s"] = time.time() - t0
    return rc


# ---------------------------------------------------------------- TRL


def trl_grpo(cfg: Any, a: argparse.Namespace, work: Path, cuda: bool) -> dict[str, Any]:
    """GRPOConfig kwargs mirroring rlfleet's resolved config (its weights: fp32 masters)."""
    from trl_worker import grpo_kwargs

    seqs = cfg.orchestrator.batch_size * cfg.orchestrator.group_size
    micro = a.trl_micro_batch if seqs % a.trl_micro_batch == 0 else seqs
    share = None if a.trl_no_vllm else a.trl_vllm_memory
    return grpo_kwargs(cfg, work / "trl", micro, cuda, share) | {"model_init_kwargs": {"dtype": "float32"}}


def run_trl(
    argv: list[str], doc: dict[str, Any], out: Path, work: Path, model: str, limit: float | None
) -> int | None:
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_HUB_DISABLE_TELEMETRY="1", TRANSFORMERS_OFFLINE="1")
    env.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")
    doc["t0"] = t0 = time.time()
    (work / "trl_spec.json").write_text(
        json.dumps({"argv": argv, "doc": doc, "out": str(out), "model": model})
    )
    cmd = [sys.executable, str(Path(__file__).resolve()), "--_trl-worker", str(work / "trl_spec.json")]
    rc, _, _ = command(cmd, out.with_suffix(".log"), env, limit=limit, check=False)
    doc.update({k: v for k, v in json.loads(out.read_text()).items() if k != "status"})  # the worker's writes
    doc["total_wall_s"] = time.time() - t0
    return rc


def trl_worker(spec_path: str) -> None:
    """One TRL GRPO run; rewrites the run's JSON after every eval point."""
    spec = json.loads(Path(spec_path).read_text())
    import torch
    from datasets import Dataset
    from transformers import AutoTokenizer, TrainerCallback

    from rlfleet.chat import prompt_ids
    from rlfleet.config.loader import load
    from rlfleet.config.models import RLConfig
    from rlfleet.orchestrator.envs import build_env
    from rlfleet.orchestrator.envs.reasoning_gym_env import extract

    doc, out, t0 = spec["doc"], Path(spec["out"]), spec["doc"]["t0"]
    grpo = doc["config"]["trl_grpo_config"]
    if grpo["use_vllm"]:  # bf16 sampling, as rlfleet's vLLM on a GPU (the checkpoint is fp32)
        import functools

        import trl.generation.vllm_generation as vg

        vg.LLM = functools.partial(vg.LLM, dtype="bfloat16")
    from trl import GRPOConfig, GRPOTrainer

    cfg = load(RLConfig, spec["argv"])
    o, interval = cfg.orchestrator, cfg.eval.interval
    env, eval_env = build_env(o.env[0]), build_env(cfg.eval.env[0])
    fmt = env.args.answer_format
    tok = AutoTokenizer.from_pretrained(spec["model"])
    exs = [ex for s in range(cfg.max_steps) for ex in env.examples(s, o.batch_size, cfg.seed)]
    rows = [{"prompt": ex.prompt, "index": ex.info["index"]} for ex in exs]
    evals = eval_env.eval_examples(cfg.eval.env[0].num_examples or cfg.eval.num_examples)
    eval_ids = [prompt_ids(tok, ex.prompt, [], True) for ex in evals]

    def score(data: Any, i: int, text: str) -> float:  # what ReasoningGymEnv.score computes
        return float(data.score_answer(extract(text, fmt), data[i]))

    def answer_reward(completions: list, index: list[int], **_: Any) -> list[float]:
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        return [score(env.train, i, x) for i, x in zip(index, texts, strict=True)]

    data = Dataset.from_list(rows)
    trainer = GRPOTrainer(
        model=spec["model"], reward_funcs=answer_reward, args=GRPOConfig(**grpo), train_dataset=data
    )
    head = exs[: 2 * o.batch_size]  # the template is deterministic: two steps' prompts show it
    ids = trainer._tokenize_prompts([ex.prompt for ex in head])[0]
    if [list(x) for x in ids] != [prompt_ids(tok, ex.prompt, [], True) for ex in head]:
        raise SystemExit("TRL tokenizes the prompts differently from rlfleet")

    def generate_greedy() -> list[list[int]]:
        if trainer.use_vllm:
            from vllm import SamplingParams

            params = SamplingParams(n=1, temperature=0.0, max_tokens=cfg.eval.max_tokens)
            outs = trainer.vllm_generation.llm.generate(
                [{"prompt_token_ids": x} for x in eval_ids], sampling_params=params, use_tqdm=False
            )
            return [list(r.outputs[0].token_ids) for r in outs]
        model, comps = trainer.accelerator.unwrap_model(trainer.model), []
        pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
        kw = {"do_sample": False, "pad_token_id": pad, "max_new_tokens": cfg.eval.max_tokens}
        model.eval()
        for i in range(0, len(eval_ids), 16):  # left-padded batches of 16
            batch, w = eval_ids[i : i + 16], max(map(len, eval_ids[i : i + 16]))
            x = torch.tensor([[pad] * (w - len(b)) + b for b in batch], device=model.device)
            mask = torch.tensor([[0] * (w - len(b)) + [1] * len(b) for b in batch], device=model.device)
            with torch.no_grad():
                comps += [r[w:].tolist() for r in model.generate(input_ids=x, attention_mask=mask, **kw)]
        model.train()
        return comps

    state: dict[str, Any] = {"eval_s": 0.0}
    doc |= {"curve": [], "train_reward": [], "step_seconds": []}

    def evaluate(step: int) -> None:
        t = time.perf_counter()
        if step and trainer.use_vllm:
            trainer.vllm_generation.sync_weights()  # vLLM holds the weights the step sampled with
        texts = tok.batch_decode(generate_greedy(), skip_special_tokens=True)
        rewards = [score(eval_env.eval, ex.info["index"], x) for ex, x in zip(evals, texts, strict=True)]
        dt = time.perf_counter() - t
        state["eval_s"] += dt
        wall = time.time() - t0
        p1 = fmean(r >= 1.0 for r in rewards)
        at = (wall, wall - state["eval_s"]) if step else (0.0, 0.0)  # the base model: the (0 s, step 0) point
        doc["curve"].append(point(step, *at, dt, p1, fmean(rewards)))
        doc["curve"][-1]["sample"] = texts[:3]
        dump(out, doc)
        print(f"eval step {step}: pass@1 {p1:.3f} ({dt:.1f} s)", flush=True)

    class Clock(TrainerCallback):
        def on_train_begin(self, *args: Any, **kw: Any) -> None:
            evaluate(0)  # the base model, the shared (0 s, step 0) point

        def on_step_begin(self, *args: Any, **kw: Any) -> None:
            state["begin"] = time.time()
            doc.setdefault("startup_s", state["begin"] - t0 - state["eval_s"])

        def on_step_end(self, args: Any, st: Any, control: Any, **kw: Any) -> None:
            doc["step_seconds"].append(time.time() - state["begin"])
            if interval and st.global_step % interval == 0:
                evaluate(st.global_step)

        def on_log(self, *args: Any, logs: Any = None, **kw: Any) -> None:
            if logs and "reward" in logs:
                doc["train_reward"].append(logs["reward"])

    trainer.add_callback(Clock())
    trainer.train()
    dump(out, doc)
    sys.stdout.flush()
    os._exit(0)  # not waiting on the colocated engine's teardown


# ---------------------------------------------------------------- main


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--_trl-worker":
        return trl_worker(sys.argv[2])
    ap = argparse.ArgumentParser(allow_abbrev=False)  # unknown args are rlfleet overrides
    ap.add_argument("--plot", nargs="+", help="draw these run JSONs; with --png, --summary")
    ap.add_argument("--png")
    ap.add_argument("--summary")
    ap.add_argument("--framework", choices=["rlfleet", "trl"])
    ap.add_argument("--variant", default="sync")
    ap.add_argument("--job", default=str(JOB), help="the rlfleet job TOML both frameworks run")
    ap.add_argument("--model", default=str(ROOT / "models" / "smollm2"))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--eval-interval", type=int, default=10)
    ap.add_argument("--eval-examples", type=int, help="default: the job's 100")
    ap.add_argument("--batch-size", type=int, default=32, help="prompts per step")
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--lr", type=float, default=5e-6)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    ap.add_argument("--rlfleet-arg", action="append", default=[], help="an rlfleet override word (repeat)")
    ap.add_argument("--trl-no-vllm", action="store_true", help="TRL generates with HF (CPU smoke test)")
    ap.add_argument("--trl-micro-batch", type=int, default=64, help="TRL per_device_train_batch_size")
    ap.add_argument("--trl-vllm-memory", type=float, default=0.3, help="TRL vllm_gpu_memory_utilization")
    ap.add_argument("--time-limit", type=float, help="stop the run after this many seconds (its curve stays)")
    ap.add_argument("--workdir", help="keep the run's store here (default: a temporary directory)")
    ap.add_argument("--out")
    a, extra = ap.parse_known_args()
    if a.plot:
        plot(a.plot, a.png, a.summary)
        return
    if not (a.framework and a.out):
        ap.error("a run needs --framework and --out (or use --plot)")
    from rlfleet.config.loader import load
    from rlfleet.config.models import RLConfig

    cuda = a.device == "cuda"
    if a.device == "auto":
        import torch

        cuda = torch.cuda.is_available()
    if a.framework == "trl" and not (cuda or a.trl_no_vllm):
        ap.error("TRL's colocated vLLM needs a GPU: on a CPU add --trl-no-vllm")
    out = Path(a.out).resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    work = Path(a.workdir).resolve() if a.workdir else Path(tempfile.mkdtemp(prefix="learning_vs_trl_"))
    work.mkdir(parents=True, exist_ok=True)
    model = str(Path(a.model).resolve())
    # fmt: off
    job = Path(a.job).resolve()
    argv = ["@", str(job), "--model.path", model, "--output-dir", str(work / "rlfleet"), "--seed", str(a.seed),
            "--max-steps", str(a.steps), "--eval.interval", str(a.eval_interval),
            "--orchestrator.batch-size", str(a.batch_size), "--orchestrator.group-size", str(a.group_size),
            "--trainer.lr", str(a.lr), "--orchestrator.max-tokens", str(a.max_tokens), "--eval.max-tokens", str(a.max_tokens),
            "--orchestrator.shaping.dynamic-sampling", "false",  # TRL has none; turn it on as an rlfleet variant
            "--trainer.checkpoint-interval", str(a.steps), "--inference.port", str(free_port()), "--wandb.mode", "disabled"]
    # fmt: on
    argv += ["--eval.num-examples", str(a.eval_examples)] if a.eval_examples else []
    if cuda:  # a run attached to a fleet (`--fleet NAME`) starts no vLLM: its trainer's GPU only
        attached = "--fleet" in [*a.rlfleet_arg, *extra]
        argv += [] if attached else ["--deployment.num-inference-gpus", "1"]
        argv += ["--deployment.num-train-gpus", "1"]
    argv += [*a.rlfleet_arg, *extra]
    cfg = load(RLConfig, argv)
    o = cfg.orchestrator
    if a.framework == "trl" and (o.max_async_level or cfg.trainer.lora or o.shaping.dynamic_sampling):
        ap.error("async, LoRA and dynamic sampling are rlfleet-only variants")
    config: dict[str, Any] = {
        "model": model, "job": str(job.relative_to(ROOT)) if job.is_relative_to(ROOT) else str(job), "device": "cuda" if cuda else "cpu",
        "steps": cfg.max_steps, "batch_size": o.batch_size, "group_size": o.group_size, "lr": cfg.trainer.lr,
        "max_tokens": o.max_tokens, "temperature": o.temperature, "eval_interval": cfg.eval.interval,
        "eval_examples": cfg.eval.num_examples, "eval_max_tokens": cfg.eval.max_tokens,
        "max_async_level": o.max_async_level, "max_off_policy_steps": o.max_staleness,
        "dynamic_sampling": o.shaping.dynamic_sampling, "loss": cfg.loss.model_dump(),
        "lora": cfg.trainer.lora.model_dump() if cfg.trainer.lora else None, "rlfleet_args": argv, "differs": DIFFERS,
    }  # fmt: skip
    if a.framework == "trl":
        config["trl_grpo_config"] = trl_grpo(cfg, a, work, cuda)
    doc: dict[str, Any] = {
        "framework": a.framework,
        "variant": a.variant,
        "seed": a.seed,
        "status": "running",
    }
    doc |= {"command": sys.argv, "config": config, "curve": [], "train_reward": []}
    dump(out, doc)
    try:
        if a.framework == "rlfleet":
            rc = run_rlfleet(argv, doc, out, work, a.time_limit)
        else:
            rc = run_trl(argv, doc, out, work, model, a.time_limit)
    finally:
        if not a.workdir:
            shutil.rmtree(work, ignore_errors=True)
    doc["status"] = {0: "done", None: f"cut at --time-limit {a.time_limit} s"}.get(rc, f"failed (exit {rc})")
    doc["env"] = machine() | versions()
    dump(out, doc)
    keys = ("framework", "variant", "seed", "status", "startup_s", "total_wall_s")
    print(json.dumps({k: doc.get(k) for k in keys}, default=str), f"log: {out.with_suffix('.log')}")
    for p in doc["curve"]:
        print(
            f"step {p['step']:4d}  train {p['train_wall_s']:7.1f} s  wall {p['wall_s']:7.1f} s  pass@1 {p['pass@1']:.3f}"
        )
    sys.exit(0 if rc in (0, None) else 1)


if __name__ == "__main__":
    main()
