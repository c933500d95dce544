"""A step's rollouts in the run store: trajectory records, `rollouts/step_N`, staleness rules."""

from __future__ import annotations

import json
import logging
import statistics
import threading
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from rlfleet.orchestrator.envs import Trajectory
from rlfleet.store import RunStore, layout
from rlfleet.store.records import RolloutManifest, RolloutStats, TrajectoryRecord

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

log = logging.getLogger("rlfleet.orchestrator")


_TOKENIZER_LOCK = threading.Lock()


def load_tokenizer(path: str) -> PreTrainedTokenizerBase:
    """One load per path, one thread at a time: the flow warms it in a thread while vLLM starts,
    and transformers' lazy imports are not thread-safe (a second thread importing it meanwhile got
    `cannot import name 'AutoTokenizer'`)."""
    with _TOKENIZER_LOCK:
        return _load_tokenizer(path)


def warm_tokenizer(path: str) -> None:
    """Load the tokenizer in a thread, from the flow's start: there the main thread mostly waits on
    Prefect's API and the replicas. Not earlier: its imports (transformers; torch too with
    transformers 5.17: 3-5 s on a GPU host) hold the GIL, and beside `rlfleet rl`'s own imports
    they delayed the flow's start by 5 s on a warm fleet (an H200 host, 2026-11-28)."""
    threading.Thread(target=load_tokenizer, args=(path,), name="rlfleet-tokenizer", daemon=True).start()


# what AutoTokenizer loads a tokenizer saved under these names as (transformers 5: one class)
GENERIC_TOKENIZERS = {"TokenizersBackend", "PreTrainedTokenizerFast"}


@lru_cache(maxsize=4)
def _load_tokenizer(path: str) -> PreTrainedTokenizerBase:
    """A tokenizer saved as transformers' generic class is loaded by that class: AutoTokenizer's
    lookup imports every model family's configuration first (9.2 s against 2.8 s of imports on 2
    cores), and with a warm fleet this load is on the way to step 0. Any other class: AutoTokenizer."""
    try:
        named = json.loads((Path(path) / "tokenizer_config.json").read_text()).get("tokenizer_class")
    except (OSError, ValueError):
        named = None
    if named in GENERIC_TOKENIZERS:
        from transformers import PreTrainedTokenizerFast

        return PreTrainedTokenizerFast.from_pretrained(path)
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


def staleness(step: int, policy_step: int) -> int:
    """Steps between the weights that sampled a rollout and the on-policy ones for `step` (N-1)."""
    return step - 1 - policy_step


def usable(step: int, policy_step: int, max_staleness: int) -> bool:
    """A rollout sampled by `policy_step` may train step N iff 0 <= staleness <= m
    (`OrchestratorConfig.max_staleness`).

    m = 0 is on-policy (weights N-1 only); negative staleness (weights from the future, left by
    a run that went further) is never usable."""
    return 0 <= staleness(step, policy_step) <= max_staleness


def trajectory_record(t: Trajectory, group: int, env: str, started: int) -> TrajectoryRecord:
    """What `rollouts/step_N` keeps of a trajectory: the tokens the trainer needs, and the rest.

    `policy_step` is the oldest weight version among its sampled tokens (each turn's `versions`
    has them per token), `policy_step_max` the newest; `started` (the version served when it was
    sent) stands in for a trajectory that sampled nothing."""
    versions = [v for turn in t.turns for v, _ in turn.get("versions", [])] or [started]
    return {
        "group": group,
        "env": env,
        "example_uid": t.example.uid,
        "input_ids": t.ids,
        "loss_mask": t.mask,
        "logprobs": t.logprobs,
        "prompt_len": t.prompt_len,
        "reward": t.reward,
        "metrics": t.metrics,
        "error": t.error,
        "policy_step": min(versions),
        "policy_step_max": max(versions),
        "truncated": t.truncated,
        "turns": t.turns,
        "messages": t.messages,
        "completion": t.completion,
    }


def single_turn(prompt_ids: list[int], completion_ids: list[int], logprobs: list[float]) -> dict[str, Any]:
    """The token fields of a one-turn trajectory record (benchmarks and tests build batches from these)."""
    p = len(prompt_ids)
    return {
        "input_ids": prompt_ids + completion_ids,
        "loss_mask": [0] * p + [1] * len(completion_ids),
        "logprobs": [0.0] * p + list(logprobs),
        "prompt_len": p,
    }


def rollout_stats(records: list[TrajectoryRecord]) -> RolloutStats:
    """Step-level numbers of a rollout: rewards overall and per env, env metrics, failures."""
    rewards = [r["reward"] for r in records]
    envs = sorted({r["env"] for r in records})
    metrics: dict[str, float] = {}
    for env in envs:
        mine = [r for r in records if r["env"] == env]
        if len(envs) > 1:
            metrics[f"{env}/mean_reward"] = statistics.fmean(r["reward"] for r in mine)
        for key in sorted({k for r in mine for k in r["metrics"]}):
            values = [r["metrics"][key] for r in mine if key in r["metrics"]]
            metrics[f"{env}/{key}"] = statistics.fmean(values)
    return {
        "num_samples": len(records),
        "mean_reward": statistics.fmean(rewards),
        "reward_std": statistics.pstdev(rewards),
        "reward_max": max(rewards),
        "num_completion_tokens": sum(sum(r["loss_mask"]) for r in records),
        "reward_errors": sum(r["error"] is not None for r in records),
        "first_error": next((f"{r['env']}: {r['error']}" for r in records if r["error"]), None),
        "truncated": sum(r["truncated"] for r in records),
        # samples whose request failed on a replica and was sent again: the step went on, but slower
        "resent_samples": sum(any(t.get("resent") for t in r["turns"]) for r in records),
        "turns_mean": statistics.fmean(len(r["turns"]) for r in records),
        "metrics": metrics,
    }


class Rollout(NamedTuple):
    """A published `rollouts/step_N`: its manifest, and the records it holds (still in memory)."""

    manifest: RolloutManifest
    records: list[TrajectoryRecord]


def publish_rollout(
    store: RunStore, step: int, records: list[TrajectoryRecord], meta: dict[str, Any]
) -> RolloutManifest:
    """Publish `rollouts/step_N`: the sample records as one JSONL file, the manifest with `meta`.

    One file (`layout.ROLLOUT_RECORDS`): the stream takes a step's groups from every replica at once.
    """
    rel = layout.step_dir(layout.ROLLOUTS, step)
    stage = store.staging_dir(rel)
    (stage / layout.ROLLOUT_RECORDS).write_text("".join(json.dumps(r) + "\n" for r in records))
    return store.publish_dir(stage, rel, meta)


def read_rollout(store: RunStore, step: int) -> list[TrajectoryRecord]:
    """The records of a published `rollouts/step_N`, checksums verified: read back only when a
    rollout published earlier is reused (a retry, a resume) and tests."""
    rel = layout.step_dir(layout.ROLLOUTS, step)
    manifest = store.published(rel)
    records = []
    for name in sorted(manifest["files"]):
        text = store.read_bytes(f"{rel}/{Path(name).as_posix()}").decode()
        records += [json.loads(line) for line in text.splitlines() if line]
    return records
