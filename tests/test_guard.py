"""`rlfleet.guard`: what runs under it never outlives it, even when the guard is killed outright."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import psutil

CHILD = "import os, sys, time; open(sys.argv[1] + '.tmp', 'w').write(str(os.getpid())); os.rename(sys.argv[1] + '.tmp', sys.argv[1]); time.sleep(600)"


def start(pidfile) -> subprocess.Popen:
    """The guard as ManagedProcess starts it: the leader of its own process group."""
    cmd = [sys.executable, "-m", "rlfleet.guard", sys.executable, "-c", CHILD, str(pidfile)]
    return subprocess.Popen(cmd, start_new_session=True)


def child_pid(pidfile, guard: subprocess.Popen, timeout_s: float = 30.0) -> int:
    deadline = time.monotonic() + timeout_s
    while not pidfile.exists():
        assert guard.poll() is None, "the guard exited before its child started"
        assert time.monotonic() < deadline, "the child never started"
        time.sleep(0.05)
    return int(pidfile.read_text())


def test_a_guard_killed_outright_takes_its_child_with_it(tmp_path):
    """SIGKILL runs no handler in the guard: the kernel's parent-death signal kills the child."""
    pidfile = tmp_path / "child.pid"
    guard = start(pidfile)
    child = psutil.Process(child_pid(pidfile, guard))
    assert child.ppid() == guard.pid
    os.kill(guard.pid, signal.SIGKILL)
    guard.wait()
    child.wait(timeout=10)  # raises psutil.TimeoutExpired if the child outlived its guard
    assert not child.is_running()


def test_sigterm_takes_the_group_down_guard_included(tmp_path):
    """The owner's SIGTERM: the group gets it, then the guard SIGKILLs the group, itself included."""
    pidfile = tmp_path / "child.pid"
    guard = start(pidfile)
    child = psutil.Process(child_pid(pidfile, guard))
    guard.send_signal(signal.SIGTERM)
    assert guard.wait(timeout=30) == -signal.SIGKILL
    child.wait(timeout=10)


def test_a_child_killed_outright_is_the_guards_exit_too(tmp_path):
    """The owner sees how the child died: a SIGKILLed child makes the guard die of SIGKILL, not
    exit 1 from a handler that SIGKILL cannot have."""
    pidfile = tmp_path / "child.pid"
    guard = start(pidfile)
    os.kill(child_pid(pidfile, guard), signal.SIGKILL)
    assert guard.wait(timeout=30) == -signal.SIGKILL


# a child that starts a grandchild in the group (as vLLM's API server forks its engine core, which
# keeps the server's listening socket), then sleeps; each writes its pid as CHILD does
PARENT = (
    "import os, subprocess, sys, time; "
    "subprocess.Popen([sys.executable, '-c', sys.argv[2], sys.argv[1] + '.grand']); "
    "open(sys.argv[1] + '.tmp', 'w').write(str(os.getpid())); os.rename(sys.argv[1] + '.tmp', sys.argv[1]); "
    "time.sleep(600)"
)


def test_what_a_killed_child_leaves_in_the_group_dies_with_it(tmp_path):
    """The API server SIGKILLed, its engine core (a grandchild of the guard, reparented to init)
    must not outlive the guard: it held the replica's port, and requests hung in its backlog."""
    pidfile = tmp_path / "child.pid"
    cmd = [sys.executable, "-m", "rlfleet.guard", sys.executable, "-c", PARENT, str(pidfile), CHILD]
    guard = subprocess.Popen(cmd, start_new_session=True)
    child = child_pid(pidfile, guard)
    grandchild = psutil.Process(child_pid(tmp_path / "child.pid.grand", guard))
    os.kill(child, signal.SIGKILL)
    assert guard.wait(timeout=30) == -signal.SIGKILL
    grandchild.wait(timeout=10)  # raises psutil.TimeoutExpired if it outlived the guard


def test_a_rerun_reaps_what_a_killed_guard_left_in_its_group(tmp_path):
    """The guard and its owner killed at once: its child dies with it (parent-death signal) but a
    grandchild, vLLM's engine core, lives on in the guard's group holding the replica's port, and
    every rerun failed to start on it (the chaos soak). The rerun's reap kills the group."""
    from rlfleet.procs import reap_pidfile, write_pidfile

    pidfile = tmp_path / "child.pid"
    cmd = [sys.executable, "-m", "rlfleet.guard", sys.executable, "-c", PARENT, str(pidfile), CHILD]
    guard = subprocess.Popen(cmd, start_new_session=True)
    run_pidfile = tmp_path / "inference_0.pid"
    write_pidfile(run_pidfile, guard.pid)
    child_pid(pidfile, guard)
    grandchild = psutil.Process(child_pid(tmp_path / "child.pid.grand", guard))
    os.kill(guard.pid, signal.SIGKILL)
    guard.wait()
    assert grandchild.is_running() and grandchild.ppid() != guard.pid  # the orphan
    reap_pidfile(run_pidfile)
    grandchild.wait(timeout=10)  # raises psutil.TimeoutExpired if the reap left it
    assert not run_pidfile.exists()
