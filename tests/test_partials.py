"""The log of the samples in flight (orchestrator/partials.py) and what a new life makes of it,
without vLLM: the log is written as a killed controller would have left it, and the sampler's
request is a fake that streams known tokens, so that what a continued sample was sent is visible.
The real kill of `rlfleet rl` mid-generation is tests/test_resume_inflight.py."""

from __future__ import annotations

import asyncio
import json
from dataclasses import asdict

import pytest

from rlfleet.config.rollouts import OrchestratorConfig
from rlfleet.orchestrator.buffer import Group
from rlfleet.orchestrator.partials import PartialLog, logs, read_partials, resume
from rlfleet.orchestrator.rollout import read_rollout
from rlfleet.orchestrator.sampler import FixedReplicas, Sample, Sampler
from rlfleet.orchestrator.stream import RolloutStream
from rlfleet.store import RunStore, layout
from tests.helpers import stream_record


def sample(ids: list[int], version: int, finish: str = "") -> Sample:
    return Sample(list(ids), [-1.0] * len(ids), [version] * len(ids), finish)


def left_in_flight(store: RunStore, groups: dict[str, list[Sample]], served: int = -1) -> None:
    """What a controller killed mid-step left: its log, flushed once, each group's samples as given."""

    async def write() -> None:
        log = PartialLog(store, 0, flush_s=1.0)
        for uid, samples in groups.items():
            log.track({"group": uid, "env": "repeat", "n": len(samples), "served": served}, samples)
        await log.flush()

    asyncio.run(write())


def test_the_log_keeps_what_each_sample_streamed_and_forgets_ended_groups(tmp_path):
    store = RunStore(tmp_path)
    a, b = Sample(), Sample()

    async def stream() -> PartialLog:
        log = PartialLog(store, 0, flush_s=1.0)
        log.track({"group": "0-repeat-0", "env": "repeat", "n": 2, "served": 3}, [a, b])
        log.track({"group": "0-repeat-1", "env": "repeat", "n": 1, "served": 3}, [Sample()])
        a.completion_ids, a.logprobs, a.versions = [5, 6], [-0.5, -0.6], [3, 3]
        await log.flush()
        a.completion_ids += [7]
        a.logprobs += [-0.7]
        a.versions += [4]  # a load in flight
        b.completion_ids, b.logprobs, b.versions, b.finish_reason = [9], [-0.9], [3], "stop"
        log.end("0-repeat-1", "finished")
        await log.flush()
        await log.flush()  # nothing new: nothing written
        return log

    log = asyncio.run(stream())
    lines = store.read_bytes(log.rel).decode().splitlines()
    assert len(lines) == 6  # 2 starts, a's first tokens, the end, a's next token, b's (finished)
    assert json.loads(lines[4]) == {
        "sample": "0-repeat-0/0",
        "at": 2,
        "ids": [7],
        "logprobs": [-0.7],
        "versions": [[4, 1]],
    }
    store.append_bytes(log.rel, b'{"sample": "0-repeat-0/0", "at": 3, "ids": [8')  # a torn last line
    (p,) = read_partials(store).values()
    assert p.group == "0-repeat-0" and p.served == 3 and p.oldest == 3
    assert [s.completion_ids for s in p.samples] == [[5, 6, 7], [9]]
    assert [s.versions for s in p.samples] == [[3, 3, 4], [3]]
    assert [s.finish_reason for s in p.samples] == ["", "stop"]


def test_a_new_life_keeps_what_may_still_train_and_replaces_the_older_logs(tmp_path):
    store = RunStore(tmp_path)
    left_in_flight(
        store,
        {
            "2-repeat-0": [sample([5, 6, 7], 1), sample([8], 1, "stop")],  # continues from its tokens
            "2-repeat-1": [sample([5], 1) for _ in range(2)],  # finished: its group file is buffered
            "2-repeat-2": [
                Sample(sample([5, 6], 1).completion_ids + [7], [-1.0] * 3, [1, 1, 2])
            ],  # 2 is redone
            "1-repeat-0": [sample([5], 0), Sample()],  # too stale for step 3 (m = 1): oldest usable is 1
        },
    )
    partials, keep, stale = resume(store, {"2-repeat-1"}, served=1, oldest_usable=1, flush_s=1.0)
    assert [p.group for p in keep] == ["2-repeat-0", "2-repeat-2"] and [p.group for p in stale] == [
        "1-repeat-0"
    ]
    first, cut = keep
    assert [s.completion_ids for s in first.samples] == [[5, 6, 7], [8]] and first.samples[
        1
    ].finish_reason == "stop"
    assert [s.resumed for s in first.samples] == [3, 1]
    assert cut.samples[0].completion_ids == [5, 6] and cut.samples[0].resumed == 2  # cut at weights 2
    assert logs(store) == [layout.partials_log(1)] == [partials.rel]  # the new life's file only
    assert set(read_partials(store)) == {"2-repeat-0", "2-repeat-2"}
    ended = [json.loads(x) for x in store.read_bytes(partials.rel).decode().splitlines() if "ended" in x]
    assert ended == [{"group": "1-repeat-0", "ended": "dropped_stale"}]


def test_a_log_is_rotated_once_it_outgrows_its_live_tokens(tmp_path, monkeypatch):
    from rlfleet.orchestrator import partials as module

    monkeypatch.setattr(module, "ROTATE_BYTES", 200)
    store = RunStore(tmp_path)
    s = Sample()

    async def stream() -> PartialLog:
        log = PartialLog(store, 0, flush_s=1.0)
        log.track({"group": "0-repeat-0", "env": "repeat", "n": 1, "served": 0}, [s])
        for i in range(20):
            log.track({"group": f"0-repeat-{i + 1}", "env": "repeat", "n": 1, "served": 0}, [Sample()])
            log.end(f"0-repeat-{i + 1}", "finished")
            s.completion_ids.append(i)
            s.logprobs.append(-1.0)
            s.versions.append(0)
            await log.flush()
        return log

    log = asyncio.run(stream())
    assert log.life > 0 and logs(store) == [log.rel]
    (p,) = read_partials(store).values()
    assert p.samples[0].completion_ids == list(range(20))
    assert len(store.read_bytes(log.rel).splitlines()) < 20  # of the 61 records written


@pytest.mark.timeout(60)
def test_a_restarted_controller_continues_the_groups_in_flight_from_their_tokens(
    tmp_path, tiny_model, monkeypatch
):
    """Step 0 (batch 3, k = 0): one group was finished and buffered, one was in flight with tokens,
    one in flight with tokens from weights the resume recomputes. Nothing new is drawn; the sampler
    is sent each kept sample's prompt + tokens (the resend path), and the trained records say so."""
    store = RunStore(tmp_path)
    done = Group("0-repeat-2", "repeat", [stream_record(-1), stream_record(-1)], 1.0)
    store.write_json(layout.buffered_group(done.uid), asdict(done))
    left_in_flight(
        store,
        {
            "0-repeat-0": [sample([40, 41, 42], -1), sample([43], -1, "stop")],
            "0-repeat-1": [sample([44], 0), Sample()],  # weights 0: not served yet, so sampled again
            "0-repeat-2": [sample([45], -1), Sample()],  # its group file supersedes this
        },
    )
    sent: list[tuple[list[int], int, int]] = []

    async def fake_stream(
        self: Sampler, url: str, prompt: list[int], out: list[Sample], max_tokens: int
    ) -> None:
        sent.append((list(prompt), len(out), max_tokens))
        for s in out:
            s.completion_ids += [50] * max_tokens
            s.logprobs += [-1.0] * max_tokens
            s.versions += [-1] * max_tokens
            s.finish_reason = "length"

    monkeypatch.setattr(Sampler, "_stream", fake_stream)
    cfg = OrchestratorConfig(batch_size=3, group_size=2, max_tokens=5)
    s = RolloutStream(cfg, store, str(tiny_model), FixedReplicas(["http://unused"]), lambda: -1, 0, 64, 0, 1)
    s.start()
    try:
        manifest = s.take(0).manifest
    finally:
        s.stop()
    assert sorted(manifest["group_uids"]) == ["0-repeat-0", "0-repeat-1", "0-repeat-2"]
    assert manifest["stream"]["resumed_samples"] == 2 and manifest["stream"]["started"] == 2
    # one request for 0-repeat-1, sampled again; one for the rest of 0-repeat-0's sample 0, sent its
    # prompt + tokens and what is left of max_tokens (the resend path); its finished sample 1: none
    assert sorted((n, m) for _, n, m in sent) == [(1, 2), (2, 5)]
    (cont,) = [p for p, n, _ in sent if n == 1]
    records = {r["sample_id"]: r for r in read_rollout(store, 0)}
    assert set(records) == {f"0-repeat-{g}/{i}" for g in range(3) for i in range(2)}
    kept = records["0-repeat-0/0"]
    assert kept["input_ids"] == cont + [50, 50] and cont[kept["prompt_len"] :] == [40, 41, 42]
    assert [t["resumed"] for t in records["0-repeat-0/0"]["turns"]] == [3]
    completion = {i: r["input_ids"][r["prompt_len"] :] for i, r in records.items()}
    assert completion["0-repeat-0/1"] == [43] and completion["0-repeat-1/0"] == [50] * 5
    assert read_partials(store) == {}  # every group ended
