"""Async off-policy bookkeeping, without vLLM: the staleness rule, batches that record and enforce
it, and the rollout task's reuse of a published rollout (valid iff its weights are within k)."""

from __future__ import annotations

import pytest

from rlfleet.config.deployment import DeploymentConfig
from rlfleet.config.loader import load
from rlfleet.config.models import RLConfig
from rlfleet.errors import DeterministicError
from rlfleet.orchestrator.batch import build_batches
from rlfleet.orchestrator.rollout import (
    Rollout,
    publish_rollout,
    rollout_stats,
    single_turn,
    staleness,
    usable,
)
from rlfleet.store import RunStore, step_dir


@pytest.mark.parametrize(
    ("step", "policy_step", "k", "ok"),
    [
        (0, -1, 0, True),  # step 0 on the initial weights is on-policy
        (5, 4, 0, True),
        (5, 3, 0, False),  # one step stale: only with k >= 1
        (5, 3, 1, True),
        (5, 2, 1, False),
        (5, 2, 2, True),
        (5, 5, 3, False),  # weights from the future (left by a run that went further)
    ],
)
def test_usable_within_k(step, policy_step, k, ok):
    assert usable(step, policy_step, k) is ok
    assert staleness(step, policy_step) == step - 1 - policy_step


def _records(policy_steps):
    return [
        {
            "group": i // 2,
            **single_turn([1, 5, 6], [7, 8], [-1.0, -2.0]),
            "reward": float(i % 2),
            "policy_step": p,
            "env": "repeat",
            "metrics": {},
            "error": None,
            "truncated": False,
            "turns": [],
        }
        for i, p in enumerate(policy_steps)
    ]


def test_batch_records_staleness_and_refuses_beyond_k(tmp_path):
    store = RunStore(tmp_path / "run")
    publish_rollout(store, 4, _records([3, 3, 2, 2]), {"policy_step": 2})
    with pytest.raises(DeterministicError, match="staleness 0..1 outside 0..0"):
        build_batches(store, 4, 8, 0, max_staleness=0)
    manifest = build_batches(store, 4, 8, 0, max_staleness=1)
    assert manifest["policy_steps"] == [2, 3] and manifest["max_staleness"] == 1


def _cfg(tmp_path, k: int) -> RLConfig:
    """As the flow hands it to its tasks: placement's defaults filled (a CPU trainer here)."""
    from rlfleet.config.placement import gpu_defaults

    args = ["--model.path", str(tmp_path / "model"), "--output-dir", str(tmp_path / "run")]
    return gpu_defaults(load(RLConfig, [*args, "--orchestrator.max-async-level", str(k)]), [], [])


class _Taken:
    """The rollout stream's one method the task calls, recording that it was asked."""

    def __init__(self, store):
        self.store, self.asked = store, []

    def take(self, step):
        self.asked.append(step)
        records = _records([2, 2])
        meta = {"step": step, "policy_step": 2, **rollout_stats(records)}
        return Rollout(publish_rollout(self.store, step, records, meta), records)


@pytest.mark.parametrize("k", [0, 1])
def test_rollout_task_reuses_a_published_rollout_only_within_k(tmp_path, tiny_model, k):
    from rlfleet.runs.handles import RunHandles
    from rlfleet.tasks.rl import rollout

    cfg = _cfg(tmp_path, k)
    cfg = cfg.model_copy(update={"model": cfg.model.model_copy(update={"path": str(tiny_model)})})
    store = RunStore(cfg.output_dir)
    publish_rollout(store, 3, _records([1, 1]), {"step": 3, "policy_step": 1})  # staleness 1
    build_batches(store, 3, 8, 0)
    run = RunHandles.for_run(cfg, [], [])  # starts nothing
    run.stream = stream = _Taken(store)
    out = rollout.fn(cfg, 3, run)
    if k == 1:  # within bound: reused, the stream is not asked
        assert out["policy_step"] == 1 and stream.asked == []
        assert store.manifest(step_dir("batches", 3))["policy_steps"] == [1]
        return
    # k = 0: the stale rollout and its batches go, and the step's groups come from the stream
    assert stream.asked == [3] and out["policy_step"] == 2
    assert store.manifest(step_dir("batches", 3))["policy_steps"] == [2]


def test_async_cpu_run_splits_the_cores_between_vllm_and_the_trainer(tmp_path):
    from rlfleet.config.placement import split_cpus

    cfg = split_cpus(_cfg(tmp_path, 1), cpus=[0, 1, 2, 3])
    assert cfg.inference.cpu_threads_bind == "0,1"
    assert cfg.trainer.cpu_affinity == [2, 3] and cfg.trainer.num_threads == 2
    assert split_cpus(_cfg(tmp_path, 0), cpus=[0, 1]) == _cfg(tmp_path, 0), "k=0 never overlaps"
    pinned = _cfg(tmp_path, 1).model_copy(
        update={"inference": cfg.inference.model_copy(update={"cpu_threads_bind": "1"})}
    )
    assert split_cpus(pinned, cpus=[0, 1]) == pinned, "a config that pins itself is left alone"
    assert split_cpus(_cfg(tmp_path, 1), cpus=[0]) == _cfg(tmp_path, 1)
    gpus = _cfg(tmp_path, 1).model_copy(update={"deployment": DeploymentConfig(num_train_gpus=1)})
    assert split_cpus(gpus, cpus=[0, 1]) == gpus
