"""The rollout stream's books (orchestrator/buffer.py), driven directly: no thread, no event loop,
no vLLM. Groups start, end and are taken in the order each test writes; restore reads what a
killed controller left in the run store."""

from __future__ import annotations

from rlfleet.config.rollouts import OrchestratorConfig
from rlfleet.errors import TransientError
from rlfleet.orchestrator.buffer import Group, GroupBuffer
from rlfleet.store import RunStore, layout
from tests.helpers import stream_record


def books(store: RunStore, next_step: int, k: int = 0, batch_size: int = 2, **cfg) -> GroupBuffer:
    orch = OrchestratorConfig(batch_size=batch_size, group_size=2, max_async_level=k, **cfg)
    return GroupBuffer(orch, store, {"repeat": batch_size}, next_step)


def group(uid: str, version: int, finished_at: float, rewards: tuple[float, float] = (0.0, 1.0)) -> Group:
    return Group(uid, "repeat", [stream_record(version, reward=r) for r in rewards], finished_at)


def finish(b: GroupBuffer, g: Group) -> bool:
    """What the sampling loop does for one group: start it, write its file, end it."""
    b.started(g.env, refill=False)
    b.write(g)
    return b.ended(g.env, g, tokens=8)


def on_disk(store: RunStore) -> set[str]:
    return {layout.group_uid(p) for p in store.fs.glob(store.path(layout.buffered_group("*")))}


def test_demand_counts_what_is_in_flight_and_finished(tmp_path):
    b = books(RunStore(tmp_path), next_step=0, k=1)
    assert len(b.wanted(newest=1)) == 4  # steps 0 and 1, two groups each
    b.started("repeat", refill=False)
    b.started("repeat", refill=False)
    assert len(b.wanted(newest=1)) == 2
    b.ended("repeat", group("0-repeat-0", -1, 1.0))
    b.ended("repeat", None)  # cancelled: its place is wanted again
    assert b.in_flight == {"repeat": 0} and len(b.wanted(newest=1)) == 3
    assert b.counts.started == 2 and b.counts.finished == 1


def test_step_n_takes_groups_that_fit_first_finished_among_equals_and_drops_the_stale(tmp_path):
    store = RunStore(tmp_path)
    b = books(store, next_step=2, k=0)
    for g in [group("a", 0, 1.0), group("b", 1, 2.0), group("c", 1, 3.0), group("d", 1, 4.0)]:
        finish(b, g)
    taken = b.take(2)
    assert taken is not None
    assert [g.uid for g in taken.groups] == ["b", "c"]  # on-policy for step 2: weights 1, first finished
    assert taken.buffered == 1 and b.counts.dropped_stale == 1  # "a" (weights 0) is too stale
    assert b.taken == 3
    b.discard(taken.groups)
    assert on_disk(store) == {"d"}


def test_a_group_closest_to_going_stale_is_taken_before_fresher_ones_that_finished_first(tmp_path):
    b = books(RunStore(tmp_path), next_step=2, k=1)
    # step 2 may train weights 0 and 1; the long group started on weights 0 and finished last
    for g in [group("short-1", 1, 1.0), group("short-2", 1, 2.0), group("long", 0, 3.0)]:
        finish(b, g)
    assert [g.uid for g in b.take(2).groups] == ["short-1", "long"]  # in the order they finished
    finish(b, group("next", 2, 4.0))
    # step 3 may train weights 1 and 2 only: the long group would have been too stale for it
    assert [g.uid for g in b.take(3).groups] == ["short-2", "next"]
    assert b.counts.dropped_stale == 0


def test_a_step_waits_for_every_group_of_its_share(tmp_path):
    b = books(RunStore(tmp_path), next_step=0)
    finish(b, group("0-repeat-0", -1, 1.0))
    assert b.take(0) is None and [g.uid for g in b.ready] == ["0-repeat-0"]
    finish(b, group("0-repeat-1", -1, 2.0))
    assert [g.uid for g in b.take(0).groups] == ["0-repeat-0", "0-repeat-1"]


def test_restore_after_a_restart_keeps_what_the_next_step_may_use(tmp_path):
    store = RunStore(tmp_path)
    first = books(store, next_step=1, k=1, batch_size=1)
    for g in [group("0-taken", 0, 1.0), group("1-kept", 0, 2.0), group("2-ahead", 2, 3.0)]:
        finish(first, g)
    taken = first.take(1)
    assert [g.uid for g in taken.groups] == ["0-taken"]
    # killed after publishing step 1, before removing its group's file
    store.publish_dir(store.staging_dir("rollouts/step_1"), "rollouts/step_1", {"group_uids": ["0-taken"]})

    again = books(store, next_step=2, k=1, batch_size=1)  # weights 1 are recomputed by the resume
    assert [g.uid for g in again.ready] == ["1-kept"] and again.in_flight == {"repeat": 0}
    assert on_disk(store) == {"1-kept"}
    assert [g.uid for g in again.take(2).groups] == ["1-kept"]


def test_dynamic_sampling_holds_flat_groups_and_refills_them(tmp_path):
    store = RunStore(tmp_path)
    b = books(store, next_step=0, batch_size=1, shaping={"dynamic_sampling": True, "max_refill": 1})
    assert finish(b, group("0-repeat-0", -1, 1.0, rewards=(0.5, 0.5))) is True  # held: resample now
    assert b.held and not b.ready and b.wanted(newest=0) == [("repeat", True)]
    b.started("repeat", refill=True)
    assert b.take(0) is None  # the refill is in flight
    b.ended("repeat", None)  # cancelled; max_refill spent, nothing in flight: the held one fills
    taken = b.take(0)
    assert [g.uid for g in taken.groups] == ["0-repeat-0"] and taken.held == 1
    assert (taken.dropped, taken.refilled) == (1, 1)
    assert books(store, next_step=0, batch_size=1, shaping={"dynamic_sampling": True}).held  # restored held


def test_failures_fail_the_step_when_not_transient_or_a_whole_step_in_a_row(tmp_path):
    b = books(RunStore(tmp_path), next_step=0, batch_size=2)
    for _ in range(2):
        b.started("repeat", refill=False)
    assert b.ended("repeat", None, TransientError("replica gone")) is True
    assert not b.fails_the_step(TransientError("replica gone"))
    b.ended("repeat", None, TransientError("replica gone"))
    assert b.fails_the_step(TransientError("replica gone"))  # batch_size failures in a row
    assert b.fails_the_step(ValueError("a bug"))
    assert b.counts.failed == 2 and b.in_flight == {"repeat": 0}
