"""Where one RL step's sampling time goes: the request as the sampler sends it vs the same
request without the parts that cost (issue 19's CPU-step profile and issue 16's GPU one, as numbers).

One real vLLM server (the CPU build with the tiny model, or on GPU 0 with `--gpu`, in bf16 with
CUDA graphs, any shape of benchmarks/gpu_loop.py); each repetition sends one step's requests (32
prompts x n=8 x 16 tokens, temperature 1, all at once as the sampler does) in each variant, in
rotating order so drift hits all alike:
  as_sent:        the sampler's body (`logprobs: 0`, `return_token_ids`, `return_tokens_as_token_ids`)
  no_logprobs:    without `logprobs` (what the per-token logprob the trainer needs costs)
  token_text:     logprob entries named by their decoded text (the sampler sent this until 2026-11-24)
  one_token:      `max_tokens: 1` (prefill and the serving path's fixed cost, no decoding)
  one_request:    the 32 prompts as one request (what 32 HTTP requests cost over one)
Medians of `--reps`; `py-spy record` on the server and its engine core (see docs/benchmarks/gpu-loop.md) says
where inside vLLM the time goes.

    python benchmarks/sampling_cost.py --reps 8 --out benchmarks/results/sampling_cost_cpu_2core.json
    python benchmarks/sampling_cost.py --gpu --shape 05b --reps 8 --out benchmarks/results/sampling_cost_h100_05b.json
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from common import median, rl_config, table, tiny_model, write
from gpu_loop import SHAPES

from rlfleet.config.gpu_defaults import gpu_defaults
from rlfleet.inference.pool import InferencePool

BASE = {
    "model": "policy",
    "temperature": 1.0,
    "logprobs": 0,
    "return_token_ids": True,
    "return_tokens_as_token_ids": True,
}
VARIANTS: dict[str, dict[str, Any]] = {
    "as_sent": {},
    "no_logprobs": {"logprobs": None},
    "token_text": {"return_tokens_as_token_ids": None},
    "one_token": {"max_tokens": 1},
    "one_request": {},  # see one_step
}


async def one_step(
    url: str, prompts: list[list[int]], n: int, max_tokens: int, extra: dict[str, Any], batched: bool
) -> float:
    body = {k: v for k, v in (BASE | {"n": n, "max_tokens": max_tokens} | extra).items() if v is not None}
    async with httpx.AsyncClient(timeout=120) as client:

        async def post(p: list[int] | list[list[int]]) -> None:
            (await client.post(f"{url}/v1/completions", json=body | {"prompt": p})).raise_for_status()

        t0 = time.perf_counter()
        await asyncio.gather(*(post(p) for p in ([prompts] if batched else prompts)))
        return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=8)
    ap.add_argument("--out", required=True)
    ap.add_argument("--gpu", action="store_true", help="serve on GPU 0 with the GPU defaults")
    ap.add_argument("--shape", default="tiny", choices=sorted(SHAPES))
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp_s:
        tmp = Path(tmp_s)
        gpus = ["0"] if a.gpu else []
        cfg = rl_config(tiny_model(tmp, **SHAPES[a.shape]), tmp / "run")
        cfg = gpu_defaults(cfg, gpus, gpus)  # what the flow does: bf16, CUDA graphs, shared-GPU memory
        o = cfg.orchestrator
        prompts = [[1] + [5 + i % 20] * 12 for i in range(o.batch_size)]
        pool = InferencePool(cfg.inference_job(gpus))
        try:
            url = pool.ensure()[0]
            times: dict[str, list[float]] = {k: [] for k in VARIANTS}
            first: dict[str, float] = {}  # the warm-up round: a fresh server's first requests
            names = list(VARIANTS)
            for rep in range(a.reps + 1):  # the first round warms up
                for k in names[rep % len(names) :] + names[: rep % len(names)]:
                    t = asyncio.run(
                        one_step(url, prompts, o.group_size, o.max_tokens, VARIANTS[k], k == "one_request")
                    )
                    if rep:
                        times[k].append(t)
                    else:
                        first[k] = t
        finally:
            pool.shutdown()
    res = {k: {"median_s": median(v), "first_s": first[k], "all_s": v} for k, v in times.items()}
    shape = {
        "prompts": o.batch_size,
        "n": o.group_size,
        "max_tokens": o.max_tokens,
        "model": a.shape,
        "gpu": a.gpu,
    }
    write(a.out, {"config": {"reps": a.reps, **shape}, "variants": res})
    base = res["as_sent"]["median_s"]
    table(
        f"one step's sampling, {o.batch_size} prompts x {o.group_size} x {o.max_tokens} tokens",
        ["variant", "median s", "vs as_sent"],
        [[k, r["median_s"], r["median_s"] / base] for k, r in res.items()],
    )


if __name__ == "__main__":
    main()
