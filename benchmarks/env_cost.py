"""What one step's rollouts cost per environment type, on the same task and the same server.

The `repeat` task four ways: the built-in env (raw prompt), a `type = "python"` env (a JSONL
dataset and a reward function, chat template), the same with an environment reply ("Again.")
after each model turn for 3 turns (256 single-sample requests in flight per later turn), and a
verifiers v1 taskset (written below as a
user writes one; chat template, scored by `Task.score` on a `vf.Trace`). Each repetition sends
one step's worth (32 prompts x n=8 x 16 tokens, all groups at once as the rollout stream does)
per env in rotating order; medians of `--reps`. Besides the wall time: this process's CPU
seconds (the controller's share), and the parts outside vLLM timed alone on the same
trajectories: building the prompts' ids and scoring. `--profile` adds cProfile's top functions
of one verifiers step to the JSON.

    python benchmarks/env_cost.py --reps 5 --profile --out benchmarks/results/env_cost_cpu_2core.json
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import json
import pstats
import tempfile
import time
from pathlib import Path
from typing import Any

from common import median, rl_config, table, tiny_model, write

from rlfleet.chat import prompt_ids
from rlfleet.config.loader import load
from rlfleet.config.models import RLConfig
from rlfleet.inference.pool import InferencePool
from rlfleet.orchestrator.envs import load_envs
from rlfleet.orchestrator.generate import SamplingParams, rollout_group
from rlfleet.orchestrator.rollout import load_tokenizer
from rlfleet.orchestrator.sampler import Sampler

TASKSET = """
import verifiers.v1 as vf

class RepeatData(vf.TaskData):
    answer: str

class RepeatTask(vf.Task[RepeatData, vf.State, vf.TaskConfig]):
    @vf.reward(weight=1.0)
    async def fraction(self, trace: vf.Trace) -> float:
        text = (trace.last_reply or "")[:16]
        return sum(c == self.data.answer for c in text) / 16

class RepeatConfig(vf.TasksetConfig):
    task: vf.TaskConfig = vf.TaskConfig()

class RepeatTaskset(vf.Taskset[RepeatTask, RepeatConfig]):
    def load(self):
        for i in range(64):
            c = "abcdefghijklmnopqrstuvwxyz"[i % 26]
            yield RepeatTask(RepeatData(id=f"t{i}", prompt=c * (4 + i % 5), answer=c), self.config.task)

__all__ = ["RepeatTaskset"]
"""
REWARD = """
def fraction(completion, answer, **_):
    text = completion if isinstance(completion, str) else completion[-1]["content"]
    return sum(c == answer for c in text[:16]) / 16

async def again(state):
    return None if state["num_turns"] >= 3 else "Again."
"""


def env_configs(tmp: Path, model: Path) -> dict[str, Any]:
    (tmp / "repeat_taskset.py").write_text(TASKSET)
    (tmp / "reward.py").write_text(REWARD)
    rows = [{"prompt": "abcdefghijklmnopqrstuvwxyz"[i % 26] * (4 + i % 5)} for i in range(64)]
    (tmp / "data.jsonl").write_text("".join(json.dumps(r | {"answer": r["prompt"][0]}) + "\n" for r in rows))
    toml = f"""
[[orchestrator.env]]
name = "repeat"
type = "repeat"
[[orchestrator.env]]
name = "python"
type = "python"
args = {{ dataset = "{tmp}/data.jsonl", rewards = ["{tmp}/reward.py:fraction"] }}
[[orchestrator.env]]
name = "python_3turns"
type = "python"
args = {{ dataset = "{tmp}/data.jsonl", rewards = ["{tmp}/reward.py:fraction"], env_response = "{tmp}/reward.py:again", max_turns = 3 }}
[[orchestrator.env]]
name = "verifiers"
type = "verifiers"
args = {{ module = "{tmp}/repeat_taskset.py" }}
"""
    (tmp / "envs.toml").write_text(toml)
    return {
        e.name: e
        for e in load_envs(
            load(RLConfig, ["@", str(tmp / "envs.toml"), "--model.path", str(model)]).orchestrator.env
        )
    }


def one_step(
    env: Any, tok: Any, sampler: Sampler, step: int, loop: asyncio.AbstractEventLoop
) -> dict[str, float]:
    """Prompts drawn outside the event loop (a verifiers env runs its own), as the stream draws."""
    return loop.run_until_complete(_one_step(env, env.examples(step, 32, 0), tok, sampler))


async def _one_step(env: Any, examples: list[Any], tok: Any, sampler: Sampler) -> dict[str, float]:
    params = SamplingParams(8, 16, 1.0, 120.0, 256)
    c0, t0 = time.process_time(), time.perf_counter()
    groups = await asyncio.gather(*(rollout_group(env, ex, params, tok, sampler) for ex in examples))
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    t = time.perf_counter()
    for ex in examples:
        prompt_ids(tok, ex.prompt, env.tools_for(ex), env.chat)
    prompts = time.perf_counter() - t
    t = time.perf_counter()
    await asyncio.gather(*(env.score(traj) for g in groups for traj in g))
    scoring = time.perf_counter() - t
    tokens = sum(t["end"] - t["start"] for g in groups for traj in g for t in traj.turns)
    return {
        "wall_s": wall,
        "controller_cpu_s": cpu,
        "prompts_s": prompts,
        "scoring_s": scoring,
        "tokens": tokens,
    }


def profile_step(env: Any, tok: Any, sampler: Sampler, loop: asyncio.AbstractEventLoop) -> list[str]:
    prof = cProfile.Profile()
    prof.enable()
    one_step(env, tok, sampler, 99, loop)
    prof.disable()
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("cumulative").print_stats(40)
    return out.getvalue().splitlines()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp_s:
        tmp = Path(tmp_s)
        model = tiny_model(tmp)
        cfg = rl_config(model, tmp / "run")
        envs = env_configs(tmp, model)
        tok = load_tokenizer(str(model))
        pool = InferencePool(cfg.inference_job([]))
        pool.ensure()
        loop = asyncio.new_event_loop()
        sampler = Sampler(pool, 1.0, 120.0)
        runs: dict[str, list[dict[str, float]]] = {name: [] for name in envs}
        try:
            for env in envs.values():  # warm-up: the server's first batch, each env's first call
                one_step(env, tok, sampler, 0, loop)
            for i in range(a.reps):
                names = list(envs)[i % len(envs) :] + list(envs)[: i % len(envs)]
                for name in names:
                    runs[name].append(one_step(envs[name], tok, sampler, i + 1, loop))
                    print(name, runs[name][-1], flush=True)
            profile = profile_step(envs["verifiers"], tok, sampler, loop) if a.profile else []
        finally:
            loop.run_until_complete(sampler.aclose())
            pool.shutdown()
    keys = ("wall_s", "controller_cpu_s", "prompts_s", "scoring_s", "tokens")
    med = {name: {k: median([r[k] for r in rs]) for k in keys} for name, rs in runs.items()}
    write(a.out, {"per_step_median": med, "runs": runs, "verifiers_profile": profile})
    table(
        "one step's rollouts per env type (median)",
        ["env", *keys],
        [[n, *m.values()] for n, m in med.items()],
    )


if __name__ == "__main__":
    main()
