"""A trainer's recorded error (OOM included): retried once, then deterministic; counted only
when this launch (or this SLURM job) wrote it."""

from __future__ import annotations

import os

import pytest
import torch

from rlfleet.errors import DeterministicError
from rlfleet.store import RunStore
from rlfleet.trainer.files import read_trainer_error
from rlfleet.trainer.loop import record_trainer_error


def test_oom_is_retried_once_then_deterministic(tmp_path):
    store = RunStore(tmp_path)
    record_trainer_error(store, 5, torch.OutOfMemoryError("CUDA out of memory"))
    assert read_trainer_error(store)["deterministic"] is False
    record_trainer_error(store, 5, torch.OutOfMemoryError("CUDA out of memory"))
    assert read_trainer_error(store)["deterministic"] is True
    record_trainer_error(store, 6, RuntimeError("NCCL timeout"))
    assert read_trainer_error(store) | {"message": ""} == {
        "pid": os.getpid(),
        "job": os.environ.get("SLURM_JOB_ID"),
        "step": 6,
        "type": "RuntimeError",
        "message": "",
        "deterministic": False,
    }


def test_a_multi_node_trainer_fails_on_its_own_jobs_error_not_on_the_one_a_resume_inherits(
    tmp_path, monkeypatch
):
    """Trainer ranks of a SLURM job are not the controller's children: their error file is the
    only sign of a failure, and a rerun resumes in the same store, where the failed job's stays."""
    from rlfleet.config.models import ModelConfig, TrainerJobConfig
    from rlfleet.trainer.launch import ExternalTrainer

    store = RunStore(tmp_path)
    trainer = ExternalTrainer(
        TrainerJobConfig(model=ModelConfig(path="m"), output_dir=str(tmp_path)), tmp_path
    )
    monkeypatch.setenv("SLURM_JOB_ID", "41")
    record_trainer_error(store, 5, ValueError("shape mismatch"))  # the failed job's
    monkeypatch.setenv("SLURM_JOB_ID", "42")  # the rerun, resuming at step 5
    assert trainer.failure(store, 5) is None
    record_trainer_error(store, 5, ValueError("shape mismatch"))
    assert isinstance(trainer.failure(store, 5), DeterministicError)
    assert trainer.failure(store, 6) is None  # an error of an earlier step is not this step's


def test_torchrun_ranks_fail_fast_on_the_deterministic_error_they_recorded(tmp_path, monkeypatch):
    """The SFT task's torchrun ranks: a non-zero exit is a TrainerDied (retried), unless a rank
    recorded an error that will recur in this launch; then a DeterministicError leads with it."""
    import sys

    from rlfleet.trainer import launch

    store = RunStore(tmp_path)
    record_trainer_error(store, 1, ValueError("an earlier attempt's"))  # not this launch's
    child = "import sys; sys.exit(1)"
    monkeypatch.setattr(launch, "torchrun_cmd", lambda nproc, argv: [sys.executable, "-c", child])
    with pytest.raises(launch.TrainerDied, match="sft exited with code 1"):
        launch.run_torchrun(["sft"], ["0", "1"], str(tmp_path), "sft")
    child = (
        "import sys; from rlfleet.store import RunStore; from rlfleet.trainer.loop import "
        f"record_trainer_error as r; r(RunStore({str(tmp_path)!r}), 3, ValueError('bad row 7')); sys.exit(1)"
    )
    with pytest.raises(DeterministicError, match="ValueError at step 3: bad row 7\nsft exited with code 1"):
        launch.run_torchrun(["sft"], ["0", "1"], str(tmp_path), "sft")


def test_a_relaunched_trainer_fails_fast_on_the_same_oom_at_the_same_step(tmp_path, monkeypatch):
    """The RL trainer runs under rlfleet.guard, so its pid is not the launcher's child's: the error
    file counts when this launch wrote it. The first OOM is retried (a relaunch); the same OOM at
    the same step after the relaunch is a DeterministicError, not a third launch."""
    import sys

    from rlfleet.config.models import ModelConfig, TrainerJobConfig
    from rlfleet.trainer import launch

    store = RunStore(tmp_path)
    record_trainer_error(store, 1, ValueError("an earlier run's"))  # left in the store, not this launch's
    oom = (
        "import sys, torch; from rlfleet.store import RunStore; from rlfleet.trainer.loop import "
        f"record_trainer_error as r; r(RunStore({str(tmp_path)!r}), 3, torch.OutOfMemoryError('CUDA out of memory'));"
        " sys.exit(1)"
    )
    children = iter(["import sys; sys.exit(1)", oom, oom])
    monkeypatch.setattr(
        launch, "python_module_cmd", lambda module, args: [sys.executable, "-c", next(children)]
    )
    trainer = launch.TrainerProcess(
        TrainerJobConfig(model=ModelConfig(path="m"), output_dir=str(tmp_path)), tmp_path / "t.toml"
    )

    def launch_and_fail() -> Exception | None:
        trainer.ensure()
        trainer.process.proc.wait()
        return trainer.failure(store, 3)

    assert type(launch_and_fail()) is launch.TrainerDied  # exited, recorded nothing new
    assert type(launch_and_fail()) is launch.TrainerDied  # the first OOM: a relaunch may fit
    error = launch_and_fail()
    assert isinstance(error, DeterministicError)
    assert str(error).startswith("OutOfMemoryError at step 3: CUDA out of memory")
    trainer.stop()


def test_a_trainer_that_dies_between_steps_is_relaunched_by_its_watch(tmp_path, monkeypatch):
    """Killed while no train task waits on it (waiting for its next batch, as a GPU run's trainer
    mostly is), the trainer is relaunched by its watch within about a second, not when the next
    step's task finds it dead; the next task reports the relaunch with the exit code."""
    import signal
    import sys

    from rlfleet.config.models import ModelConfig, TrainerJobConfig
    from rlfleet.procs import wait_until
    from rlfleet.store import layout
    from rlfleet.trainer import launch

    up = (  # a trainer that loaded its model, then waits
        "import time; from rlfleet.store import RunStore, layout; "
        f"RunStore({str(tmp_path)!r}).write_json(layout.TRAINER_UP, {{'at': time.time()}}); time.sleep(600)"
    )
    monkeypatch.setattr(launch, "python_module_cmd", lambda module, args: [sys.executable, "-c", up])
    trainer = launch.TrainerProcess(
        TrainerJobConfig(model=ModelConfig(path="m"), output_dir=str(tmp_path)), tmp_path / "t.toml"
    )
    store = RunStore(tmp_path)
    try:
        trainer.ensure()
        first = trainer.process
        wait_until(lambda: not trainer.starting(store), 30, 0.05, "the trainer to come up")
        os.kill(first.pid, signal.SIGKILL)
        wait_until(lambda: trainer.process is not first, 30, 0.05, "the watch to relaunch the trainer")
        assert trainer.process.alive() and trainer.take_relaunched() == [-signal.SIGKILL]
        assert trainer.take_relaunched() == []  # reported once
        assert store.exists(layout.TRAINER_UP)
    finally:
        trainer.stop()


def test_a_step_recorded_just_before_the_trainer_died_is_done_not_a_death():
    """wait_step's wait (procs.wait_until): the record is not there at the first look, the trainer is
    dead at the next (it wrote the record and was killed between the two). The step is done, and the
    next task that needs the trainer relaunches it and replays the step (tests/test_faults.py, nccl)."""
    from rlfleet.procs import wait_until

    looks = iter([None, {"step": 2}])
    dead = []
    assert wait_until(lambda: next(looks), 5, 0, abort=lambda: dead.append(1) or "the trainer died") == {
        "step": 2
    }
    assert dead == [1]
    with pytest.raises(RuntimeError, match="the trainer died"):  # and a death with no record is one
        wait_until(lambda: None, 5, 0, abort=lambda: "the trainer died")
