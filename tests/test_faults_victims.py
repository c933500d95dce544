"""benchmarks/faults.py finds the process each fault kills in a run's real process tree: the
trainer (the guard's child) or, on several GPUs, the trainer's last rank (torchrun's last worker).
A harness cut by `timeout` takes its runs (their own sessions) down with it."""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parents[1]
# guard -> trainer -> `ranks` workers, each waiting to be killed
TREE = r"""
import subprocess, sys, time
level, ranks = int(sys.argv[1]), int(sys.argv[2])
n = 1 if level == 2 else ranks if level == 1 else 0
for _ in range(n):
    subprocess.Popen([sys.executable, "-c", sys.argv[3], str(level - 1), sys.argv[2], sys.argv[3]])
time.sleep(600)
"""


@pytest.fixture(scope="module")
def faults():
    sys.path.insert(0, str(ROOT / "benchmarks"))  # faults.py imports benchmarks/common.py
    spec = importlib.util.spec_from_file_location("faults", ROOT / "benchmarks" / "faults.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _tree(out: Path, ranks: int):
    """A guard, its trainer and the trainer's ranks; the guard's pidfile where a run keeps it."""
    guard = subprocess.Popen([sys.executable, "-c", TREE, "2", str(ranks), TREE], start_new_session=True)
    deadline = time.monotonic() + 60
    while len(psutil.Process(guard.pid).children(recursive=True)) < 1 + ranks:
        assert time.monotonic() < deadline, "the process tree did not come up"
        time.sleep(0.05)
    (out / "run").mkdir(parents=True)
    (out / "run" / "trainer.pid").write_text(f"{guard.pid} {psutil.Process(guard.pid).create_time()}")
    return guard


@pytest.mark.parametrize("ranks", [1, 2])
def test_the_trainer_and_its_last_rank_are_found_in_the_tree(faults, tmp_path, ranks):
    guard = _tree(tmp_path, ranks)
    try:
        trainer = faults.victim(tmp_path, "trainer")
        assert trainer.ppid() == guard.pid
        workers = sorted(trainer.children(), key=lambda p: p.create_time())
        if ranks == 1:
            with pytest.raises(LookupError, match="trainer_rank: 1 rank"):
                faults.victim(tmp_path, "trainer_rank")
        else:
            assert faults.victim(tmp_path, "trainer_rank").pid == workers[-1].pid
        assert faults.victim(tmp_path, "trainer_guard").pid == guard.pid
    finally:
        os.killpg(guard.pid, signal.SIGKILL)
        guard.wait()


# a harness as faults.py is one: its run in its own session, blocked on it until SIGTERM
HARNESS = r"""
import sys
sys.path.insert(0, sys.argv[1])
from common import Runs, exit_on_sigterm
exit_on_sigterm()
runs = Runs()
try:
    run = runs.start([sys.executable, "-c", sys.argv[2], "2", "2", sys.argv[2]])
    print(run.pid, flush=True)
    run.wait()
finally:
    runs.stop()
"""


def test_a_harness_cut_by_sigterm_ends_its_runs_and_their_descendants():
    harness = subprocess.Popen(
        [sys.executable, "-c", HARNESS, str(ROOT / "benchmarks"), TREE], stdout=subprocess.PIPE, text=True
    )
    run = psutil.Process(int(harness.stdout.readline()))
    deadline = time.monotonic() + 60
    while len(run.children(recursive=True)) < 3:  # the run's trainer and its 2 ranks
        assert time.monotonic() < deadline, "the process tree did not come up"
        time.sleep(0.05)
    tree = [run, *run.children(recursive=True)]
    assert os.getpgid(run.pid) != os.getpgid(harness.pid)  # out of reach of a signal to the group
    harness.send_signal(signal.SIGTERM)
    assert harness.wait(timeout=60) == 128 + signal.SIGTERM
    _, alive = psutil.wait_procs(tree, timeout=30)
    assert not alive, f"left running: {[p.pid for p in alive]}"
