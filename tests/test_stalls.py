"""The stall watchdog's own rules, without a run: the wait chain and who is stuck from a state of
the controller's books (fakes of those only), and the watchdog's dumps, summary and policy with a
clock the test moves and a real frozen process. tests/test_stall_run.py injects hangs in real runs."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import psutil
import pytest

from rlfleet.config.faults import FaultsConfig
from rlfleet.procs import wait_until
from rlfleet.progress import Progress, StallError
from rlfleet.runs.dumps import processes
from rlfleet.runs.stalls import StallWatchdog
from rlfleet.runs.waits import Diagnosis, RunState, diagnose
from rlfleet.store import RunStore

A, B = "http://127.0.0.1:8000", "http://127.0.0.1:8001"


def state(progress: Progress, stream_in_flight: int = 0, starting: bool = False) -> RunState:
    return {
        "timeout_s": 10.0,
        "progress": progress.snapshot(),
        "replicas": [{"index": 0, "url": A, "pid": None}, {"index": 1, "url": B, "pid": None}],
        "trainer": {"pid": None, "starting": starting},
        "stream": {"next_step": 7, "batch_size": 12, "ready": 3, "in_flight": stream_in_flight, "served": 5},
        "processes": [
            {"party": "trainer", "role": "guard", "pid": 10, "status": "sleeping"},
            {"party": "trainer", "role": "trainer", "pid": 11, "status": "stopped"},
        ],
    }


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_load_that_never_returns_blames_its_replica():
    clock = Clock()
    p = Progress(clock)
    p.token(A)
    p.token(B)
    with p.waiting("broadcast-6", "step 6's weights to load"), p.loading(B, 6):
        clock.now += 30
        d = diagnose(state(p))
    assert (d.culprit, d.replicas) == ("replica", [1])
    assert "has not finished loading the weights of step 6 for 30 s" in d.why
    assert d.chain[0] == "broadcast-6 waits for step 6's weights to load (30 s)"
    assert any(
        line.startswith("replica 1 (http://127.0.0.1:8001): loading step 6 for 30 s") for line in d.chain
    )


def test_a_trainer_step_that_never_comes_blames_the_trainer_unless_it_is_loading():
    clock = Clock()
    p = Progress(clock)
    p.trainer_stepped(6)
    with p.waiting("train-7", "the trainer's step 7"):
        clock.now += 30
        d = diagnose(state(p))
        assert diagnose(state(p, starting=True)).culprit != "trainer"
    assert d.culprit == "trainer"
    assert d.why == "train-7 waits for the trainer's step 7 for 30 s; trainer: trainer 11 stopped"
    assert "trainer: last step 6, 30 s ago; trainer 11 stopped" in d.chain


def test_a_silent_replica_with_requests_in_flight_is_blamed_alone():
    clock = Clock()
    p = Progress(clock)
    p.requests[A] += 2
    p.requests[B] += 2
    p.token(A)
    clock.now += 30
    p.token(B)  # B still streams; A does not: not a global stall, but the rule picks A alone
    clock.now += 5
    d = diagnose(state(p))
    assert (d.culprit, d.replicas) == ("replica", [0])
    assert d.why == "replica 0 has requests in flight and no token for 35 s"
    assert (
        "the rollout stream: step 7 takes 12 groups: 3 finished, 0 in flight (weights served: step 5)"
        in d.chain
    )


def test_groups_in_flight_without_requests_are_the_controllers():
    clock = Clock()
    p = Progress(clock)
    p.token(A)
    clock.now += 30
    d = diagnose(state(p, stream_in_flight=9))
    assert d.culprit == "controller" and d.replicas == []
    assert d.why.startswith("step 7 waits for 9 groups in flight, none of which has a request on a replica")


class FakeRun:
    """The controller as the watchdog sees it: one real process stands for the trainer."""

    def __init__(self, pid: int, progress: Progress):
        self.pid, self.progress, self.killed, self.halted = pid, progress, [], False

    def starting(self) -> bool:
        return False

    def run_state(self, timeout_s: float) -> RunState:
        return {
            "timeout_s": timeout_s,
            "progress": self.progress.snapshot(),
            "replicas": [],
            "trainer": {"pid": self.pid, "starting": False},
            "stream": None,
            "processes": processes({"trainer": self.pid}),
        }

    def relaunch(self, d: Diagnosis) -> str | None:
        self.killed.append(d.culprit)
        return "killed the trainer"

    def halt(self) -> None:
        self.halted = True


HANG = "import time\ndef hang_in_a_step():\n    print('up', flush=True)\n    time.sleep(3600)\nhang_in_a_step()\n"


@pytest.fixture
def frozen():
    """A real Python process inside `hang_in_a_step`, then SIGSTOPped (a frozen trainer): it says
    so from inside, and the stop has taken (a signal lands when the process next runs)."""
    proc = subprocess.Popen([sys.executable, "-c", HANG], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline() == "up\n"
    os.kill(proc.pid, signal.SIGSTOP)
    me = psutil.Process(proc.pid)
    wait_until(lambda: me.status() == psutil.STATUS_STOPPED, 30, what="the SIGSTOP to take")
    yield proc
    proc.kill()
    proc.wait()


def test_watchdog_dumps_every_process_relaunches_then_fails_when_nothing_moved(tmp_path, frozen):
    clock = Clock()
    progress = Progress(clock)
    run = FakeRun(frozen.pid, progress)
    seen = []
    store = RunStore(tmp_path)
    dog = StallWatchdog(FaultsConfig(stall_timeout_s=10), progress, store, run, seen.append)
    progress.trainer_stepped(3)
    with progress.waiting("train-4", "the trainer's step 4"):
        clock.now += 9
        assert dog.check() is None  # not yet
        clock.now += 2
        first = dog.check()
        assert first is not None and run.killed == ["trainer"] and not first["fails_run"]
        assert progress.stall is None and dog.check() is None  # the clock restarted at the recovery
        clock.now += 11  # nothing moved since the relaunch
        second = dog.check()
    assert second is not None and second["fails_run"]
    assert run.killed == ["trainer"] and run.halted  # failing: every part killed, none relaunched
    assert seen == [first, second]
    assert second["action"] == "fail the run: nothing progressed since the last stall's relaunch"
    with pytest.raises(StallError, match="train-4 waits for the trainer's step 4"):
        progress.check()

    where = tmp_path / "stalls" / first["at"]
    summary = (where / "summary.txt").read_text()
    assert summary.startswith("stalled: nothing progressed for 11 s (faults.stall_timeout_s = 10)")
    assert "stuck: trainer: train-4 waits for the trainer's step 4 for 11 s" in summary
    assert "action: relaunch trainer" in summary
    dump = (where / f"trainer.guard.{frozen.pid}.txt").read_text()
    assert "hang_in_a_step" in dump and "(stopped)" in dump.splitlines()[0]  # py-spy read the frozen one
    assert "test_watchdog_dumps_every_process" in (where / "controller.txt").read_text()


def test_preflight_keeps_the_watchdog_behind_user_code_timeouts_and_zero_turns_it_off(tmp_path):
    from rlfleet.config.models import RLConfig

    env = {"type": "python", "args": {"dataset": "d.jsonl", "rewards": ["t.py:f"], "reward_timeout_s": 30}}
    base = {"model": {"path": "m"}, "orchestrator": {"env": [env]}}
    with pytest.raises(
        ValueError, match=r"faults.stall_timeout_s \(20\) must exceed .*python.reward_timeout_s = 30"
    ):
        RLConfig.model_validate({**base, "faults": {"stall_timeout_s": 20}})
    assert RLConfig.model_validate({**base, "faults": {"stall_timeout_s": 31}}).faults.enabled
    for off in (0, None):
        assert not RLConfig.model_validate({**base, "faults": {"stall_timeout_s": off}}).faults.enabled
