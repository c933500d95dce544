"""One controller per run: a pidfile in the run's local directory."""

from __future__ import annotations

import os
from pathlib import Path

from rlfleet.config.loader import ConfigError
from rlfleet.procs import pid_alive, reap_pidfile, write_pidfile
from rlfleet.sentinel import watch
from rlfleet.store import RunDir, RunStore, local_dir


def acquire_run_lock(store: RunStore) -> None:
    """One controller per run: a second one would reap the first one's trainer and servers.

    For a remote store the lock lives in this machine's cache, so it guards this machine only.
    """
    check_not_running(store.local_dir, store.url)
    write_pidfile(RunDir(store.local_dir).pidfile("controller"), os.getpid())


def check_not_running(local: str | Path, url: str) -> None:
    """Refuse a second controller of a run while its first one lives, naming it; checked before
    the run's ports, which that controller's replicas hold (the reason, not the symptom)."""
    owner = pid_alive(RunDir(local).pidfile("controller"))
    if owner is not None and owner != os.getpid():
        raise ConfigError(
            f"output_dir: the run in {url} is already running (controller pid {owner}); "
            "stop it, or give this run another output_dir"
        )


def adopt(store: RunStore, name: str, pid: int) -> None:
    """Name a process this controller started by other means than the run's launchers (Prefect's
    temporary server) to the sentinel, which takes it down when the controller dies, and in the
    run's pidfiles, for a rerun's reap (`reap_earlier_life`) where no sentinel ran (not Linux)."""
    watch(pid)
    write_pidfile(RunDir(store.local_dir).pidfile(name), pid)


def release_run_lock(store: RunStore) -> None:
    RunDir(store.local_dir).pidfile("controller").unlink(missing_ok=True)


def reap_earlier_life(output_dir: str) -> None:
    """Kill what a killed controller of this run left (its trainer and servers, named by the run's
    pidfiles) and wait for them to exit, so that a rerun finds their ports free: their deaths follow
    the controller's only as fast as signals travel. Nothing while a live controller owns the run."""
    run = RunDir(local_dir(output_dir))
    lock = run.pidfile("controller")
    if pid_alive(lock) is not None:
        return
    for pidfile in run.pidfiles():
        if pidfile != lock:
            reap_pidfile(pidfile)
