"""One controller per run: the run lock."""

from __future__ import annotations

import os

import pytest

from rlfleet.config.loader import ConfigError
from rlfleet.runs.lock import acquire_run_lock, release_run_lock
from rlfleet.store import RunStore


def test_one_controller_per_run(tmp_path):
    store = RunStore(tmp_path)
    acquire_run_lock(store)
    acquire_run_lock(store)  # re-entrant for the same process
    lock = store.local_path("run", "controller.pid")
    parent = os.getppid()
    from rlfleet.procs import write_pidfile

    write_pidfile(lock, parent)  # a live process that is not us holds the run
    with pytest.raises(ConfigError, match=f"pid {parent}"):
        acquire_run_lock(store)
    lock.write_text("999999999\n0\n")  # a dead controller's lock is stale, not a block
    acquire_run_lock(store)
    release_run_lock(store)
    assert not lock.exists()
