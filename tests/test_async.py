"""Async off-policy bookkeeping, without vLLM: the staleness rule, batches that record and enforce
it, and the rollout task's reuse of a published rollout (valid iff its weights are within k)."""

from __future__ import annotations

import pytest

from rlfleet.config.deployment import DeploymentConfig
from rlfleet.config.loader import load
from rlfleet.config.models import RLConfig
from rlfleet.errors import DeterministicError
from rlfleet.orchestrator.rollout import (
    Rollout,
    publish_rollout,
    rollout_stats,
    single_turn,
    staleness,
    usable,
)
from rlfleet.orchestrator.step_batches import BatchSpec, publish_batches
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
    records = _records([3, 3, 2, 2])
    with pytest.raises(DeterministicError, match="staleness 0..1 outside 0..0"):
        publish_batches(store, 4, records, BatchSpec(8, max_staleness=0))
    manifest = publish_batches(store, 4, records, BatchSpec(8, max_staleness=1))
    assert manifest["policy_steps"] == [2, 3] and manifest["max_staleness"] == 1


def _cfg(tmp_path, k: int) -> RLConfig:
    """As the flow hands it to its tasks: placement's defaults filled (a CPU trainer here)."""
    from rlfleet.config.gpu_defaults import gpu_defaults

    args = ["--model.path", str(tmp_path / "model"), "--output-dir", str(tmp_path / "run")]
    return gpu_defaults(load(RLConfig, [*args, "--orchestrator.max-async-level", str(k)]), [], [])[0]


class _Taken:
    """The rollout stream's one method the task calls, recording that it was asked."""

    def __init__(self, store):
        self.store, self.asked = store, []

    def take(self, step):
        self.asked.append(step)
        records = _records([2, 2])
        meta = {"step": step, "policy_step": 2, **rollout_stats(records)}
        return Rollout(publish_rollout(self.store, step, records, meta), records)


def test_a_taken_rollout_is_batched_from_memory_and_read_back_only_when_reused(tmp_path, monkeypatch):
    from rlfleet.orchestrator import step_batches as module

    store, read = RunStore(tmp_path), []
    real = module.read_rollout
    monkeypatch.setattr(module, "read_rollout", lambda store, step: read.append(step) or real(store, step))
    stream, spec = _Taken(store), BatchSpec(8, max_staleness=1)
    batches_then = []  # whether batches/step_3 existed when the pool was asked to free the GPU

    def free_gpu() -> float:
        batches_then.append(store.manifest(step_dir("batches", 3)) is not None)
        return 0.0

    taken = module.step_batches(stream, 3, spec, free_gpu)
    assert not taken.reused and stream.asked == [3] and read == []
    store.remove(step_dir("batches", 3))  # an attempt that stopped before its batches; a retry
    again = module.step_batches(stream, 3, spec, free_gpu)
    assert again.reused and stream.asked == [3] and read == [3]
    assert again.batches["policy_steps"] == [2] and batches_then == [False, False]


@pytest.mark.parametrize("k", [0, 1])
def test_rollout_task_reuses_a_published_rollout_only_within_k(tmp_path, tiny_model, k):
    from rlfleet.runs.handles import RunHandles
    from rlfleet.tasks.rl import rollout

    cfg = _cfg(tmp_path, k)
    cfg = cfg.model_copy(update={"model": cfg.model.model_copy(update={"path": str(tiny_model)})})
    store = RunStore(cfg.output_dir)
    publish_rollout(store, 3, _records([1, 1]), {"step": 3, "policy_step": 1})  # staleness 1
    publish_batches(store, 3, _records([1, 1]), BatchSpec(8, max_staleness=1))
    run = RunHandles.for_run(cfg)  # starts nothing
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
    from rlfleet.config.gpu_defaults import split_cpus

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
