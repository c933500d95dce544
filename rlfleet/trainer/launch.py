"""Run the long-lived trainer as a child process and wait on its steps while watching it live."""

from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path
from typing import Any

from rlfleet.config.models import TrainerJobConfig
from rlfleet.errors import DeterministicError, TransientError
from rlfleet.fleet.warm import claim_from_fleet
from rlfleet.procs import RANK_LOGS, ManagedProcess, python_module_cmd, wait_until
from rlfleet.progress import Progress
from rlfleet.store import RunDir, RunStore, local_dir, run_store
from rlfleet.store.layout import TRAINER_UP, rank_log
from rlfleet.store.records import TrainerMetrics, read_metrics
from rlfleet.trainer.files import poll_interval, read_trainer_error

log = logging.getLogger("rlfleet.trainer")

WATCH_INTERVAL_S = 1.0  # how often a launched trainer's process is looked at between steps


def torchrun_cmd(nproc: int, cli_args: list[str]) -> list[str]:
    """`torchrun --standalone` on this node, one rank per GPU; rank 0's output goes to our log
    (and the others' to their own files, where the launcher sets RLFLEET_RANK_LOGS)."""
    import sys

    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={nproc}",
        "-m",
        "rlfleet.cli",
        *cli_args,
    ]


class TrainerDied(TransientError):
    """The trainer process exited; a relaunch resumes it from the latest checkpoint."""


def death_error(error: dict[str, Any] | None, msg: str) -> Exception:
    """A dead trainer's error: DeterministicError (no retry) when the error it recorded
    (`loop.record_trainer_error`) will recur, with its message first; else a TrainerDied."""
    if error is not None and error["deterministic"]:
        return DeterministicError(f"{error['type']} at step {error['step']}: {error['message']}\n{msg}")
    return TrainerDied(msg)


def run_torchrun(argv: list[str], gpu_ids: list[str], output_dir: str, name: str) -> None:
    """`rlfleet <argv>` as torchrun ranks over `gpu_ids`, to completion (rank R logs to
    `logs/<name>/rank_R.log`). A non-zero exit is a TrainerDied, and the engine resumes from its
    latest checkpoint, so a retry loses at most one checkpoint interval; unless a rank recorded a
    deterministic error this time (`death_error`)."""
    store = run_store(output_dir)
    before = read_trainer_error(store)
    here = RunDir(local_dir(output_dir))
    logs = here.logs(name)
    proc = ManagedProcess(
        name=name,
        cmd=torchrun_cmd(len(gpu_ids), argv),
        log_path=rank_log(logs, 0),
        pidfile=here.pidfile(name),
        env={
            "CUDA_VISIBLE_DEVICES": ",".join(gpu_ids),
            "HF_HUB_OFFLINE": "1",
            "PYTHONUNBUFFERED": "1",
            RANK_LOGS: str(logs),
        },
    ).start()
    try:
        rc = proc.proc.wait()
    finally:
        proc.stop()
    if rc != 0:
        error = read_trainer_error(store)
        msg = f"{name} exited with code {rc}; log tail:\n{proc.log_tail()}"
        raise death_error(error if error != before else None, msg)


class TrainerProcess:
    def __init__(self, cfg: TrainerJobConfig, config_path: Path):
        self.cfg = cfg
        self.config_path = config_path
        self.process: ManagedProcess | None = None
        self.launches = 0
        self.error_before: dict[str, Any] | None = None  # the error file as this launch found it
        self.launched_at = 0.0  # time.time() of the last launch
        self.up = False  # the last launch has its model (it wrote TRAINER_UP)
        self.progress = Progress()  # the run's, once a RunHandles adopts the trainer (progress.py)
        self.lock = threading.RLock()  # the watch and the train task both relaunch
        self.relaunched: list[int | None] = []  # exit codes the watch replaced, until a task reports them
        self._watcher: threading.Thread | None = None
        self._stop = threading.Event()
        self.waiting = 0  # train tasks waiting on a step: a death then is theirs to retry

    def ensure(self) -> int | None:
        """Start the trainer if it is not running; a fresh one resumes from the latest checkpoint.
        Returns the exit code of the trainer it replaces (a relaunch), else None."""
        with self.lock:
            died = self._ensure()
            if self._watcher is None and not self._stop.is_set():  # one watch, however many callers
                self._watcher = threading.Thread(
                    target=self._watch, name="rlfleet-trainer-watch", daemon=True
                )
                self._watcher.start()
        return died

    def take_relaunched(self) -> list[int | None]:
        """Exit codes of the trainers the watch replaced since the last call (a task reports them)."""
        with self.lock:
            out, self.relaunched = self.relaunched, []
        return out

    def _watch(self) -> None:
        """Relaunch a trainer that died between steps within about `WATCH_INTERVAL_S`, so it loads
        while the next step samples, instead of when the next `train` task finds it dead. A death
        while a `train` task waits is that task's (it fails and its retry relaunches), and one
        whose recorded error will recur is left to it to raise."""
        store = run_store(self.cfg.output_dir)
        while not self._stop.wait(WATCH_INTERVAL_S):
            p = self.process
            if p is None or self.waiting or p.alive() or p.returncode() == 0:  # 0: it finished its steps
                continue
            # one that never came up failed its start (a task retries that, not a loop here)
            if not self._came_up(store) or isinstance(self.failure(store, 0), DeterministicError):
                continue
            log.warning("trainer (pid %d) exited with code %s: relaunching it", p.pid, p.returncode())
            try:
                with self.lock:
                    if self._stop.is_set() or self.process is not p:
                        continue  # stopped, or the train task relaunched it meanwhile
                    self.relaunched.append(self._ensure())
            except DeterministicError:
                return  # the run stalled and failed: relaunch nothing
            except Exception as e:  # noqa: BLE001 - the next train task tries again
                log.warning("relaunching the trainer failed (%s: %s)", type(e).__name__, e)

    def _ensure(self) -> int | None:
        if self.process is not None and self.process.alive():
            return None
        self.progress.check()  # a stall failed the run: relaunch nothing
        died = None if self.process is None else self.process.returncode()
        here = RunDir(local_dir(self.cfg.output_dir))  # logs and pidfiles stay on this machine
        env = {"CUDA_VISIBLE_DEVICES": ",".join(self.cfg.gpu_ids)} if self.cfg.gpu_ids else {}
        self.launches += 1
        self.launched_at, self.up = time.time(), False
        self.error_before = read_trainer_error(run_store(self.cfg.output_dir))
        args = ["trainer", "@", str(self.config_path)]
        n = len(self.cfg.gpu_ids)
        logs = here.logs("trainer")
        env |= {"HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1", RANK_LOGS: str(logs)}
        warm = (
            claim_from_fleet(
                self.cfg.fleet,
                self.cfg.output_dir,
                self.cfg.gpu_ids,
                self.config_path,
                rank_log(logs, 0),
                here.pidfile("trainer"),
                env,
            )
            if self.cfg.fleet and n <= 1
            else None
        )
        self.process = (
            warm
            or ManagedProcess(
                name="trainer",
                cmd=torchrun_cmd(n, args) if n > 1 else python_module_cmd("rlfleet.cli", args),
                log_path=rank_log(logs, 0),
                pidfile=here.pidfile("trainer"),
                env=env,
            ).start()
        )
        return died

    def wait_step(self, store: RunStore, step: int, timeout_s: float) -> TrainerMetrics:
        """Block until step N's metrics record exists; notice a dead trainer within a poll interval.

        A death is a TrainerDied (transient: the retry relaunches from the latest checkpoint)
        unless the trainer recorded an error that will recur (DeterministicError, no retry).
        """
        start = time.monotonic()
        self.waiting += 1
        with self.progress.waiting(f"train-{step}", f"the trainer's step {step}"):
            try:
                metrics = wait_until(
                    lambda: read_metrics(store, step),
                    timeout_s,
                    poll_interval(store, self.cfg.trainer.poll_interval_s),
                    abort=lambda: self.progress.stall or self.failure(store, step),
                    on_timeout=lambda: TimeoutError(f"trainer step {step} not done after {timeout_s:.0f}s"),
                )
            finally:
                self.waiting -= 1
        self.progress.trainer_stepped(step)
        metrics["wait_seconds"] = time.monotonic() - start
        return metrics

    def starting(self, store: RunStore) -> bool:
        """Whether the trainer this controller launched last is loading its model (it has not
        written `TRAINER_UP` since): not a stall, however long it takes."""
        p = self.process
        if self.up or p is None or not p.alive():
            return False
        return not self._came_up(store)

    def _came_up(self, store: RunStore) -> bool:
        """Whether the last launch loaded its model (wrote `TRAINER_UP`)."""
        if not self.up and store.exists(TRAINER_UP):
            self.up = store.read_json(TRAINER_UP)["at"] >= self.launched_at
        return self.up

    def failure(self, store: RunStore, step: int) -> Exception | None:
        p = self.process
        if p is None or p.alive():
            return None
        # this launch's error, not one a relaunch inherits (its pid is the trainer's, under the guard)
        error = read_trainer_error(store)
        msg = f"trainer exited with code {p.returncode()}; log tail:\n{p.log_tail()}"
        return death_error(error if error != self.error_before else None, msg)

    def stop(self) -> None:
        self._stop.set()
        with self.lock:
            if self.process is not None:
                self.process.stop()
                self.process = None


class ExternalTrainer(TrainerProcess):
    """Trainer ranks a SLURM job started on its train nodes (torchrun): waited on, never launched.

    The controller cannot see their processes; a rank that fails records its error in the store
    (`record_trainer_error`), which fails the step here instead of waiting out the timeout.
    """

    def ensure(self) -> int | None:
        return None

    def failure(self, store: RunStore, step: int) -> Exception | None:
        """The error a rank of this SLURM job recorded at `step` or later; an earlier job's (the
        run this one resumes) is not this trainer's."""
        error = read_trainer_error(store)
        if (
            error is None
            or error.get("job") != os.environ.get("SLURM_JOB_ID")
            or error.get("step", -1) < step
        ):
            return None
        msg = (
            f"trainer on the train nodes failed: {error['type']} at step {error['step']}: {error['message']}"
        )
        return DeterministicError(msg) if error["deterministic"] else TrainerDied(msg)
