"""Job (a): single-turn `repeat` with long-tailed completion lengths, rlfleet (per variant) vs TRL.

The lengths come from the model's own EOS: random init samples EOS at a steady rate per token, so
lengths are geometric, clipped at max_tokens (the tiny model's 128 ids: 1/128; `--eos-rate` tunes
a larger vocabulary's model to 4/max_tokens: `tune_eos`). The repeat reward is per="completion"
(the letter's share of the completion) so RL does not push every sample to max_tokens. Both
frameworks get the same weights, prompts, reward and optimizer (vs_trl.py's pieces); TRL runs
`--trl-steps` of them. Also measured: the engine's peak, one vLLM server started as rlfleet starts
it (`engine_peak`) under C = batch x group and 2C concurrent `ignore_eos` requests; "busy" = a
run's generated tokens/s over its step loop / the peak at C (busy_all: every token rlfleet's
rollout stream sampled, groups it dropped as too stale or still held at the end included). Per
step: completion-length mean, p50, p90, p99, max (rlfleet: `rollouts/step_N/*.jsonl`; TRL: its
completion masks).

    python benchmarks/long_tail.py --out benchmarks/results/long_tail_cpu_2core.json \
        --variants "k0=--orchestrator.max-async-level 0;k1=--orchestrator.max-async-level 1"
    python benchmarks/long_tail.py --device cuda --shape 05b --trl-vllm --steps 10 --trl-steps 3 \
        --variants "k0=;k1=--orchestrator.max-async-level 1" --weights.transport cuda_ipc \
        --out benchmarks/results/long_tail_h100_05b.json
    python benchmarks/long_tail.py --device cuda --shape 05b --only trl --trl-vllm --trl-processes 4 \
        --steps 4 --out benchmarks/results/long_tail_h200x4_trl.json

Any other `--section.key value` overrides the job for every rlfleet variant (and for TRL where
vs_trl maps it); `--variants "NAME=ARGS;NAME=ARGS"` runs rlfleet once per entry with its own extra
overrides; `--rlfleet-ref GITREF` also runs each variant from a `git worktree` of GITREF, or from
a checkout directory of that name (named NAME@GITREF; that ref must know RepeatArgs.per).
`--plot A.json [B.json ...]` draws the rlfleet runs of result files side by side (`plot`).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import tomllib
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import numpy as np
from claims import machine
from common import (
    ROOT,
    bar,
    exit_on_sigterm,
    free_port,
    keep_logs,
    pyplot,
    rollouts,
    run_rlfleet,
    save_png,
    steps,
    table_of,
    tiny_model,
    versions,
    write,
)
from engine_peak import PEAK_VARIANTS, engine_peak
from trl_servers import placement, sampler, sampler_arguments, visible_gpus
from trl_worker import processes_argument, trl_batch
from vs_trl import DIFFERS, SHAPES, positions_for, run_trl, trl_spec

# per device: the job (micro = rlfleet's micro_batch_size: packed rows when seq_len > 0), TRL's steps and
# micro-batch (sequences), the peak's tokens per request
DEFAULTS: dict[str, dict[str, Any]] = {
    "cpu": dict(max_tokens=256, max_model_len=320, batch=8, group=4, micro=32, seq_len=0, lr=5e-3, steps=4),
    "cuda": dict(
        max_tokens=4096, max_model_len=4608, batch=32, group=8, micro=4, seq_len=4608, lr=1e-5, steps=10
    ),
}
TRL_STEPS = {"cpu": 2, "cuda": 5}
PEAK_TOKENS = {"cpu": 128, "cuda": 512}
TRL_MICRO = {"cpu": 32, "cuda": 8}
RUN_COLS = {"wall_s": "wall s", "startup_s": "start s", "median_step_s": "step s", "steps_per_s": "steps/s"}
RUN_COLS |= {"gen_tokens_per_s": "tok/s", "busy": "busy", "busy_all": "busy all"}
LEN_COLS = {"len_mean": "mean", "len_p50": "p50", "len_p90": "p90", "len_p99": "p99", "len_max": "max"}
LEN_COLS |= {"truncated": "share at max_tokens"}
COLS = RUN_COLS | LEN_COLS


# ---------------------------------------------------------------- the model


def tune_eos(model: Path, rate: float, positions: int = 1024, seed: int = 0) -> dict[str, float]:
    """Make EOS about this likely per token, in any context: hidden dimension 0 becomes a constant
    that no layer reads or writes (its embedding column one weight's size, its rows of o_proj and
    down_proj and its input-norm weights 0), so after the final norm it is ~constant / rms(x); the
    LM head reads EOS, and only EOS, from it with the weight that makes the mean P(EOS) over
    `positions` random-token positions `rate`. The rest of the model is untouched; saved in its dtype."""
    import torch
    from transformers import AutoModelForCausalLM

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    m = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).to(dev)
    dtype, eos = json.loads((model / "config.json").read_text())["dtype"], m.config.eos_token_id
    emb, head = m.get_input_embeddings().weight, m.get_output_embeddings().weight
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        emb[:, 0] = emb[:, 1:].std()
        for layer in m.model.layers:
            layer.self_attn.o_proj.weight[0] = layer.mlp.down_proj.weight[0] = 0.0
            layer.input_layernorm.weight[0] = layer.post_attention_layernorm.weight[0] = 0.0
        head[:, 0] = 0.0
        ids = torch.randint(3, m.config.vocab_size, (1, positions), generator=g).to(dev)
        h = m.model(ids).last_hidden_state[0]
        base = h @ head.T
        lo, hi = 0.0, 1e5
        for _ in range(80):  # bisect the weight: P(EOS) rises with it (h[:, 0] > 0)
            w = (lo + hi) / 2
            logits = base.clone()
            logits[:, eos] += w * h[:, 0]
            p = torch.softmax(logits, -1)[:, eos]
            lo, hi = (w, hi) if p.mean().item() < rate else (lo, w)
        head[eos, 0] = w
    m.to("cpu", getattr(torch, dtype)).save_pretrained(model, safe_serialization=True)
    q = p.quantile(torch.tensor([0.1, 0.9], device=p.device)).tolist()
    return {"eos_rate": p.mean().item(), "eos_rate_p10": q[0], "eos_rate_p90": q[1], "head_weight": w}


def prepare_model(tmp: Path, shape: dict[str, Any], max_model_len: int, max_tokens: int, rate: float | None):
    """The random-init model both frameworks load, with RoPE positions for max_model_len and (rate
    None: if 1/vocab would run most samples to max_tokens) EOS tuned to `rate` (default 4/max_tokens),
    in a subprocess so that this process never holds a CUDA context; (path, what tune_eos reports)."""
    model = tiny_model(tmp, **shape)
    positions_for(model, max_model_len)
    cfg = json.loads((model / "config.json").read_text())
    if rate is None:
        rate = 0.0 if 1 / cfg["vocab_size"] >= 2 / max_tokens else 4 / max_tokens
    if not rate:
        return model, {"tuned": False, "natural_eos_rate": 1 / cfg["vocab_size"]}
    cmd = [sys.executable, __file__, "--_tune-eos", str(model), str(rate), str(max_model_len)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.splitlines()[-1]
    return model, {"tuned": True, "target": rate} | json.loads(out)


# ---------------------------------------------------------------- the runs


def parse_variants(spec: str) -> list[tuple[str, list[str]]]:
    """ "k0=;k1=--orchestrator.max-async-level 1" -> [("k0", []), ("k1", [...])]."""
    out = []
    for part in filter(None, (p.strip() for p in spec.split(";"))):
        name, _, args = part.partition("=")
        if not name.strip() or name.strip() in {n for n, _ in out}:
            raise SystemExit(f"--variants: bad or repeated name in {part!r}")
        out.append((name.strip(), shlex.split(args)))
    return out


def checkout(ref: str, tmp: Path, stack: ExitStack) -> Path:
    """A detached `git worktree` of `ref` under tmp, removed when `stack` closes."""
    path = tmp / f"ref_{ref.replace('/', '_')}"
    subprocess.run(["git", "worktree", "add", "--detach", str(path), ref], cwd=ROOT, check=True)
    stack.callback(subprocess.run, ["git", "worktree", "remove", "--force", str(path)], cwd=ROOT)
    return path


def runs(
    variants: list[tuple[str, list[str]]], ref: str | None, tmp: Path, stack: ExitStack
) -> list[tuple[str, list[str], Path]]:
    """(name, extra overrides, checkout root) per rlfleet run: every variant here, and at `ref` (a git
    ref, or a directory holding a checkout: a GPU machine gets the tree without its .git)."""
    out = [(n, v, ROOT) for n, v in variants]
    if ref:
        root = Path(ref).resolve() if Path(ref, "rlfleet").is_dir() else checkout(ref, tmp, stack)
        out = [(f"{n}@{Path(ref).name}", v, root) for n, v in variants] + out
    return out


def run_variant(argv: list[str], out: Path, logs: Path, name: str, root: Path) -> dict[str, Any]:
    """One `rlfleet rl` from checkout `root`; its trainer and vLLM logs (and the trainer's profile,
    `--trainer.profile-step`) copied beside the command's."""
    # the other checkout in place of this one; the rest of PYTHONPATH (a GPU machine's site dir) kept
    path = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and Path(p).resolve() != ROOT]
    env = None if root == ROOT else dict(os.environ, PYTHONPATH=os.pathsep.join([str(root), *path]))
    from rlfleet.store import layout

    res = run_rlfleet(argv, out, logs / f"{name}.log", env, root)
    keep_logs(out, logs, name)
    last = json.loads((out / layout.step_json(layout.STEPS, len(res["per_step"]["step"]) - 1)).read_text())
    stream = last.get("stream") or {}  # the rollout stream's lifetime counts (absent before it existed)
    loop_s = res["steps"] / res["steps_per_s"]
    return res | {
        "stream": stream,
        "all_gen_tokens_per_s": stream.get("generated_tokens", 0) / loop_s or None,
    }


def run_variants(
    a: argparse.Namespace,
    tmp: Path,
    stack: ExitStack,
    logs: Path,
    args_for: Callable[[Path, list[str]], list[str]],
    measure: Callable[[Path, dict[str, Any]], dict[str, Any]],
    results: dict[str, Any],
    env: dict[str, Any],
    cols: dict[str, str],
) -> None:
    """Every rlfleet run of `--variants` (and `--rlfleet-ref`) into `results` by name, for both jobs
    (this one and slow_tools.py): its command line `args_for(out, overrides)` (checked before the run
    where it runs from this checkout; another ref checks its own), the run (`run_variant`), then
    `measure(out, result)`'s figures. What the runs so far measured goes beside `--out` after each,
    and a cut run (SIGTERM from `timeout` too) keeps the steps it finished."""
    from rlfleet.config.loader import load
    from rlfleet.config.models import RLConfig

    for name, extra, root in runs(parse_variants(a.variants), a.rlfleet_ref, tmp, stack):
        out = tmp / f"rl_{len(results)}"
        args = args_for(out, extra)
        if root == ROOT:
            load(RLConfig, args)
        try:
            res = run_variant(args, out, logs, name, root)
        except BaseException:
            results[name] = {"cut": True, "steps": steps(out)}
            write(a.out, results, env=env, partial=True)
            raise
        results[name] = res | measure(out, res) | {"overrides": extra, "checkout": str(root)}
        write(a.out, results, env=env, partial=True)
        print(name, {k: results[name].get(k) for k in cols}, flush=True)


def pct(xs: list[float]) -> dict[str, float]:
    a = np.asarray(xs, dtype=float)
    if not a.size:
        return {k: float("nan") for k in ("mean", "p50", "p90", "p99", "max")}
    p50, p90, p99 = np.percentile(a, [50, 90, 99])
    return {
        "mean": float(a.mean()),
        "p50": float(p50),
        "p90": float(p90),
        "p99": float(p99),
        "max": float(a.max()),
    }


def length_summary(lengths: list[list[int]], max_tokens: int) -> dict[str, Any]:
    """Per-step length percentiles, and over the whole run (`len_*`, share that hit max_tokens)."""
    every = [x for step in lengths for x in step]
    return {f"len_{k}": v for k, v in pct(every).items()} | {
        "truncated": sum(x >= max_tokens for x in every) / max(len(every), 1),
        "lengths_per_step": [pct(step) for step in lengths],
    }


def run_config(
    a: argparse.Namespace, shape: dict[str, Any], job: dict[str, Any], overrides: list[str], steps: int
) -> dict[str, Any]:
    """What both jobs (this one and slow_tools.py) record of how they ran."""
    from rlfleet.trainer.tiny import tiny_config

    return {
        "device": a.device,
        "shape": a.shape,
        "model": tiny_config(**shape).to_dict(),
        "job": job,
        "rlfleet_overrides": overrides,
        "variants": a.variants,
        "rlfleet_ref": a.rlfleet_ref,
        "steps": steps,
    }


def write_job(
    a: argparse.Namespace, d: dict[str, Any], model: Path, envs: list[dict[str, Any]], path: Path
) -> Path:
    """The rl TOML both jobs run (this one and slow_tools.py): `d`'s shape, `envs` as the tasks."""
    import tomli_w

    o = {"batch_size": d["batch"], "group_size": d["group"], "max_tokens": d["max_tokens"]}
    o |= {"micro_batch_size": d["micro"], "seq_len": d["seq_len"], "temperature": 1.0, "env": envs}
    job = {"max_steps": d["steps"], "seed": 0, "model": {"path": str(model)}, "orchestrator": o}
    job |= {"trainer": {"lr": d["lr"], "checkpoint_interval": 1000}, "wandb": {"mode": "disabled"}}
    job["inference"] = {"max_model_len": d["max_model_len"]}
    if a.device == "cuda":
        job["model"]["dtype"] = "bfloat16"
        job["deployment"] = {"num_inference_gpus": 1, "num_train_gpus": 1}
    path.write_text(tomli_w.dumps(job))
    return path


def job_toml(a: argparse.Namespace, d: dict[str, Any], model: Path, path: Path) -> Path:
    # per left out at its default, so that a --rlfleet-ref older than RepeatArgs.per loads the job
    args = {"per": a.repeat_per} if a.repeat_per != "max_tokens" else {}
    return write_job(a, d, model, [{"type": "repeat", "args": args}], path)


def job_arguments(ap: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """What both jobs (this one and slow_tools.py) take: where, which variants and refs, the
    model's EOS rate, where the output goes."""
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--shape", choices=sorted(SHAPES), default=None, help="default: tiny on cpu, 05b on cuda")
    ap.add_argument("--variants", default="rlfleet=", help='"NAME=ARGS;NAME=ARGS": one rlfleet run each')
    ap.add_argument(
        "--rlfleet-ref",
        help="also run every variant from a git worktree of this ref, or from this checkout directory",
    )
    ap.add_argument("--eos-rate", type=float, default=None, help="per-token EOS at init (0: leave it)")
    ap.add_argument("--logs", help="keep every command's output in this directory")
    ap.add_argument("--out", required=True)
    return ap


# ---------------------------------------------------------------- the picture


def plotted_runs(paths: list[Path]) -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
    """Every rlfleet run of the files, by name (TRL's and the ratios left out), and the first file's env."""
    out: dict[str, dict[str, Any]] = {}
    docs = [json.loads(path.read_text()) for path in paths]
    for path, doc in zip(paths, docs, strict=True):
        for name, r in doc["results"].items():
            if isinstance(r, dict) and "stream" in r:
                if name in out:
                    raise SystemExit(f"{path}: a run named {name!r} is already in an earlier file")
                out[name] = r
    if not out:
        raise SystemExit(f"no rlfleet run in {[str(p) for p in paths]}")
    return out, docs[0]["env"]


def plot(paths: list[Path]) -> Path:
    """Per run: tokens/s sampled and trained, and its finished groups trained or dropped as stale;
    the PNG beside the first JSON."""
    rows, env = plotted_runs(paths)
    fig, (tok, groups) = pyplot().subplots(1, 2, figsize=(10, 4))
    for i, r in enumerate(rows.values()):
        first = not i  # a legend entry per kind of bar
        tok.bar(
            i,
            (r["all_gen_tokens_per_s"] or 0) / 1e3,
            color="C7",
            alpha=0.4,
            label="sampled" if first else None,
        )
        k = r["gen_tokens_per_s"] / 1e3
        bar(tok, i, k, f"{k:.1f}k", width=0.6, color="C0", label="trained" if first else None)
        s = r["stream"]
        trained = s["finished"] - s["dropped_stale"]
        dropped = s["dropped_stale"] + s.get("aborted_stale", 0)  # dropped at take, or cut in flight
        groups.bar(i, trained, color="C0", label="trained" if first else None)
        bar(
            groups,
            i,
            dropped,
            f"{dropped} stale",
            bottom=trained,
            color="C3",
            label="stale" if first else None,
        )
    for ax, label in ((tok, "tokens/s (thousands)"), (groups, "groups finished or cut")):
        ax.set_xticks(range(len(rows)), list(rows), rotation=15)
        ax.set_ylabel(label)
        ax.legend(loc="lower right", fontsize=8)
    counts = "/".join(map(str, sorted({r["steps"] for r in rows.values()})))
    fig.suptitle(f"job (a), {counts} steps each, {machine(env)}, {env.get('date', '')}", fontsize=10)
    return save_png(fig, paths[0].with_suffix(".png"))


# ---------------------------------------------------------------- main


def main() -> None:
    if sys.argv[1:2] == ["--_tune-eos"]:  # prepare_model's subprocess: no CUDA context left behind
        return print(json.dumps(tune_eos(Path(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4]))))
    if sys.argv[1:2] == ["--plot"]:
        return print(plot([Path(f) for f in sys.argv[2:]]))
    ap = job_arguments(argparse.ArgumentParser())
    ap.add_argument("--steps", type=int, default=None, help="rlfleet's steps (default: 4 cpu, 10 cuda)")
    ap.add_argument("--trl-steps", type=int, default=None, help="TRL's steps (default: 2 cpu, 5 cuda)")
    sampler_arguments(ap)
    processes_argument(ap)
    ap.add_argument(
        "--trl-micro",
        type=int,
        default=None,
        help="TRL's micro-batch per process, in sequences (32 cpu, 8 cuda)",
    )
    ap.add_argument(
        "--trl-checkpointing",
        action="store_true",
        help="TRL with gradient checkpointing (what its OOM asks for)",
    )
    ap.add_argument("--only", choices=["both", "rlfleet", "trl"], default="both")
    ap.add_argument("--repeat-per", choices=["completion", "max_tokens"], default="completion")
    ap.add_argument(
        "--peak-tokens", type=int, default=None, help="tokens per peak request (128 cpu, 512 cuda)"
    )
    ap.add_argument("--no-peak", action="store_true")
    ap.add_argument(
        "--peak-variants",
        default="as_sent",
        help=f"comma-separated, of {sorted(PEAK_VARIANTS)}: how the peak's requests are sent (as_sent: also at 2C)",
    )
    a, overrides = ap.parse_known_args()
    trl_sampler = sampler(ap, a)
    exit_on_sigterm()  # a cut run's finished steps reach the .partial.json (and TRL's vLLM server stops)
    if trl_sampler in ("server", "async") and a.only != "rlfleet":
        placement(visible_gpus(), a.trl_processes)  # before rlfleet's runs, not after them
    if unknown := set(a.peak_variants.split(",")) - PEAK_VARIANTS.keys():
        ap.error(f"--peak-variants: unknown {sorted(unknown)}; known: {sorted(PEAK_VARIANTS)}")
    a.shape = a.shape or ("05b" if a.device == "cuda" else "tiny")
    d = DEFAULTS[a.device] | ({"steps": a.steps} if a.steps else {})
    trl_steps = a.trl_steps or min(TRL_STEPS[a.device], d["steps"])
    from rlfleet.config.loader import load
    from rlfleet.config.models import RLConfig
    from rlfleet.store import layout

    shape = SHAPES[a.shape] | ({"dtype": "bfloat16"} if a.device == "cuda" else {})
    env: dict[str, Any] = {"loadavg_at_start": os.getloadavg()}
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp_s, ExitStack() as stack:
        tmp = Path(tmp_s)
        logs = Path(a.logs) if a.logs else tmp / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        model, env["eos"] = prepare_model(tmp, shape, d["max_model_len"], d["max_tokens"], a.eos_rate)
        job = job_toml(a, d, model, tmp / "job.toml")
        job_dict = tomllib.loads(job.read_text())

        def argv(out: Path, max_steps: int, extra: list[str]) -> list[str]:
            base = ["@", str(job), "--output-dir", str(out), "--inference.port", str(free_port())]
            return [*base, "--max-steps", str(max_steps), *overrides, *extra]

        cfg = load(RLConfig, argv(tmp / "peak", d["steps"], []))
        seqs = d["batch"] * d["group"]
        if not a.no_peak and a.only != "trl":
            tokens = a.peak_tokens or PEAK_TOKENS[a.device]
            env["engine_peak"] = engine_peak(cfg, [seqs, 2 * seqs], tokens, a.peak_variants.split(","))
            write(a.out, results, env=env, partial=True)
            for f in (tmp / "peak" / layout.LOGS).rglob("*.log"):
                shutil.copy(f, logs / f"peak_{f.name}")
        peak = env.get("engine_peak", {}).get("by_concurrency", {}).get(str(seqs), {}).get("tokens_per_s")

        def measure(out: Path, res: dict[str, Any]) -> dict[str, Any]:
            lengths = [[sum(r["loss_mask"]) for r in rollouts(out, s)] for s in range(res["steps"])]
            return length_summary(lengths, d["max_tokens"]) | {
                "busy": res["gen_tokens_per_s"] / peak if peak else None,
                # every token sampled (groups dropped as too stale, or left over at the end, too) / peak
                "busy_all": (res["all_gen_tokens_per_s"] or 0) / peak if peak else None,
            }

        if a.only != "trl":
            run_variants(
                a, tmp, stack, logs, lambda o, x: argv(o, d["steps"], x), measure, results, env, COLS
            )
        env["loadavg_between"] = os.getloadavg()
        cfg_trl = load(RLConfig, argv(tmp / "trl_unused", trl_steps, []))
        spec = trl_spec(cfg_trl, model, tmp, a.device, trl_sampler, a.trl_processes)
        spec["grpo"] |= trl_batch(seqs, a.trl_micro or TRL_MICRO[a.device], a.trl_processes)
        spec["grpo"]["gradient_checkpointing"] = a.trl_checkpointing
        if a.only != "rlfleet":
            # TRL's worker re-enters this file: vs_trl.run_trl runs vs_trl.py itself with --_trl-worker
            res = run_trl(spec, tmp, logs / "trl.log")
            res |= length_summary(res["per_step"]["lengths"], d["max_tokens"])
            res["busy"] = res["gen_tokens_per_s"] / peak if peak else None
            results["trl"] = res
            write(a.out, results, env=env, partial=True)
            print("trl", {k: res.get(k) for k in COLS}, flush=True)
    if "trl" in results:
        t = results["trl"]
        results["ratio_rlfleet_over_trl"] = {
            n: {k: r[k] / t[k] for k in ("gen_tokens_per_s", "steps_per_s")}
            for n, r in results.items()
            if n != "trl" and isinstance(r, dict) and "steps_per_s" in r
        }
    config = run_config(a, shape, job_dict, overrides, d["steps"]) | {
        "trl_steps": trl_steps,
        "trl_vllm": a.trl_vllm,
        "trl_sampler": trl_sampler,
        "trl_processes": a.trl_processes,
        "trl_grpo_config": spec["grpo"],
        "repeat_per": a.repeat_per,
        "differs": DIFFERS,
    }
    write(a.out, results, config, env | versions())
    runs_ = {n: r for n, r in results.items() if n != "ratio_rlfleet_over_trl"}
    title = f"long tail: {a.shape} on {a.device}, {d['batch']}x{d['group']}, max_tokens {d['max_tokens']}"
    table_of(f"{title}, peak {peak and round(peak)} tok/s", RUN_COLS, runs_)
    table_of("completion lengths (tokens), all steps", LEN_COLS, runs_)
    for n, r in results.get("ratio_rlfleet_over_trl", {}).items():
        print(f"{n} / TRL:", r)


if __name__ == "__main__":
    main()
