"""What caps rollout throughput: vLLM's engine in process (`LLM.generate`, as TRL's colocated mode
samples) against the same engine behind rlfleet's server (`long_tail.engine_peak`), same model,
same engine arguments, C sequences of `max_tokens` each (`ignore_eos`).

On one H100 the 0.5B shape's server peaked at 5.2k tokens/s at C = 256 (docs/benchmarks/long-generations.md),
a quarter of what its decode step cost predicts: this tells the engine from the
serving path. Offline variants: the sampled token's logprob (as rlfleet asks) or none; server
variants: long_tail.PEAK_VARIANTS. The offline engine runs in a child process that ends before
the server starts (one GPU, one engine at a time).

    python benchmarks/engine_ceiling.py --out benchmarks/results/engine_ceiling_cpu_2core.json
    python benchmarks/engine_ceiling.py --device cuda --shape 05b --concurrency 256 --max-tokens 512 \
        --server-variants as_sent,completions,completions_stream --out benchmarks/results/engine_ceiling_h100_05b.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from engine_peak import PEAK_VARIANTS, engine_peak
from eos_model import prepare_model
from vs_trl import SHAPES, versions

SEED_IDS = [1, 70, 71, 72]  # BOS + "abc" in the tiny tokenizer


def offline(spec: dict[str, Any]) -> dict[str, Any]:
    """In this (child) process: vLLM's `LLM` with the server's engine arguments, one warm-up
    batch, then per variant the best of `reps` timed `generate` calls of C prompts."""
    from vllm import LLM, SamplingParams

    t0 = time.perf_counter()
    llm = LLM(**spec["engine"])
    out: dict[str, Any] = {"start_s": time.perf_counter() - t0, "variants": {}}
    prompts = [{"prompt_token_ids": SEED_IDS}] * spec["concurrency"]
    for name, logprobs in (("logprob", 0), ("no_logprobs", None)):
        params = SamplingParams(
            max_tokens=spec["max_tokens"], temperature=1.0, ignore_eos=True, logprobs=logprobs, seed=None
        )
        llm.generate(prompts, params, use_tqdm=False)  # warm-up
        tries = []
        for _ in range(spec["reps"]):
            t = time.perf_counter()
            res = llm.generate(prompts, params, use_tqdm=False)
            tries.append(sum(len(o.token_ids) for r in res for o in r.outputs) / (time.perf_counter() - t))
        out["variants"][name] = {"tokens_per_s": max(tries), "tries": tries}
        print(f"offline {name}: {max(tries):.0f} tokens/s (best of {tries})", flush=True)
    return out


def engine_kwargs(cfg: Any) -> tuple[dict[str, Any], dict[str, str]]:
    """`LLM(...)` arguments and environment matching what `inference/server.py` starts."""
    from rlfleet.config.gpu_defaults import gpu_defaults
    from rlfleet.config.placement import assign_gpus
    from rlfleet.inference.server import replica_env

    inf, train = assign_gpus(cfg.deployment)
    cfg = gpu_defaults(cfg, inf, train)
    job, i = cfg.inference_job(inf), cfg.inference
    kw: dict[str, Any] = {
        "model": cfg.model.path,
        "dtype": i.vllm_dtype(cfg.model.dtype, bool(inf)),
        "max_model_len": i.max_model_len,
        "logprobs_mode": "processed_logprobs",
        "seed": cfg.seed,
        "enforce_eager": i.enforce_eager if i.enforce_eager is not None else not inf,
    }
    if inf:
        kw["gpu_memory_utilization"] = i.gpu_memory_utilization or 0.9
    env = {k: v for k, v in replica_env(job, 0).items() if k != "VLLM_SERVER_DEV_MODE"}
    return kw, env


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--_offline":
        spec = json.loads(Path(sys.argv[2]).read_text())
        return Path(spec["result"]).write_text(json.dumps(offline(spec)))
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--shape", choices=sorted(SHAPES), default=None, help="default: tiny on cpu, 05b on cuda")
    ap.add_argument("--concurrency", type=int, default=None, help="sequences at once (32 cpu, 256 cuda)")
    ap.add_argument("--max-tokens", type=int, default=None, help="tokens per sequence (128 cpu, 512 cuda)")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument(
        "--server-variants",
        default="as_sent,completions,completions_stream",
        help=f"of {sorted(PEAK_VARIANTS)}",
    )
    ap.add_argument("--parts", default="offline,server", help="offline, server or both")
    ap.add_argument(
        "--profile", help="a directory for py-spy's stacks of the server's bursts (py-spy on PATH)"
    )
    ap.add_argument("--out", required=True)
    a, overrides = ap.parse_known_args()  # the rest: rlfleet overrides (--inference.*)
    if unknown := set(a.server_variants.split(",")) - PEAK_VARIANTS.keys():
        ap.error(f"--server-variants: unknown {sorted(unknown)}")
    cuda = a.device == "cuda"
    shape = SHAPES[a.shape or ("05b" if cuda else "tiny")] | ({"dtype": "bfloat16"} if cuda else {})
    c, tokens = a.concurrency or (256 if cuda else 32), a.max_tokens or (512 if cuda else 128)

    from rlfleet.config.loader import load
    from rlfleet.config.models import RLConfig

    with tempfile.TemporaryDirectory() as tmp_s:
        tmp = Path(tmp_s)
        model, _ = prepare_model(tmp, shape, tokens + 64, tokens, rate=0.0)
        args = ["--model.path", str(model), "--output-dir", str(tmp / "run"), "--wandb.mode", "disabled"]
        args += [
            "--inference.max-model-len",
            str(max(tokens + 64, 256)),
            "--orchestrator.max-tokens",
            str(tokens),
        ]
        if cuda:
            args += ["--model.dtype", "bfloat16", "--deployment.num-inference-gpus", "1"]
            args += ["--deployment.num-train-gpus", "1"]  # the share of a GPU a run gives vLLM (0.45)
        args += overrides
        cfg = load(RLConfig, args)
        kw, env = engine_kwargs(cfg)
        spec = {
            "engine": kw,
            "concurrency": c,
            "max_tokens": tokens,
            "reps": a.reps,
            "result": str(tmp / "o.json"),
        }
        (tmp / "spec.json").write_text(json.dumps(spec))
        result: dict[str, Any] = {}
        if "offline" in a.parts:
            cmd = [sys.executable, __file__, "--_offline", str(tmp / "spec.json")]
            subprocess.run(cmd, check=True, env=os.environ | env)
            result["offline"] = json.loads((tmp / "o.json").read_text())
        if "server" in a.parts:
            profile = Path(a.profile) if a.profile else None
            result["server"] = engine_peak(cfg, [c], tokens, a.server_variants.split(","), a.reps, profile)
    if len(result) == 2:
        served = result["server"]["by_concurrency"][str(c)]["tokens_per_s"]
        result["server_over_offline"] = served / result["offline"]["variants"]["logprob"]["tokens_per_s"]
        print(f"server (as sent) / offline (logprob): {result['server_over_offline']:.2f}")
    doc = {
        "env": versions(),
        "config": {"device": a.device, "shape": shape, "concurrency": c, "max_tokens": tokens, "engine": kw},
    }
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(doc | {"results": result}, separators=(",", ":"), default=str))


if __name__ == "__main__":
    main()
