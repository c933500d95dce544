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
