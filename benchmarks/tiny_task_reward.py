"""The untrained tiny model's `repeat` reward per letter: what a random-init policy scores.

Every letter should start from the same floor; a letter whose reward is higher untrained is one
the tokenizer leaks (its filler tokens decoding to text that contains it). One vLLM server, the
tiny model of `rlfleet model tiny` (seed 0), `--prompts` prompts x n=8 x 16 tokens, temperature 1.

    python benchmarks/tiny_task_reward.py --prompts 512 --out benchmarks/results/tiny_task_reward.json
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from common import rl_config, tiny_model, write

from rlfleet.inference.pool import InferencePool
from rlfleet.orchestrator.envs import load_envs
from rlfleet.orchestrator.generate import SamplingParams, generate
from rlfleet.orchestrator.rollout import load_tokenizer


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--prompts", type=int, default=512)
    p.add_argument("--out", default="benchmarks/results/tiny_task_reward.json")
    a = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model = tiny_model(Path(tmp))
        cfg = rl_config(model, Path(tmp) / "run")
        o = cfg.orchestrator
        (env,) = load_envs(o.env)
        pool = InferencePool(cfg.inference_job())
        try:
            pool.ensure()
            params = SamplingParams(8, o.max_tokens, 1.0, o.stall_timeout_s, cfg.inference.max_model_len)
            groups = generate(
                env, env.examples(0, a.prompts, cfg.seed), params, load_tokenizer(str(model)), pool
            )
        finally:
            pool.shutdown()
    by_letter: dict[str, list[float]] = {}
    for g in groups:
        for t in g:
            by_letter.setdefault(t.example.answer, []).append(t.reward)
    per_letter = {k: round(statistics.fmean(v), 4) for k, v in sorted(by_letter.items())}
    results = {
        "samples": sum(len(v) for v in by_letter.values()),
        "reward_per_letter": per_letter,
        "mean_reward": statistics.fmean(r for v in by_letter.values() for r in v),
    }
    print(results)
    write(a.out, results)


if __name__ == "__main__":
    main()
