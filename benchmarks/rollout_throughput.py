"""Rollout throughput through the orchestrator vs vLLM's own benchmark load, same server, same run.

One real vLLM CPU server with the tiny model. Each repetition takes one step's prompts
(`batch_size` prompts as token ids, `group_size` samples each, `max_tokens`, temperature 1) and
sends them three ways, in rotating order so drift hits all alike:
  orchestrator: `run_rollout` (sampling + rewards + publishing `rollouts/step_N` to the store)
  vllm-bench:   vLLM's own benchmark request function (`vllm.benchmarks.lib.endpoint_request_func.
                async_request_openai_completions`, what `vllm bench serve` sends: streamed
                completions), all requests at once (request rate inf), same prompts / n / max_tokens
  raw-http:     the same non-streamed request bodies the sampler sends, fired by plain httpx
Throughput = completion tokens / wall time; the ratio is orchestrator / vllm-bench.

    python benchmarks/rollout_throughput.py --reps 5 --out benchmarks/results/rollout_throughput_cpu_2core.json
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

import aiohttp
from common import median, rl_config, table, tiny_model, write
from vllm.benchmarks.lib.endpoint_request_func import RequestFuncInput, async_request_openai_completions

from rlfleet.chat import prompt_ids
from rlfleet.inference.pool import InferencePool
from rlfleet.orchestrator.envs import load_envs
from rlfleet.orchestrator.rollout import load_tokenizer, run_rollout
from rlfleet.orchestrator.sampler import sample_groups
from rlfleet.store import RunStore


async def vllm_bench(url: str, ids: list[list[int]], n: int, max_tokens: int, temperature: float) -> int:
    """vLLM's benchmark client, every request at once; returns completion tokens (usage)."""
    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        inputs = [
            RequestFuncInput(
                prompt=p,
                api_url=f"{url}/v1/completions",
                prompt_len=len(p),
                output_len=max_tokens,
                model="policy",
                logprobs=0,
                extra_body={"n": n, "temperature": temperature},
            )
            for p in ids
        ]
        outs = await asyncio.gather(*(async_request_openai_completions(i, session) for i in inputs))
    bad = [o.error for o in outs if not o.success]
    if bad:
        raise RuntimeError(f"vllm-bench: {len(bad)} failed: {bad[0][:300]}")
    return sum(o.output_tokens for o in outs)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp_s:
        tmp = Path(tmp_s)
        model = tiny_model(tmp)
        cfg = rl_config(
            model,
            tmp / "run",
            "--orchestrator.batch-size",
            str(a.batch_size),
            "--orchestrator.group-size",
            str(a.group_size),
            "--orchestrator.max-tokens",
            str(a.max_tokens),
        )
        o = cfg.orchestrator
        store = RunStore(cfg.output_dir)
        (env,), tok = load_envs(o.env), load_tokenizer(str(model))
        pool = InferencePool(cfg.inference_job())
        rows: list[dict] = []
        try:
            url = pool.ensure()[0]

            def orchestrator(step: int, ids: list[list[int]]) -> int:
                return run_rollout(
                    store, step, o, str(model), pool.ensure, cfg.seed, -1, cfg.inference.max_model_len
                )["num_completion_tokens"]

            def bench(step: int, ids: list[list[int]]) -> int:
                return asyncio.run(vllm_bench(url, ids, o.group_size, o.max_tokens, o.temperature))

            def raw(step: int, ids: list[list[int]]) -> int:
                groups = asyncio.run(
                    sample_groups([url], ids, o.group_size, o.max_tokens, o.temperature, o.request_timeout_s)
                )
                return sum(len(s.completion_ids) for g in groups for s in g)

            ways = {"orchestrator": orchestrator, "vllm-bench": bench, "raw-http": raw}
            for rep in range(a.reps + 1):  # rep 0 warms up every path
                ids = [
                    prompt_ids(tok, e.prompt, env.tools_for(e), env.chat)
                    for e in env.examples(rep, o.batch_size, cfg.seed)
                ]
                names = list(ways)
                names = names[rep % 3 :] + names[: rep % 3]
                for name in names:
                    t0 = time.perf_counter()
                    tokens = ways[name](rep, ids)
                    dt = time.perf_counter() - t0
                    rows.append(
                        {"rep": rep, "way": name, "tokens": tokens, "seconds": dt, "tok_s": tokens / dt}
                    )
                    print(rows[-1], flush=True)
        finally:
            pool.shutdown()
    timed = [r for r in rows if r["rep"] > 0]
    summary = {}
    for name in ("orchestrator", "vllm-bench", "raw-http"):
        mine = [r for r in timed if r["way"] == name]
        summary[name] = {
            "median_tok_s": median([r["tok_s"] for r in mine]),
            "median_seconds": median([r["seconds"] for r in mine]),
            "median_tokens": median([r["tokens"] for r in mine]),
        }
    ratio = summary["orchestrator"]["median_tok_s"] / summary["vllm-bench"]["median_tok_s"]
    results = {
        "config": {"batch_size": o.batch_size, "group_size": o.group_size, "max_tokens": o.max_tokens},
        "summary": summary,
        "orchestrator_over_vllm_bench": ratio,
        "orchestrator_over_raw_http": summary["orchestrator"]["median_tok_s"]
        / summary["raw-http"]["median_tok_s"],
        "rows": rows,
    }
    write(a.out, results)
    table(
        f"rollout throughput, {o.batch_size} prompts x n={o.group_size} x {o.max_tokens} tokens",
        ["load", "completion tokens", "s", "tokens/s", "x vllm-bench"],
        [
            [
                n,
                int(s["median_tokens"]),
                s["median_seconds"],
                s["median_tok_s"],
                s["median_tok_s"] / summary["vllm-bench"]["median_tok_s"],
            ]
            for n, s in summary.items()
        ],
    )


if __name__ == "__main__":
    main()
