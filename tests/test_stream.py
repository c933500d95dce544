"""The rollout stream's buffer: what step N may take, what a restarted controller keeps.

The sampling half of the stream (replicas, streamed requests, in-flight loads) runs against real
vLLM in test_e2e/test_sampler/test_faults; here the stream is built without starting its thread,
on groups written to the run store as a controller that died would have left them.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

import pytest

from rlfleet.config.models import OrchestratorConfig
from rlfleet.orchestrator.rollout import single_turn
from rlfleet.orchestrator.stream import GROUPS, Group, RolloutStream
from rlfleet.store import RunStore


def record(version: int, newest: int | None = None, reward: float = 0.5) -> dict[str, Any]:
    """One sampled trajectory, its tokens from weights `version` .. `newest` (a load in flight)."""
    newest = version if newest is None else newest
    runs = [[version, 2]] + ([[newest, 2]] if newest != version else [])
    return single_turn([1, 5, 6], [7, 8, 9, 10], [-1.0] * 4) | {
        "group": 0,
        "env": "repeat",
        "example_uid": "x",
        "reward": reward,
        "metrics": {},
        "error": None,
        "policy_step": version,
        "policy_step_max": newest,
        "truncated": False,
        "turns": [{"versions": runs}],
        "messages": None,
        "completion": "abcd",
    }


def buffer(store: RunStore, uid: str, versions: list[tuple[int, int]], finished_at: float) -> Group:
    g = Group(uid, "repeat", [record(lo, hi, reward=i) for i, (lo, hi) in enumerate(versions)], finished_at)
    store.write_json(f"{GROUPS}/{uid}.json", asdict(g))
    return g


def stream(store: RunStore, next_step: int, k: int, batch_size: int = 1) -> RolloutStream:
    cfg = OrchestratorConfig(batch_size=batch_size, group_size=2, max_async_level=k)
    return RolloutStream(cfg, store, "unused", None, lambda: next_step - 1, 0, 64, next_step)


def buffered(store: RunStore) -> set[str]:
    return {p.rsplit("/", 1)[-1][: -len(".json")] for p in store.fs.glob(store.path(GROUPS, "*.json"))}


@pytest.mark.parametrize(
    ("oldest", "newest", "step", "k", "fits"),
    [
        (4, 4, 5, 0, True),  # on-policy
        (3, 4, 5, 0, False),  # a load in flight: one token from weights 3 is off-policy at k=0
        (3, 4, 5, 1, True),
        (2, 3, 5, 1, False),  # too stale at k=1
        (5, 5, 5, 2, False),  # weights newer than the step's own: not trainable at step 5
    ],
)
def test_a_group_fits_a_step_only_if_every_token_is_within_k(oldest, newest, step, k, fits):
    g = Group("u", "repeat", [record(oldest), record(oldest, newest)])
    assert g.fits(step, k) is fits


def test_a_restarted_controller_keeps_the_buffered_groups_within_bound_and_takes_them_first(tmp_path):
    store = RunStore(tmp_path)
    # what the killed controller left: step 1 published (it took "0-a"); four groups still buffered
    buffer(store, "0-a", [(0, 0), (0, 0)], 1.0)
    store.publish_dir(store.staging_dir("rollouts/step_1"), "rollouts/step_1", {"group_uids": ["0-a"]})
    buffer(store, "1-stale", [(-1, -1), (0, 0)], 2.0)  # weights -1: within bound of step 1, not step 2
    buffer(store, "1-fresh", [(1, 1), (0, 1)], 3.0)  # weights 0 and 1 (a load in flight)
    buffer(store, "2-late", [(1, 1), (1, 1)], 4.0)  # finished after "1-fresh"
    buffer(store, "2-ahead", [(2, 2), (2, 2)], 5.0)  # weights 2: a resume at step 2 recomputes them

    s = stream(store, next_step=2, k=1)
    assert buffered(store) == {"1-stale", "1-fresh", "2-late"}  # the taken one and the recomputed one go

    manifest = s.take(2)
    assert manifest["group_uids"] == ["1-fresh"]  # the first to finish among those that fit
    assert manifest["policy_steps"] == [0, 1]  # both versions of the group that spanned a load
    assert manifest["num_samples"] == 2 and s.counts.dropped_stale == 1
    assert buffered(store) == {"2-late"}
    assert s.take(3)["group_uids"] == ["2-late"]  # reused by the next step as well
    assert buffered(store) == set()


def test_each_env_gets_its_share_of_a_step(tmp_path):
    store = RunStore(tmp_path)
    cfg = OrchestratorConfig(
        batch_size=3,
        group_size=2,
        env=[{"type": "repeat", "name": "a", "weight": 2}, {"type": "repeat", "name": "b", "weight": 1}],
    )
    for i, env in enumerate(["a", "b", "b", "a", "a"]):
        g = Group(f"0-{env}-{i}", env, [record(0) | {"env": env}, record(0) | {"env": env}], float(i))
        store.write_json(f"{GROUPS}/{g.uid}.json", asdict(g))
    s = RolloutStream(cfg, store, "unused", None, lambda: 0, 0, 64, 1)
    assert s.take(1)["group_uids"] == ["0-a-0", "0-b-1", "0-a-3"]
    assert buffered(store) == {"0-b-2", "0-a-4"}
