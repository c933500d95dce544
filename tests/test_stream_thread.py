"""The rollout stream's thread on a fake `rollout_group` whose rewards and lengths each test
scripts: batch shaping (which groups enter a step, how many prompts replace those that do not,
overlong samples), a dead sampling thread, a slow tokenizer load, and groups no step can take.
The sampling half itself (replicas, streamed requests, in-flight loads) runs against real vLLM in
test_e2e/test_sampler/test_faults."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from dataclasses import asdict
from typing import Any

import pytest

from rlfleet.config.rollouts import OrchestratorConfig
from rlfleet.orchestrator.buffer import Group
from rlfleet.orchestrator.rollout import read_rollout
from rlfleet.orchestrator.shaping import cut, overlong_penalty, sampled_len
from rlfleet.orchestrator.stream import RolloutStream
from rlfleet.store import RunStore, layout
from tests.helpers import buffered_groups, stream_record


# -- batch shaping: dynamic sampling and overlong samples, the stream's thread on a fake sampler --
class FakeSampling:
    """The stream's sampling half without vLLM: `script(env, example_uid, i)` gives sample i's
    (reward, sampled tokens, finish_reason); every token comes from weights `version`."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, script: Any):
        from rlfleet.orchestrator import stream as module

        class NoSampler:
            def __init__(self, *args: Any, **kwargs: Any):
                pass

            async def aclose(self) -> None:
                pass

        monkeypatch.setattr(module, "load_tokenizer", lambda path: None)
        monkeypatch.setattr(module, "Sampler", NoSampler)
        monkeypatch.setattr(module, "rollout_group", self.rollout_group)
        self.script, self.version, self.started = script, -1, []

    async def rollout_group(
        self, env: Any, example: Any, params: Any, tok: Any, sampler: Any, first: Any = None
    ) -> list:
        from rlfleet.orchestrator.envs import Trajectory

        self.started.append(f"{env.name}/{example.uid}")
        await asyncio.sleep(0)
        out = []
        for i in range(params.n):
            reward, n, finish = self.script(env.name, example.uid, i)
            t = Trajectory(example, [1, 2, 3], 3, max_tokens=params.max_tokens)
            t.extend(list(range(10, 10 + n)), [-1.0] * n)
            turn = {"text": "x" * n, "finish_reason": finish, "start": 3, "end": 3 + n}
            t.turns.append(turn | {"versions": [[self.version, n]]})
            t.reward = reward
            out.append(t)
        return out


THREADED = pytest.mark.timeout(60)  # a take() that never completes fails instead of hanging


@contextlib.contextmanager
def running(store: RunStore, fake: FakeSampling, **cfg: Any):
    s = RolloutStream(OrchestratorConfig(**cfg), store, "unused", None, lambda: fake.version, 0, 64, 0)
    s.start()
    try:
        yield s
    finally:
        s.stop()


def varied(env: str, uid: str, i: int) -> tuple[float, int, str]:
    return float(i), 4, "stop"


@THREADED
def test_dynamic_sampling_drops_flat_groups_and_refills_each_env_with_its_own_prompts(tmp_path, monkeypatch):
    store = RunStore(tmp_path)
    flat = {"a/train-0-0", "b/train-1-0"}  # one group of each env carries no signal

    def script(env: str, uid: str, i: int) -> tuple[float, int, str]:
        return (0.5, 4, "stop") if f"{env}/{uid}" in flat else varied(env, uid, i)

    fake = FakeSampling(monkeypatch, script)
    envs = [{"type": "repeat", "name": "a", "weight": 2}, {"type": "repeat", "name": "b", "weight": 1}]
    shaping = {"dynamic_sampling": True, "max_refill": 8}
    with running(store, fake, batch_size=3, group_size=2, env=envs, shaping=shaping) as s:
        manifest = s.take(0).manifest
        # a's flat group was replaced by a's next prompt (from chunk 1); b's own share was not touched
        assert fake.started == ["a/train-0-0", "a/train-0-1", "b/train-0-0", "a/train-1-0"]
        assert sorted(manifest["group_uids"]) == ["0-a-1", "0-b-0", "1-a-0"]
        assert manifest["shaping"] == {"dropped_zero_variance": 1, "refilled": 1, "zero_variance_groups": 0}
        assert manifest["stream"]["dropped_zero_variance"] == 1 and manifest["stream"]["refilled"] == 1
        assert buffered_groups(store) == set()  # the held group is too stale for step 1 (k = 0): gone
        fake.version = 0  # weights 0 served: step 1's groups start, b's from the queued chunk 1
        s.notify()
        manifest = s.take(1).manifest
    assert fake.started[4:] == ["a/train-1-1", "a/train-2-0", "b/train-1-0", "b/train-2-0"]
    assert sorted(manifest["group_uids"]) == ["1-a-1", "2-a-0", "2-b-0"]  # b's flat 1-b-0 was replaced
    assert manifest["shaping"]["dropped_zero_variance"] == 1 and manifest["shaping"]["refilled"] == 1
    records = read_rollout(store, 1)
    assert [sum(r["env"] == e for r in records) for e in ("a", "b")] == [4, 2]  # 2 x group_size, 1 x


@THREADED
def test_a_step_is_filled_with_flat_groups_once_its_refills_are_spent(tmp_path, monkeypatch):
    store = RunStore(tmp_path)
    fake = FakeSampling(monkeypatch, lambda env, uid, i: (0.0, 4, "stop"))  # nothing is ever learned
    shaping = {"dynamic_sampling": True, "max_refill": 2}
    with running(store, fake, batch_size=2, group_size=2, shaping=shaping) as s:
        manifest = s.take(0).manifest
    assert len(fake.started) == 4  # batch_size + max_refill, then the step took what it had
    assert manifest["group_uids"] == ["0-repeat-0", "0-repeat-1"]  # the oldest held ones
    assert manifest["shaping"] == {"dropped_zero_variance": 4, "refilled": 2, "zero_variance_groups": 2}
    assert store.manifest("rollouts/step_0")["shaping"]["refilled"] == 2
    assert buffered_groups(store) == set()


def test_a_restarted_controller_holds_flat_groups_again(tmp_path):
    store = RunStore(tmp_path)
    flat = Group("0-flat", "repeat", [stream_record(0, reward=0.5), stream_record(0, reward=0.5)], 1.0)
    fine = Group("0-fine", "repeat", [stream_record(0, reward=0.0), stream_record(0, reward=1.0)], 2.0)
    for g in (flat, fine):
        store.write_json(layout.buffered_group(g.uid), asdict(g))
    shaping = {"dynamic_sampling": True, "max_refill": 0}
    cfg = OrchestratorConfig(batch_size=1, group_size=2, max_async_level=1, shaping=shaping)
    s = RolloutStream(cfg, store, "unused", None, lambda: 0, 0, 64, 1)
    assert s.take(1).manifest["group_uids"] == ["0-fine"]  # the older flat one was held, not buffered
    assert buffered_groups(store) == {"0-flat"}  # still within k = 1 of step 2
    manifest = s.take(2).manifest  # max_refill 0: held groups fill a step at once
    assert manifest["group_uids"] == ["0-flat"] and manifest["shaping"]["zero_variance_groups"] == 1


@THREADED
def test_shaping_is_off_by_default(tmp_path, monkeypatch):
    store = RunStore(tmp_path)
    fake = FakeSampling(monkeypatch, lambda env, uid, i: (0.0, 16, "length"))
    with running(store, fake, batch_size=2, group_size=2) as s:
        manifest = s.take(0).manifest
    assert manifest["group_uids"] == ["0-repeat-0", "0-repeat-1"] and len(fake.started) == 2
    assert "shaping" not in manifest and manifest["stream"]["dropped_zero_variance"] == 0
    records = read_rollout(store, 0)
    assert all(sum(r["loss_mask"]) == 16 and "overlong" not in r for r in records)


# -- overlong samples --
@pytest.mark.parametrize(
    ("length", "expected"),
    [  # L_max = 16, L_cache = 4: 0 up to 12, then (12 - len) / 4, -1 at 16 and beyond (DAPO eq. 13)
        (0, 0.0),
        (12, 0.0),
        (13, -0.25),
        (14, -0.5),
        (15, -0.75),
        (16, -1.0),
        (20, -1.0),
    ],
)
def test_soft_overlong_punishment_is_dapo_eq_13(length, expected):
    assert overlong_penalty(length, max_tokens=16, buffer=4) == pytest.approx(expected)


@THREADED
def test_overlong_mask_zeroes_the_loss_mask_of_cut_samples_only(tmp_path, monkeypatch):
    store = RunStore(tmp_path)
    # samples 0 and 1 ran into max_tokens (16); 2 and 3 stopped on their own
    fake = FakeSampling(
        monkeypatch, lambda env, uid, i: (float(i), 16 if i < 2 else 5 + i, "length" if i < 2 else "stop")
    )
    with running(store, fake, batch_size=1, group_size=4, shaping={"overlong": "mask"}) as s:
        manifest = s.take(0).manifest
    records = read_rollout(store, 0)
    assert [sum(r["loss_mask"]) for r in records] == [0, 0, 7, 8]
    assert [r["overlong"] for r in records] == [True, True, False, False]
    assert [r["reward"] for r in records] == [0.0, 1.0, 2.0, 3.0]  # rewards and advantages unchanged
    assert manifest["shaping"] == {"overlong": 2} and manifest["stream"]["generated_tokens"] == 47


@THREADED
def test_soft_overlong_shapes_rewards_before_dynamic_sampling_judges_the_group(tmp_path, monkeypatch):
    """Every sample scores 1.0; lengths [10, 14, 16, 12] with L_max 16, L_cache 4 give penalties
    [0, -0.5, -1, 0] by eq. 13, which tell the group's samples apart: it is kept. The same rewards
    at one length stay flat: that group is dropped and refilled."""
    store = RunStore(tmp_path)
    lengths = {"train-0-0": [10, 10, 10, 10], "train-0-1": [10, 14, 16, 12], "train-1-0": [10, 14, 16, 12]}

    def script(env: str, uid: str, i: int) -> tuple[float, int, str]:
        n = lengths[uid][i]
        return 1.0, n, "length" if n == 16 else "stop"

    shaping = {"dynamic_sampling": True, "overlong": "soft", "overlong_buffer": 4}
    with running(store, FakeSampling(monkeypatch, script), batch_size=2, group_size=4, shaping=shaping) as s:
        manifest = s.take(0).manifest
    assert sorted(manifest["group_uids"]) == ["0-repeat-1", "1-repeat-0"]
    records = read_rollout(store, 0)
    assert [r["reward"] for r in records] == [1.0, 0.5, 0.0, 1.0] * 2
    assert [r["overlong_penalty"] for r in records[:4]] == [0.0, -0.5, -1.0, 0.0]
    assert manifest["shaping"] == {
        "dropped_zero_variance": 1,
        "refilled": 1,
        "zero_variance_groups": 0,
        "overlong": 2,
        "overlong_penalty_mean": -0.375,
    }


def test_a_samples_length_is_its_longest_model_turn_and_a_truncated_conversation_is_cut():
    r = stream_record(0) | {
        "turns": [{"start": 3, "end": 8, "finish_reason": "stop"}, {"start": 12, "end": 21}]
    }
    assert sampled_len(r) == 9 and not cut(r)
    assert cut(r | {"truncated": True})
    assert cut(r | {"turns": [{"start": 3, "end": 19, "finish_reason": "length"}]})


@THREADED
def test_a_dead_sampling_thread_fails_one_take_and_the_retry_samples_again(tmp_path, monkeypatch):
    """What the rollout task's retry relies on: the error that killed the sampling thread is
    raised once, and the next take() has a new thread sample the step."""
    from rlfleet.orchestrator import stream as module

    fake = FakeSampling(monkeypatch, varied)
    failures = [ImportError("cannot import name 'AutoTokenizer'")]

    def load_tokenizer(path: str) -> None:  # the thread's first act
        if failures:
            raise failures.pop()

    monkeypatch.setattr(module, "load_tokenizer", load_tokenizer)
    with running(RunStore(tmp_path), fake, batch_size=2, group_size=2) as s:
        with pytest.raises(ImportError, match="AutoTokenizer"):
            s.take(0)
        manifest = s.take(0).manifest
    assert len(manifest["group_uids"]) == 2 and manifest["stream"]["finished"] == 2


@THREADED
def test_the_stream_loading_its_tokenizer_is_starting_not_stalled(tmp_path, monkeypatch):
    """transformers' imports took over 20 s on a loaded 2-core box (the chaos soak): meanwhile the
    stream is starting, as a vLLM replica is, and the stall watchdog waits (`RunHandles.starting`)."""
    from rlfleet.orchestrator import stream as module

    fake = FakeSampling(monkeypatch, varied)
    loading, loaded = threading.Event(), threading.Event()

    def load_tokenizer(path: str) -> None:
        loading.set()
        loaded.wait(30)

    monkeypatch.setattr(module, "load_tokenizer", load_tokenizer)
    with running(RunStore(tmp_path), fake, batch_size=2, group_size=2) as s:
        assert loading.wait(30)
        assert s.progress.starting
        loaded.set()
        s.take(0)
        assert not s.progress.starting


@THREADED
def test_a_group_in_flight_that_no_step_left_can_take_is_aborted(tmp_path, monkeypatch):
    """k = m = 1: a group started on the initial weights (-1) can train steps 0 and 1, or step 2
    if a load came before its first token; once step 2 is taken, it is cancelled, not sampled on."""
    import threading

    from rlfleet.orchestrator import stream as module

    fake = FakeSampling(monkeypatch, varied)
    group, calls, aborted = fake.rollout_group, [], threading.Event()

    async def rollout_group(*args: Any) -> list:
        calls.append(args[1].uid)
        if len(calls) == 1:  # the first group never finishes on its own
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                aborted.set()
                raise
        return await group(*args)

    monkeypatch.setattr(module, "rollout_group", rollout_group)
    with running(
        RunStore(tmp_path), fake, batch_size=1, group_size=2, max_async_level=1, max_off_policy_steps=1
    ) as s:
        s.take(0)
        fake.version = 0  # weights 0 served: the group for step 2 starts
        s.notify()
        s.take(1)
        assert not aborted.is_set()  # it could still train step 2
        fake.version = 1
        s.notify()
        s.take(2)
        assert aborted.wait(10)
    assert s.buffer.counts.aborted_stale == 1 and s.buffer.counts.dropped_stale == 0


@THREADED
def test_a_group_aborted_while_its_file_is_written_leaves_nothing_counted_in_flight(tmp_path, monkeypatch):
    """The abort can land after sampling, while the group's file is written (a thread): the group
    still leaves the in-flight count, or the stream would count it as sampling forever."""
    import threading

    from rlfleet.orchestrator import stream as module

    fake = FakeSampling(monkeypatch, varied)
    aborted = threading.Event()
    abort = module.RolloutStream._abort_hopeless

    def watched(self: RolloutStream, tasks: dict) -> None:
        abort(self, tasks)
        if self.buffer.counts.aborted_stale:
            aborted.set()

    monkeypatch.setattr(module.RolloutStream, "_abort_hopeless", watched)

    class SlowStore(RunStore):
        def write_bytes(self, rel: str, data: bytes) -> None:
            if rel.endswith("/0-repeat-0.json"):  # the first group's file: written once the stream stops
                s._stop.wait()
            super().write_bytes(rel, data)

    with running(
        SlowStore(tmp_path), fake, batch_size=1, group_size=2, max_async_level=1, max_off_policy_steps=1
    ) as s:
        s.take(0)
        fake.version = 0
        s.notify()
        s.take(1)
        fake.version = 1
        s.notify()
        s.take(2)
        assert aborted.wait(10)  # cancelled while its write still blocks
    assert s.buffer.counts.aborted_stale == 1
    assert sum(s.buffer.in_flight.values()) == 0  # every group in flight at the stop was cancelled
