"""One step of rollouts: prompts -> vLLM group samples -> rewards -> `rollouts/step_N` in the store."""

from __future__ import annotations

import asyncio
import json
import logging
import statistics
import time
from collections.abc import Callable
from functools import lru_cache
from pathlib import Path
from typing import Any

from transformers import AutoTokenizer, PreTrainedTokenizerBase

from rlfleet.config.models import OrchestratorConfig
from rlfleet.errors import TransientError, is_transient
from rlfleet.orchestrator.envs import Environment, Prompt, get_env
from rlfleet.orchestrator.sampler import Sample, sample_groups
from rlfleet.store import RunStore, step_dir

log = logging.getLogger("rlfleet.orchestrator")


@lru_cache(maxsize=4)
def load_tokenizer(path: str) -> PreTrainedTokenizerBase:
    return AutoTokenizer.from_pretrained(path)


def prompt_ids(tok: PreTrainedTokenizerBase, prompt: Prompt, chat: bool) -> list[int]:
    if chat:
        messages = [{"role": "user", "content": prompt.text}]
        return list(
            tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
        )
    ids = tok(prompt.text, add_special_tokens=False)["input_ids"]
    return [tok.bos_token_id, *ids] if tok.bos_token_id is not None else ids


def staleness(step: int, policy_step: int) -> int:
    """Steps between the weights that sampled a rollout and the on-policy ones for `step` (N-1)."""
    return step - 1 - policy_step


def usable(step: int, policy_step: int, max_async_level: int) -> bool:
    """A rollout sampled by `policy_step` may train step N iff 0 <= staleness <= k.

    k = 0 is on-policy (weights N-1 only); negative staleness (weights from the future, left by
    a run that went further) is never usable."""
    return 0 <= staleness(step, policy_step) <= max_async_level


def run_rollout(
    store: RunStore,
    step: int,
    cfg: OrchestratorConfig,
    model_path: str,
    healthy_urls: Callable[[], list[str]],
    seed: int,
    policy_step: int,
    env: Environment | None = None,
) -> dict[str, Any]:
    """Sample `batch_size` prompts x `group_size` completions and publish them with rewards.

    `policy_step` is the weight version the servers hold (-1 = initial weights); every sample
    records it so the trainer can tell how off-policy it is.
    """
    env = env or get_env(cfg.env)
    tok = load_tokenizer(model_path)
    prompts = env.prompts(step, cfg.batch_size, seed)
    ids = [prompt_ids(tok, p, env.chat) for p in prompts]
    seen: list[str] = []

    def urls() -> list[str]:  # remembers the last answer: no second health check just to count
        seen[:] = healthy_urls()
        return seen

    t0 = time.perf_counter()
    groups = sample_with_healing(
        urls, ids, cfg.group_size, cfg.max_tokens, cfg.temperature, cfg.request_timeout_s
    )
    sample_seconds = time.perf_counter() - t0
    num_replicas = len(seen)
    shards: dict[int, list[dict[str, Any]]] = {}
    rewards = []
    for i, (prompt, pids, samples) in enumerate(zip(prompts, ids, groups, strict=True)):
        for sample in samples:
            reward = env.reward(prompt, sample.text, cfg.max_tokens)
            rewards.append(reward)
            record = {
                "group": i,
                "prompt_uid": prompt.uid,
                "prompt_ids": pids,
                "completion_ids": sample.completion_ids,
                "logprobs": sample.logprobs,
                "reward": reward,
                "policy_step": policy_step,
                "completion": sample.text,
            }
            shards.setdefault(i % num_replicas, []).append(record)
    meta = {
        "step": step,
        "policy_step": policy_step,
        "num_samples": len(rewards),
        "reward_mean": statistics.fmean(rewards),
        "reward_std": statistics.pstdev(rewards),
        "reward_max": max(rewards),
        "sample_seconds": sample_seconds,  # time inside inference (benchmarks/control_plane.py)
        "num_completion_tokens": sum(len(r["completion_ids"]) for s in shards.values() for r in s),
    }
    return publish_rollout(store, step, shards, meta)


def publish_rollout(
    store: RunStore, step: int, shards: dict[int, list[dict[str, Any]]], meta: dict[str, Any]
) -> dict[str, Any]:
    """Publish `rollouts/step_N`: one JSONL file of sample records per replica, manifest with `meta`."""
    rel = step_dir("rollouts", step)
    stage = store.staging_dir(rel)
    for replica, records in shards.items():
        (stage / f"replica_{replica}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return store.publish_dir(stage, rel, meta)


def sample_with_healing(
    healthy_urls: Callable[[], list[str]],
    ids: list[list[int]],
    n: int,
    max_tokens: int,
    temperature: float,
    timeout_s: float,
    attempts: int = 3,
) -> list[list[Sample]]:
    """Sample every prompt; requests that failed (a replica died) are re-sent, and only those,
    after `healthy_urls()` has relaunched what was dead."""
    groups: list[list[Sample] | None] = [None] * len(ids)
    pending = list(range(len(ids)))
    for attempt in range(attempts):
        urls = healthy_urls()
        results = asyncio.run(
            sample_groups(urls, [ids[i] for i in pending], n, max_tokens, temperature, timeout_s)
        )
        failed = []
        for i, result in zip(pending, results, strict=True):
            if isinstance(result, BaseException):
                if not is_transient(result):
                    raise result
                failed.append((i, result))
            else:
                groups[i] = result
        if not failed:
            return groups  # type: ignore[return-value]
        log.warning(
            "rollout attempt %d: %d of %d requests failed (%s); re-sending only those",
            attempt + 1,
            len(failed),
            len(pending),
            failed[0][1],
        )
        pending = [i for i, _ in failed]
    raise TransientError(f"{len(pending)} requests still failing after {attempts} attempts") from failed[0][1]


def read_rollout(store: RunStore, step: int) -> list[dict[str, Any]]:
    manifest = store.manifest(step_dir("rollouts", step), verify=True)
    if manifest is None:
        raise FileNotFoundError(f"rollouts/step_{step} is not published")
    records = []
    for name in sorted(manifest["files"]):
        text = store.read_bytes(f"{step_dir('rollouts', step)}/{Path(name).as_posix()}").decode()
        records += [json.loads(line) for line in text.splitlines() if line]
    return records
