"""Job (b): multi-turn rollouts whose environment replies take 0.05-2 s, per rlfleet variant.

rlfleet's `python` env on a generated dataset (a chat prompt of one letter written 4-8 times, the
letter as answer), `max_turns` 4, `env_response = benchmarks/workloads/slow_tool.py:reply` (waits
uniform(0.05, 2.0) s, drawn from the conversation so far, then answers or, 1 time in 4, ends the
rollout), reward `benchmarks/workloads/letters_reward.py:letter_share` (the letter's share of all
the model wrote). Per variant: wall, start-up, step s, steps/s, generated tokens/s over the step
loop (common.run_rlfleet), and per step the model turns per rollout and the time in env replies:
  env_sum_s       every reply's wait added up (the environment's work)
  env_lockstep_s  the longest wait of each reply round, added up (what a loop that waits for every
                  rollout's reply before the next turn pays)
  env_critical_s  the longest rollout's waits (what a loop that never waits on another rollout pays)
  env_wall_s      measured: wall time while at least one reply was pending (SLOW_TOOL_LOG)
The waits are recomputed from `rollouts/step_N/*.jsonl` (slow_tool.draw) and checked against the log.

    python benchmarks/slow_tools.py --out benchmarks/results/slow_tools_cpu_2core.json
    python benchmarks/slow_tools.py --rlfleet-ref HEAD --variants "k0=;k1=--orchestrator.max-async-level 1" \
        --out benchmarks/results/slow_tools_cpu_2core_vs_head.json
    python benchmarks/slow_tools.py --device cuda --shape 05b --steps 10 --weights.transport cuda_ipc \
        --out benchmarks/results/slow_tools_h100_05b.json

Other `--section.key value` arguments override the job for every variant. TRL is not run: see TRL_WHY.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import tempfile
import tomllib
from contextlib import ExitStack
from pathlib import Path
from statistics import fmean
from typing import Any

from common import ROOT, free_port, rollouts, table_of, versions, write
from long_tail import job_arguments, prepare_model, run_config, run_variants, write_job
from vs_trl import SHAPES
from workloads.slow_tool import draw

WORKLOADS = ROOT / "benchmarks" / "workloads"
DEFAULTS: dict[str, dict[str, Any]] = {
    "cpu": dict(max_tokens=64, max_model_len=512, batch=8, group=4, micro=32, seq_len=0, lr=5e-3, steps=4),
    "cuda": dict(
        max_tokens=512, max_model_len=4096, batch=32, group=8, micro=4, seq_len=4096, lr=1e-5, steps=10
    ),
}
MAX_TURNS = 4
TRL_WHY = (
    "TRL 1.16's GRPOTrainer continues a rollout only while the model's turn parses as a tool call "
    "(tools= / environment_factory=, _tool_call_loop; max_tool_calling_iterations): there is no hook for an "
    "environment reply to a turn without a tool call, which is this job. Its one other route, rollout_func, "
    "hands the whole generation loop to user code (its own sampling, multi-turn bookkeeping and env_mask), so "
    "a TRL number would time our loop, not TRL's. With the random-init models here a tool-call job would "
    "never leave turn 1 either (the model emits no parseable <tool_call>)."
)
RUN_COLS = {"wall_s": "wall s", "startup_s": "start s", "median_step_s": "step s", "steps_per_s": "steps/s"}
RUN_COLS |= {"gen_tokens_per_s": "tok/s", "reward_first3": "reward first 3", "reward_last3": "last 3"}
ENV_COLS = {"turns_mean": "turns", "env_sum_s": "env sum", "env_lockstep_s": "lockstep"}
ENV_COLS |= {"env_critical_s": "critical", "env_wall_s": "measured wall"}
COLS = RUN_COLS | ENV_COLS


def dataset(path: Path, rows: int, seed: int = 0) -> Path:
    rng = random.Random(seed)
    with path.open("w") as f:
        for _ in range(rows):
            letter = rng.choice("abcdefgh")
            f.write(json.dumps({"prompt": letter * rng.randint(4, 8), "answer": letter}) + "\n")
    return path


def job_toml(a: argparse.Namespace, d: dict[str, Any], model: Path, data: Path, path: Path) -> Path:
    args = {"dataset": str(data), "prompt_column": "prompt", "answer_column": "answer", "chat": True}
    args |= {"rewards": [f"{WORKLOADS / 'letters_reward.py'}:letter_share"], "max_turns": MAX_TURNS}
    args |= {"env_response": f"{WORKLOADS / 'slow_tool.py'}:reply", "tool_timeout_s": 30.0}
    return write_job(a, d, model, [{"name": "slow_tools", "type": "python", "args": args}], path)


def reply_calls(rec: dict[str, Any]) -> list[tuple[int, str, float]]:
    """(round, key, wait) of each env reply this rollout asked for, from its record: one after
    every model turn that a message follows, and after the last one when it ended early (None)."""
    msgs, out = rec["messages"], []
    turns = [j for j, m in enumerate(msgs) if m.get("role") == "assistant"]
    for r, j in enumerate(turns):
        if j + 1 < len(msgs) or len(turns) < MAX_TURNS:
            key, wait, _ = draw(msgs[: j + 1])
            out.append((r, key, wait))
    return out


def union(intervals: list[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for s, e in sorted(intervals):
        total += max(0.0, e - max(s, end))
        end = max(end, e)
    return total


def env_stats(out: Path, steps: int, log: Path) -> dict[str, Any]:
    """Per step: turns per rollout and the time in env replies (module docstring); run means."""
    logged: dict[str, list[dict[str, Any]]] = {}
    for line in log.read_text().splitlines() if log.exists() else []:
        x = json.loads(line)
        logged.setdefault(x["key"], []).append(x)
    per_step: dict[str, list[Any]] = {k: [] for k in ("turns_mean", "turns_hist", "replies", "logged")}
    per_step |= {k: [] for k in ("env_sum_s", "env_lockstep_s", "env_critical_s", "env_wall_s")}
    for s in range(steps):
        recs = rollouts(out, s)
        calls = [reply_calls(r) for r in recs]
        flat = [c for cs in calls for c in cs]
        rounds: dict[int, float] = {}
        for r, _, wait in flat:
            rounds[r] = max(rounds.get(r, 0.0), wait)
        seen = [x for key in {k for _, k, _ in flat} for x in logged.get(key, [])]
        turns = [len(r["turns"]) for r in recs]
        per_step["turns_mean"].append(fmean(turns))
        per_step["turns_hist"].append({n: turns.count(n) for n in range(1, MAX_TURNS + 1)})
        per_step["replies"].append(len(flat))
        per_step["logged"].append(len(seen))
        per_step["env_sum_s"].append(sum(w for _, _, w in flat))
        per_step["env_lockstep_s"].append(sum(rounds.values()))
        per_step["env_critical_s"].append(max((sum(w for _, _, w in cs) for cs in calls), default=0.0))
        per_step["env_wall_s"].append(union([(x["start"], x["end"]) for x in seen]))
    means = {k: fmean(v) for k, v in per_step.items() if k.startswith(("env_", "turns_mean"))}
    return means | {"env_per_step": per_step}


def main() -> None:
    ap = job_arguments(argparse.ArgumentParser())
    ap.add_argument("--steps", type=int, default=None, help="default: 4 cpu, 10 cuda")
    a, overrides = ap.parse_known_args()
    a.shape = a.shape or ("05b" if a.device == "cuda" else "tiny")
    d = DEFAULTS[a.device] | ({"steps": a.steps} if a.steps else {})

    shape = SHAPES[a.shape] | ({"dtype": "bfloat16"} if a.device == "cuda" else {})
    env: dict[str, Any] = {"loadavg_at_start": os.getloadavg()}
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp_s, ExitStack() as stack:
        tmp = Path(tmp_s)
        logs = Path(a.logs) if a.logs else tmp / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        model, env["eos"] = prepare_model(tmp, shape, d["max_model_len"], d["max_tokens"], a.eos_rate)
        data = dataset(tmp / "letters.jsonl", max(512, d["batch"] * d["steps"]))
        job = job_toml(a, d, model, data, tmp / "job.toml")
        job_dict = tomllib.loads(job.read_text())

        def args_for(out: Path, extra: list[str]) -> list[str]:
            os.environ["SLOW_TOOL_LOG"] = (
                f"{out}_slow_tool.jsonl"  # the `rl` command (where replies run) inherits it
            )
            args = ["@", str(job), "--output-dir", str(out), "--inference.port", str(free_port())]
            return [*args, "--max-steps", str(d["steps"]), *overrides, *extra]

        def measure(out: Path, res: dict[str, Any]) -> dict[str, Any]:
            return env_stats(out, res["steps"], Path(f"{out}_slow_tool.jsonl"))

        run_variants(a, tmp, stack, logs, args_for, measure, results, env, COLS)
    results["trl"] = {"ran": False, "why": TRL_WHY}
    config = run_config(a, shape, job_dict, overrides, d["steps"]) | {
        "max_turns": MAX_TURNS,
        "env_reply": "uniform(0.05, 2.0) s, stop with p=0.25 (benchmarks/workloads/slow_tool.py)",
    }
    write(a.out, results, config, env | versions())
    runs_ = {n: r for n, r in results.items() if n != "trl"}
    title = f"slow tools: {a.shape} on {a.device}, {d['batch']}x{d['group']}, {MAX_TURNS} turns x {d['max_tokens']}"
    table_of(title, RUN_COLS, runs_)
    table_of("per step: model turns per rollout, env reply seconds", ENV_COLS, runs_)
    print("TRL: not run.", TRL_WHY)


if __name__ == "__main__":
    main()
