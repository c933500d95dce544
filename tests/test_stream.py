"""The rollout stream's buffer: what step N may take, what a restarted controller keeps, and how
many groups the stream wants. The stream is built without starting its thread, on groups written
to the run store as a controller that died would have left them (its thread: test_stream_thread.py).
"""

from __future__ import annotations

from dataclasses import asdict

import pytest

from rlfleet.config.rollouts import OrchestratorConfig
from rlfleet.orchestrator.buffer import Group
from rlfleet.orchestrator.stream import RolloutStream
from rlfleet.store import RunStore, layout
from tests.helpers import buffered_groups, stream_record


def buffer(store: RunStore, uid: str, versions: list[tuple[int, int]], finished_at: float) -> Group:
    g = Group(
        uid, "repeat", [stream_record(lo, hi, reward=i) for i, (lo, hi) in enumerate(versions)], finished_at
    )
    store.write_json(layout.buffered_group(uid), asdict(g))
    return g


def stream(
    store: RunStore, next_step: int, k: int, batch_size: int = 1, m: int | None = None
) -> RolloutStream:
    cfg = OrchestratorConfig(batch_size=batch_size, group_size=2, max_async_level=k, max_off_policy_steps=m)
    return RolloutStream(cfg, store, "unused", None, lambda: next_step - 1, 0, 64, next_step)


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
    g = Group("u", "repeat", [stream_record(oldest), stream_record(oldest, newest)])
    assert g.fits(step, k) is fits


@pytest.mark.parametrize(("m", "taken"), [(None, True), (1, False), (2, True)])
def test_max_off_policy_steps_keeps_a_group_that_spanned_more_loads_than_k(tmp_path, m, taken):
    """k = 1: a long sample that began on weights 0 and finished on 2 spans two loads. Step 3
    takes it only if m >= 2 (unset: 3); at m = k it is dropped as too stale and the fresh one trains."""
    store = RunStore(tmp_path)
    buffer(store, "long", [(0, 2), (2, 2)], 1.0)
    buffer(store, "fresh", [(2, 2), (2, 2)], 2.0)
    s = stream(store, next_step=3, k=1, m=m)
    manifest = s.take(3).manifest
    assert manifest["group_uids"] == (["long"] if taken else ["fresh"])
    assert s.buffer.counts.dropped_stale == (0 if taken else 1)
    assert manifest["policy_step"] == (0 if taken else 2)


def test_max_off_policy_steps_below_k_is_refused():
    with pytest.raises(ValueError, match="max_off_policy_steps=0 is below max_async_level=1"):
        OrchestratorConfig(max_async_level=1, max_off_policy_steps=0)
    # unset: on-policy stays on-policy; with k >= 1 the bound is at least 3 versions
    assert [OrchestratorConfig(max_async_level=k).max_staleness for k in (0, 1, 2, 5)] == [0, 3, 3, 5]
    assert OrchestratorConfig(max_async_level=2, max_off_policy_steps=2).max_staleness == 2
    # the flow's log says which bound a run got, and why when the default chose it
    assert (
        "at most 3 weight loads old (max_off_policy_steps unset"
        in OrchestratorConfig(max_async_level=1).describe_async()
    )
    assert (
        OrchestratorConfig(max_async_level=1, max_off_policy_steps=1)
        .describe_async()
        .endswith("1 weight load old")
    )
    assert OrchestratorConfig(max_async_level=1, max_off_policy_steps=4).max_staleness == 4


def test_a_restarted_controller_keeps_the_buffered_groups_within_bound_and_takes_them_first(tmp_path):
    store = RunStore(tmp_path)
    # what the killed controller left: step 1 published (it took "0-a"); four groups still buffered
    buffer(store, "0-a", [(0, 0), (0, 0)], 1.0)
    store.publish_dir(store.staging_dir("rollouts/step_1"), "rollouts/step_1", {"group_uids": ["0-a"]})
    buffer(store, "1-stale", [(-1, -1), (0, 0)], 2.0)  # weights -1: within bound of step 1, not step 2
    buffer(store, "1-fresh", [(1, 1), (0, 1)], 3.0)  # weights 0 and 1 (a load in flight)
    buffer(store, "2-late", [(1, 1), (1, 1)], 4.0)  # finished after "1-fresh"
    buffer(store, "2-ahead", [(2, 2), (2, 2)], 5.0)  # weights 2: a resume at step 2 recomputes them

    s = stream(store, next_step=2, k=1, m=1)
    assert buffered_groups(store) == {
        "1-stale",
        "1-fresh",
        "2-late",
    }  # the taken one and the recomputed one go

    manifest = s.take(2).manifest
    assert manifest["group_uids"] == ["1-fresh"]  # the first to finish among those that fit
    assert manifest["policy_steps"] == [0, 1]  # both versions of the group that spanned a load
    assert manifest["num_samples"] == 2 and s.buffer.counts.dropped_stale == 1
    assert buffered_groups(store) == {"2-late"}
    assert s.take(3).manifest["group_uids"] == ["2-late"]  # reused by the next step as well
    assert buffered_groups(store) == set()


def test_each_env_gets_its_share_of_a_step(tmp_path):
    store = RunStore(tmp_path)
    cfg = OrchestratorConfig(
        batch_size=3,
        group_size=2,
        env=[{"type": "repeat", "name": "a", "weight": 2}, {"type": "repeat", "name": "b", "weight": 1}],
    )
    for i, env in enumerate(["a", "b", "b", "a", "a"]):
        g = Group(
            f"0-{env}-{i}", env, [stream_record(0) | {"env": env}, stream_record(0) | {"env": env}], float(i)
        )
        store.write_json(layout.buffered_group(g.uid), asdict(g))
    s = RolloutStream(cfg, store, "unused", None, lambda: 0, 0, 64, 1)
    assert s.take(1).manifest["group_uids"] == ["0-a-0", "0-b-1", "0-a-3"]
    assert buffered_groups(store) == {"0-b-2", "0-a-4"}


@pytest.mark.parametrize(
    ("served", "k", "max_steps", "groups"),
    [(-1, 0, 3, 2), (1, 0, 3, 2), (2, 0, 3, 0), (1, 1, 3, 2), (1, 1, None, 4)],
)
def test_the_stream_samples_no_step_past_the_runs_last(tmp_path, served, k, max_steps, groups):
    """Weights `served` may train steps up to served + 1 + k; none past max_steps - 1 (the last
    broadcast of a run started a whole step's sampling nobody took)."""
    cfg = OrchestratorConfig(batch_size=2, group_size=2, max_async_level=k)
    s = RolloutStream(cfg, RunStore(tmp_path), "unused", None, lambda: served, 0, 64, served + 1, max_steps)
    assert len(s._wanted()) == groups
