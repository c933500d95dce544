"""Kill points over a run's whole life: the controller, the trainer and a vLLM replica SIGKILLed at
each phase (before step 0's rollout ends, between step 0 and the first checkpoint, during a
checkpoint write, right after one, during a weight load, in the last step). The run finishes with
every step trained once in its lineage, and a killed controller leaves no process behind.

A phase is found from the run store, as a user's eye would: a frozen process (SIGSTOP) holds a
phase open until the kill lands in it. Recovery times are printed (`pytest -s`), never asserted.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from rlfleet.procs import pid_alive
from tests.helpers import assert_every_step_once, assert_no_process_left, flow_run_logs, rl_config

pytestmark = pytest.mark.e2e

STEPS, INTERVAL = 8, 4  # checkpoints at steps 3 and 7; step 0's weights pruned (keep 1) by step 2


@dataclass(frozen=True)
class Phase:
    """A moment of the run: `ready(out)` is true once it is reached; `freeze` names the pidfile of
    a process group to stop there, so the phase stays open until the kill; `landed(out)` checks,
    at the kill, that the run was still in it."""

    name: str
    ready: Callable[[Path], bool]
    landed: Callable[[Path], bool] = lambda out: True
    freeze: str | None = None


def _exists(rel: str) -> Callable[[Path], bool]:
    return lambda out: (out / rel).exists()


def _staging(out: Path) -> bool:
    return any((out / "checkpoints").glob(f".tmp-step_{INTERVAL - 1}-*"))


def _served(out: Path) -> int:
    try:
        return json.loads((out / "run/weights_served.json").read_text())["step"]
    except (OSError, ValueError, KeyError):
        return -1


def _no_checkpoint(out: Path) -> bool:
    return not any((out / "checkpoints").glob("step_*/manifest.json"))


def _absent(rel: str) -> Callable[[Path], bool]:
    return lambda out: not (out / rel).exists()


FIRST, LAST = f"checkpoints/step_{INTERVAL - 1}/manifest.json", STEPS - 1
PHASES = [
    Phase(
        "before step 0's rollout ends",
        _exists("run/trainer_up.json"),
        _absent("rollouts/step_0/manifest.json"),
    ),
    Phase("between step 0 and the first checkpoint", _exists("steps/step_2.json"), _no_checkpoint),
    Phase("during a checkpoint write", _staging, _absent(FIRST), freeze="trainer"),
    Phase("right after a checkpoint", _exists(FIRST)),
    Phase("during a weight load", _exists("metrics/step_5.json"), lambda o: _served(o) < 5, "inference_0"),
    Phase(
        "in the last step", _exists(f"rollouts/step_{LAST}/manifest.json"), _absent(f"steps/step_{LAST}.json")
    ),
]


def _wait(out: Path, phase: Phase, alive: Callable[[], bool], timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    while not phase.ready(out):
        assert alive(), f"the run ended before {phase.name}"
        assert time.monotonic() < deadline, f"{phase.name}: not reached in {timeout} s"
        time.sleep(0.002)  # a checkpoint's staging lasts milliseconds on the tiny model


def _group(out: Path, name: str) -> int | None:
    return pid_alive(out / "run" / f"{name}.pid")


def _freeze(out: Path, name: str | None) -> int | None:
    pid = None if name is None else _group(out, name)
    if pid is not None:
        os.killpg(pid, signal.SIGSTOP)
    return pid


def _thaw(pid: int | None) -> None:
    if pid is not None:
        with contextlib.suppress(ProcessLookupError):  # it died while frozen
            os.killpg(pid, signal.SIGCONT)


def _start(cfg_file: Path, console: Path) -> subprocess.Popen:
    with console.open("a") as f:
        return subprocess.Popen(
            [sys.executable, "-m", "rlfleet.cli", "rl", "@", str(cfg_file)],
            stdout=f,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def _optimizer_steps(out: Path, step: int) -> set[int]:
    from rlfleet.store import RunStore
    from rlfleet.trainer.checkpoint import optimizer_steps

    return optimizer_steps(RunStore(out), f"checkpoints/step_{step}")


def test_a_controller_killed_at_every_phase_reruns_to_the_end_once(tiny_model, prefect_api, tmp_path):
    """One run, one controller life per phase, each SIGKILLed there; the rerun of each resumes
    (from the base model until the first checkpoint, on ba5f5e1 the rerun after "between step 0
    and the first checkpoint" failed: `no complete weights for step <= 0`). Nothing of a killed
    life is alive 15 s after its kill (the guard's grace is 10 s): trainer, replica, wandb."""
    from rlfleet.config.loader import to_toml
    from rlfleet.flows.rl import rl

    out = tmp_path / "run"
    cfg = rl_config(
        tiny_model,
        out,
        max_steps=STEPS,
        **{"trainer.checkpoint-interval": str(INTERVAL), "trainer.keep-weights": "1"},
    )
    cfg_file, console = tmp_path / "rl.toml", tmp_path / "rl.log"
    cfg_file.write_text(to_toml(cfg))
    for phase in PHASES:
        proc = _start(cfg_file, console)
        _wait(out, phase, lambda p=proc: p.poll() is None)
        frozen = _freeze(out, phase.freeze)
        try:
            assert phase.landed(out), f"the kill missed {phase.name}"
            tree = psutil.Process(proc.pid).children(recursive=True)
            proc.kill()
            proc.wait()
            t_kill = time.monotonic()
        finally:
            _thaw(frozen)
        _, alive = psutil.wait_procs(tree, timeout=15)
        assert not alive, f"{phase.name}: alive 15 s after the controller's SIGKILL: {alive}"
        print(f"\ncontroller killed {phase.name}: its processes gone in {time.monotonic() - t_kill:.1f} s")
        assert_no_process_left(out)

    checkpointed = (out / f"metrics/step_{INTERVAL - 1}.json").read_bytes()
    state = rl(config=cfg, return_state=True)
    assert state.is_completed(), state
    assert_every_step_once(out, STEPS)
    assert _optimizer_steps(out, INTERVAL - 1) == {INTERVAL}, "the first checkpoint's lineage"
    assert (out / f"metrics/step_{INTERVAL - 1}.json").read_bytes() == checkpointed, (
        "a checkpointed step retrained"
    )
    lives = console.read_text()
    assert "resuming at step 0 from the base model; discarded" in lives, "a resume before any checkpoint"
    assert f"resuming at step {INTERVAL} from checkpoint {INTERVAL - 1}" in lives
    logs = [x.message for x in flow_run_logs(state.state_details.flow_run_id)]
    assert any(
        m.startswith(f"resuming at step {INTERVAL} from checkpoint {INTERVAL - 1}; discarded") for m in logs
    )
    assert_no_process_left(out)


class Killer(threading.Thread):
    """Kill the trainer and replica 0 at each phase in turn, in a run going on in this process."""

    def __init__(self, out: Path, phases: list[Phase]):
        super().__init__(daemon=True)
        self.out, self.phases = out, phases
        self.killed: list[str] = []
        self.errors: list[str] = []
        self.done = threading.Event()

    def run(self) -> None:
        try:
            for phase in self.phases:
                _wait(self.out, phase, lambda: not self.done.is_set())
                frozen = _freeze(self.out, phase.freeze)
                try:
                    if not phase.landed(self.out):
                        self.errors.append(f"the kill missed {phase.name}")
                    for name in ("trainer", "inference_0"):
                        pid = _group(self.out, name)
                        if pid is None:
                            self.errors.append(f"{phase.name}: no {name} to kill")
                        else:
                            os.killpg(pid, signal.SIGKILL)
                finally:
                    _thaw(frozen)
                self.killed.append(phase.name)
        except AssertionError as e:
            self.errors.append(str(e))


def test_the_trainer_and_a_replica_killed_at_every_phase_are_relaunched_once(
    tiny_model, prefect_api, tmp_path
):
    """The controller lives: the trainer and the replica, SIGKILLed together at each phase, are
    relaunched (from the last checkpoint, with the newest weights) and every step trains once."""
    from rlfleet.flows.rl import rl

    out = tmp_path / "run"
    cfg = rl_config(
        tiny_model,
        out,
        max_steps=STEPS,
        **{"trainer.checkpoint-interval": str(INTERVAL), "trainer.keep-weights": "1", "tasks.retries": "3"},
    )
    killer = Killer(out, PHASES)
    killer.start()
    try:
        state = rl(config=cfg, return_state=True)
    finally:
        killer.done.set()
        killer.join(30)
    assert not killer.errors, killer.errors
    assert killer.killed == [p.name for p in PHASES]
    assert state.is_completed(), state
    assert_every_step_once(out, STEPS)
    assert _optimizer_steps(out, INTERVAL - 1) == {INTERVAL}
    summary = json.loads((out / "summary.json").read_text())
    events = [r["event"] for r in summary["recoveries"]]
    assert "trainer.relaunched" in events and "replica.relaunched" in events, events
    assert_no_process_left(out)
