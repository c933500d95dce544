"""`rlfleet rl --fleet`'s hand-off to a warm controller still importing (fleet/controller.py,
fleet/handoff.py): the caller that comes right after a run, while the fleet's fresh warm controller
imports, waits for it instead of paying the imports itself."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from rlfleet.fleet.keeper import CLAIMED, READY, WARM, spool
from rlfleet.fleet.state import fleet_dir, state_path, write_json_atomic
from rlfleet.procs import this_process, wait_until

# a warm controller whose imports wait for a line on its stdin: the test decides when they end
GATED = """
import sys
from pathlib import Path
from rlfleet.fleet import controller
preload = controller._preload
controller._preload = lambda: (sys.stdin.readline(), preload())
sys.exit(controller.serve_one(Path(sys.argv[1]), sys.argv[2]))
"""
CALLER = "import sys; from rlfleet.fleet.handoff import hand_off; print('exit', hand_off('t', sys.argv[1:]))"


@pytest.fixture(autouse=True)
def _fleet_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("RLFLEET_FLEET_DIR", str(tmp_path / "fleets"))


def test_a_caller_that_comes_while_the_warm_controller_imports_runs_in_it(tmp_path):
    me = this_process()  # the fleet's process, as `rlfleet fleet up` writes its state
    state_path("t").parent.mkdir(parents=True)
    write_json_atomic(
        state_path("t"), {"name": "t", "pid": me["pid"], "started": me["started"], "urls": ["u"]}
    )
    slot = spool(fleet_dir() / "t", "controller", 0)
    slot.mkdir(parents=True)
    warm = subprocess.Popen(
        [sys.executable, "-c", GATED, str(slot), str(tmp_path / "no-model")], stdin=subprocess.PIPE, text=True
    )
    try:
        wait_until(lambda: (slot / WARM).exists(), 60, what="the warm controller to listen")
        caller = subprocess.Popen(
            [sys.executable, "-c", CALLER, "--no-such-command"], stdout=subprocess.PIPE, text=True
        )
        assert not (slot / READY).exists()  # still importing when the caller came
        warm.stdin.write("imports may end\n")
        warm.stdin.flush()
        out, _ = caller.communicate(timeout=300)
        assert caller.returncode == 0
        assert out.splitlines()[-1] == "exit 2"  # rlfleet's usage error, from the warm controller
        assert json.loads((slot / CLAIMED).read_text())["pid"] == caller.pid
        assert warm.wait(timeout=60) == 2
    finally:
        warm.kill()
        warm.wait()


def test_an_early_fleet_has_the_next_warm_controller_listening_while_a_run_runs_in_the_last(
    tiny_model, tmp_path
):
    """`early` (a fleet with GPUs): the moment a caller's command runs in the warm controller, the
    fleet starts the next, which listens on the same address while the first still runs; the next
    caller's command runs there, not in the busy one."""
    from rlfleet.config.loader import to_toml
    from rlfleet.config.model import ModelConfig
    from rlfleet.config.models import TrainerJobConfig
    from rlfleet.fleet.keeper import WarmKeeper

    me = this_process()
    state_path("t").parent.mkdir(parents=True)
    write_json_atomic(
        state_path("t"), {"name": "t", "pid": me["pid"], "started": me["started"], "urls": ["u"]}
    )
    keeper = WarmKeeper.controller(fleet_dir() / "t", 0, str(tiny_model), early=True).start()
    job = TrainerJobConfig(output_dir=str(tmp_path / "a"), model=ModelConfig(path=str(tiny_model)))
    (tmp_path / "a.toml").write_text(to_toml(job))
    # the caller comes once the warm controller is ready: one that came before it listened would
    # run its command itself (the next test)
    assert keeper.wait_ready(300)
    # a trainer job: it waits for batches that never come, until its caller goes
    running_caller = subprocess.Popen(
        [sys.executable, "-c", CALLER, "trainer", "@", str(tmp_path / "a.toml")]
    )
    try:
        wait_until(
            lambda: _claimed_by(keeper.spool) == running_caller.pid,
            120,
            what="the caller's command to run in the warm controller",
        )
        first = keeper.process
        wait_until(lambda: keeper.keep() or keeper.process is not first, 30, what="the next one")
        assert keeper.wait_ready(300)  # listening and imported while the run goes on
        out = subprocess.run(
            [sys.executable, "-c", CALLER, "--no-such-command"], capture_output=True, text=True, timeout=300
        ).stdout
        assert out.splitlines()[-1] == "exit 2"  # rlfleet's usage error, from the next warm controller
        assert _claimed_by(keeper.spool) != running_caller.pid
        assert first.alive() and [t.pid for t in keeper.taken] == [first.pid]  # still running the first
    finally:
        running_caller.kill()
        running_caller.wait()
        keeper.stop()
    assert not keeper.process.alive() and not first.alive()


def test_a_caller_that_finds_no_warm_controller_listening_runs_the_command_itself_and_says_so(capsys):
    me = this_process()
    state_path("t").parent.mkdir(parents=True)
    write_json_atomic(
        state_path("t"), {"name": "t", "pid": me["pid"], "started": me["started"], "urls": ["u"]}
    )
    from rlfleet.fleet.handoff import hand_off

    assert hand_off("t", ["rl"]) is None
    assert "no warm controller of fleet 't' is free" in capsys.readouterr().err


def _claimed_by(slot) -> int | None:
    try:
        return json.loads((slot / CLAIMED).read_text())["pid"]
    except (OSError, ValueError):
        return None
