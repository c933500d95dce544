"""Fault injection on a real run: kill the trainer, a vLLM replica, or the controller mid-run.

Each test asserts the run finishes with every step exactly once (from the run store's manifests
and Prefect's task runs), the exact number of optimizer steps, and no process left behind.
Recovery times are printed (`pytest -s`) for the closing notes; they are not asserted.
"""

from __future__ import annotations

import contextvars
import json
import logging
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from rlfleet.procs import pid_alive
from rlfleet.store import RunStore
from tests.helpers import (
    KillWhen,
    assert_every_step_once,
    assert_no_process_left,
    flow_run_logs,
    free_port,
    rl_config,
    task_runs,
)

pytestmark = pytest.mark.e2e


def run_and_kill(cfg, trigger: Path, pidfile: Path):
    """Run the flow in-process while a KillWhen fires; the run must still complete."""
    from rlfleet.flows.rl import rl

    killer = KillWhen(trigger, pidfile)
    killer.start()
    state = rl(config=cfg, return_state=True)
    assert state.is_completed(), state
    assert killer.killed_at is not None
    return state, killer


class ArtifactWatch(threading.Thread):
    """Poll the Prefect API for a run's artifacts while it goes: (seen at, key, version count, data).
    Runs in the test's settings context (the test API's URL is a context variable)."""

    def __init__(self, keys: list[str]):
        super().__init__(daemon=True)
        self.keys, self.seen, self.done = keys, [], threading.Event()
        self.context = contextvars.copy_context()

    def run(self) -> None:
        self.context.run(self._poll)

    def _poll(self) -> None:
        from prefect import get_client
        from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

        with get_client(sync_client=True) as client:
            while not self.done.wait(0.3):
                found = client.read_artifacts(
                    artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=self.keys))
                )
                for key in self.keys:
                    versions = [a for a in found if a.key == key]
                    if versions:
                        latest = max(versions, key=lambda a: a.created)
                        self.seen.append((time.time(), key, len(versions), latest.data))


def rlfleet_events(prefix: str = "rlfleet.") -> list[dict]:
    import httpx
    from prefect.settings import PREFECT_API_URL

    resp = httpx.post(
        f"{PREFECT_API_URL.value()}/events/filter", json={"filter": {"event": {"prefix": [prefix]}}}
    )
    resp.raise_for_status()
    return resp.json()["events"]


@pytest.mark.parametrize("transport", ["filesystem", "nccl"])
def test_trainer_killed_mid_run_is_relaunched_from_checkpoint(tiny_model, prefect_api, tmp_path, transport):
    """The run finishes with every step once; the user sees the relaunch (a WARNING, a Prefect event,
    the summary's recoveries) and the run's artifacts while it is going, not only at its end.

    The kill lands as step 2 is reported done, when an nccl trainer is sending step 2's weights
    (over gloo here): the receiving vLLM worker must give up on the dead sender at once (no wait for
    the collective's timeout), and broadcast_weights-2 relaunches the trainer, whose replay of step
    2 sends them again. Through the filesystem, train-3 finds the trainer dead."""
    out = tmp_path / "run"
    extra = {"weights.transport": transport, "weights.nccl-port": str(free_port())}
    cfg = rl_config(
        tiny_model, out, max_steps=4, **{"trainer.checkpoint-interval": "2", "tasks.retries": "2", **extra}
    )
    watch = ArtifactWatch(["run-progress", "run-metrics"])
    watch.start()
    try:
        state, killer = run_and_kill(cfg, out / "metrics/step_2.json", out / "run/trainer.pid")
    finally:
        watch.done.set()
        watch.join()
    ended = time.time()
    print(
        f"\n{transport}: trainer SIGKILL -> step 3 trained: "
        f"{(out / 'metrics/step_3.json').stat().st_mtime - killer.killed_at:.1f} s"
    )
    relaunched_at, retriable = (3, "train-3") if transport == "filesystem" else (2, "broadcast_weights-2")

    assert_every_step_once(out, 4)
    log = (out / "logs/trainer/rank_0.log").read_text()
    assert "starting at step 0" in log and "starting at step 2 (checkpoint: 1)" in log
    runs = task_runs(state.state_details.flow_run_id)
    names = [r.name for r in runs]
    assert sorted(n for n in names if n.startswith("rollout")) == [f"rollout-{s}" for s in range(4)]
    retried = {r.name: r.run_count for r in runs if r.run_count > 1}
    assert set(retried) <= {retriable}, retried  # or the task found it dead and relaunched at once
    assert_no_process_left(out)

    # the relaunch, where a user looks: the flow run's log, an event, the summary and its message
    run_id = state.state_details.flow_run_id
    (event,) = [
        e
        for e in rlfleet_events()
        if any(r["prefect.resource.id"].endswith(str(run_id)) for r in e["related"])
    ]
    assert (
        event["event"] == "rlfleet.trainer.relaunched" and event["resource"]["prefect.resource.name"] == "run"
    )
    assert event["payload"]["exit_code"] == -9 and event["payload"]["checkpoint"] == 1
    assert event["payload"]["replayed"] == [2] and event["payload"]["step"] == relaunched_at
    summary = json.loads((out / "summary.json").read_text())
    assert [r["event"] for r in summary["recoveries"]] == ["trainer.relaunched"]
    assert state.message.endswith("in 4 steps; recoveries: 1")
    warnings = [x for x in flow_run_logs(run_id) if x.level == logging.WARNING]
    relaunch = f"trainer exited with code -9 and was relaunched at step {relaunched_at}"
    assert any(relaunch in x.message for x in warnings)

    # live artifacts: progress moved and the metrics table had versions before the run ended
    progress = [data for t, key, _, data in watch.seen if key == "run-progress" and t < ended]
    assert any(0 < p < 100 for p in progress) and progress[-1] <= 100, progress
    # every version of the metrics table made before the flow run ended (server-side times: no race
    # between the poll and a fast run)
    from prefect import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId, ArtifactFilterKey

    with get_client(sync_client=True) as client:
        end = client.read_flow_run(run_id).end_time
        tables = client.read_artifacts(
            artifact_filter=ArtifactFilter(
                key=ArtifactFilterKey(any_=["run-metrics"]),
                flow_run_id=ArtifactFilterFlowRunId(any_=[run_id]),
            )
        )
    assert end is not None and len([a for a in tables if a.created < end]) >= 2, [a.created for a in tables]


@pytest.mark.parametrize("transport", ["filesystem", "nccl"])
def test_vllm_replica_killed_is_relaunched_with_current_weights(tiny_model, prefect_api, tmp_path, transport):
    """The kill lands as step 1 is reported done. Through the filesystem the relaunched replica
    loads the newest weights on disk; over nccl (gloo here) the trainer, whose send of step 1 lost
    its receiver, builds a new group on the controller's request and sends step 1 to the new
    replica, and broadcast_weights-1 finds it already there."""
    out = tmp_path / "run"
    extra = {"weights.transport": transport, "weights.nccl-port": str(free_port())}
    cfg = rl_config(tiny_model, out, max_steps=3, **{"tasks.retries": "2", **extra})
    _, killer = run_and_kill(cfg, out / "metrics/step_1.json", out / "run/inference_0.pid")
    print(
        f"\nvLLM SIGKILL -> step 2 done: {(out / 'steps/step_2.json').stat().st_mtime - killer.killed_at:.1f} s"
    )

    assert_every_step_once(out, 3)
    log = (out / "logs/inference/replica_0.log").read_text()
    assert log.count("Application startup complete") == 2, "the replica was relaunched once"
    summary = json.loads((out / "summary.json").read_text())
    assert "replica.relaunched" in [r["event"] for r in summary["recoveries"]]
    if transport == "nccl":  # the trainer answered the regroup and was not relaunched itself
        assert json.loads((out / "sync/regrouped.json").read_text())["step"] == 1
        assert "trainer.relaunched" not in [r["event"] for r in summary["recoveries"]]
        assert [json.loads((out / f"steps/step_{s}.json").read_text())["policy_step"] for s in range(3)] == [
            -1,
            0,
            1,
        ]
    assert not psutil.pid_exists(killer.pid) or psutil.Process(killer.pid).status() == psutil.STATUS_ZOMBIE
    assert_no_process_left(out)


def test_controller_killed_leaves_no_orphans_and_rerun_resumes(tiny_model, prefect_api, tmp_path):
    """Over nccl, killed once step 2's weights are served but its checkpoint is not written (every
    2 steps): the rerun's trainer replays step 2, and must send it to the new replica, which the
    dead controller's acknowledgement of step 2 does not cover (it hung there on an H200)."""
    from rlfleet.flows.rl import rl
    from rlfleet.weights.tickets import served_step

    out = tmp_path / "run"
    nccl = {"weights.transport": "nccl", "weights.nccl-port": str(free_port())}
    cfg = rl_config(tiny_model, out, max_steps=4, **{"trainer.checkpoint-interval": "2", **nccl})
    cfg_file = tmp_path / "rl.toml"
    from rlfleet.config.loader import to_toml

    cfg_file.write_text(to_toml(cfg))
    console = tmp_path / "rl.log"
    with console.open("w") as f:
        proc = subprocess.Popen(
            [sys.executable, "-m", "rlfleet.cli", "rl", "@", str(cfg_file)],
            stdout=f,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    deadline = time.monotonic() + 600
    store = RunStore(out)
    while (served_step(store) or -1) < 2:
        assert proc.poll() is None and time.monotonic() < deadline, console.read_text()[-3000:]
        time.sleep(0.02)
    leaders = [pid_alive(p) for p in (out / "run").glob("*.pid") if p.name != "controller.pid"]
    assert len([p for p in leaders if p]) == 2, "trainer and one vLLM replica"
    # `rlfleet rl` started vLLM before the flow, and the flow served from that replica: one start
    replica_log = (out / "logs/inference/replica_0.log").read_text()
    assert replica_log.count("Starting vLLM server on") == 1, replica_log[-3000:]
    tree = [psutil.Process(p) for p in leaders if p]
    tree += [c for p in tree for c in p.children(recursive=True)]
    proc.kill()
    proc.wait()
    t_kill = time.monotonic()
    gone, alive = psutil.wait_procs(tree, timeout=30)
    assert not alive, f"orphans after the controller died: {alive}"
    print(f"\ncontroller SIGKILL -> children gone: {time.monotonic() - t_kill:.1f} s")

    done = store.complete_steps("checkpoints")
    assert done, "at least one checkpoint before the kill"
    assert max(done) < served_step(store), "the rerun replays a step the dead controller's replicas held"
    before = {s: (out / f"metrics/step_{s}.json").read_bytes() for s in done}

    state = rl(config=cfg, return_state=True)
    assert state.is_completed(), state
    for s, data in before.items():
        assert (out / f"metrics/step_{s}.json").read_bytes() == data, f"step {s} was trained twice"
    names = {r.name for r in task_runs(state.state_details.flow_run_id)}
    assert not {f"train-{s}" for s in done} & names
    assert_every_step_once(out, 4)
    assert_no_process_left(out)
