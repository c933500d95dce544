"""A CI-sized chaos soak (benchmarks/chaos.py): one `rlfleet rl` run, a few faults of fixed kinds
at moments picked by a fixed seed, restarted by the same command until it ends. It asserts what
the soak checks at the end, never how long anything took.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.helpers import ROOT

pytestmark = pytest.mark.e2e


def test_a_short_soak_ends_as_if_nothing_happened(tmp_path):
    """The controller killed and its rerun killed while it reaps, a part frozen until the stall
    watchdog relaunches it, a replica or the controller killed during a weight load, two parts
    at once: every step once with its own batch, every checkpoint loadable, nothing left. The soak
    ends the run two steps after its last fault."""
    result = tmp_path / "chaos.json"
    cmd = [
        sys.executable, "benchmarks/chaos.py",
        "--seed", "55",
        "--max-steps", "100",
        "--finish-steps", "2",  # the run ends 2 steps after the last fault, not at step 100
        "--kinds", "reap,stop,weight_load,two",
        "--max-faults", "5",
        "--gap-s", "2", "6",
        "--stall-timeout-s", "10",
        "--workdir", str(tmp_path / "soak"),
        "--out", str(result),
        "--orchestrator.batch-size", "4",
        "--orchestrator.group-size", "4",
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("PREFECT_API_URL", None)  # each controller its own temporary server, as a user's
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200)
    assert result.exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    doc = json.loads(result.read_text())["results"]
    failed = [c for c in doc["checks"] if not c["ok"]]
    assert not failed and doc["error"] is None and not doc["hangs"], (failed, doc["error"], doc["hangs"])
    assert doc["ended_by_soak"] and doc["steps"] == doc["max_steps"] < 100
    assert doc["faults_by_kind"] == {"reap": 2, "stop": 1, "weight_load": 1, "two": 1}, doc["fault_log"]
    assert doc["restarts"] >= 2  # the controller and its rerun, each restarted
    assert all(
        f["outcome"] in ("recovered", "superseded") for f in doc["fault_log"] if f["signal"] == "SIGSTOP"
    )
    assert proc.returncode == 0, proc.stdout[-3000:]
