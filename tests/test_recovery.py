"""Recovery building blocks without vLLM: checkpoint fallback, retry classification, run lock."""

from __future__ import annotations

import logging
import os
import time

import httpx
import pytest
import torch
from transformers import AutoModelForCausalLM

from rlfleet.config.loader import ConfigError
from rlfleet.errors import DeterministicError, TransientError, is_transient
from rlfleet.runs.lock import acquire_run_lock, release_run_lock
from rlfleet.runs.status import spans, status
from rlfleet.store import RunStore
from rlfleet.trainer.checkpoint import CheckpointManager
from rlfleet.trainer.files import latest_checkpoint, read_trainer_error
from rlfleet.trainer.loop import record_trainer_error
from rlfleet.trainer.parallel import Parallel
from rlfleet.trainer.resume import resume_step
from rlfleet.weights.filesystem import publish_weights
from rlfleet.weights.tickets import newest_weights


@pytest.fixture
def store_with_checkpoints(tiny_model, tmp_path):
    store = RunStore(tmp_path / "run")
    model = AutoModelForCausalLM.from_pretrained(tiny_model)
    opt = torch.optim.AdamW(model.parameters())
    ckpt = CheckpointManager(store, Parallel(), model, opt, str(tiny_model), keep=0, interval=2)
    for step in (1, 3):
        ckpt.save(step, {"next_step": step + 1}, last=True)
    ckpt.close()
    return store


def test_resume_uses_latest_checkpoint(store_with_checkpoints):
    assert latest_checkpoint(store_with_checkpoints)["cursor"] == {"next_step": 4}
    assert resume_step(store_with_checkpoints) == 4


@pytest.mark.parametrize("damage", ["truncate", "flip", "no_manifest"])
def test_corrupt_checkpoint_falls_back_with_a_warning(store_with_checkpoints, caplog, damage):
    store = store_with_checkpoints
    ckpt = store.local_path("checkpoints", "step_3")
    target = ckpt / "optimizer.pt"
    data = target.read_bytes()
    if damage == "truncate":
        target.write_bytes(data[: len(data) // 2])
    elif damage == "flip":
        target.write_bytes(data[:-1] + bytes([data[-1] ^ 0xFF]))
    else:
        (ckpt / "manifest.json").unlink()
    with caplog.at_level(logging.WARNING):
        assert latest_checkpoint(store)["step"] == 1
    assert resume_step(store) == 2
    if damage != "no_manifest":  # an unpublished directory is simply not a checkpoint
        assert "checkpoint step 3 is corrupt" in caplog.text


@pytest.mark.parametrize("damage", ["none", "truncate", "no_manifest", "flip"])
def test_broadcast_uses_newest_complete_weights(store_with_checkpoints, tiny_model, caplog, damage):
    store = store_with_checkpoints
    model = AutoModelForCausalLM.from_pretrained(tiny_model)
    publish_weights(store, 4, model, str(tiny_model))
    snap = store.local_path("weights", "step_4")
    if damage == "truncate":
        f = next(snap.glob("*.safetensors"))
        f.write_bytes(f.read_bytes()[:100])
    elif damage == "no_manifest":
        (snap / "manifest.json").unlink()
    elif damage == "flip":  # same size, other bytes: only the (resume path's) checksum can tell
        f = next(snap.glob("*.safetensors"))
        data = bytearray(f.read_bytes())
        data[len(data) // 2] ^= 0xFF
        f.write_bytes(bytes(data))
        assert newest_weights(store, 4, checksum=False) == (4, str(snap))  # the broadcast's hot path
    with caplog.at_level(logging.WARNING):
        step, path = newest_weights(store, 4)
    if damage == "none":
        assert (step, path) == (4, str(snap))
        assert not caplog.text
    else:  # falls back to the step-3 checkpoint's model, saying so
        assert (step, path) == (3, str(store.local_path("checkpoints", "step_3") / "model"))
        assert "using step 3's" in caplog.text
    with pytest.raises(FileNotFoundError):
        newest_weights(store, 0)


@pytest.mark.parametrize(
    ("exc", "transient"),
    [
        (httpx.ConnectError("refused"), True),
        (TimeoutError(), True),
        (TransientError("replica restarting"), True),
        (RuntimeError("unknown"), True),
        (DeterministicError("bad request"), False),
        (ValueError("shape mismatch"), False),
        (ConfigError("bad field"), False),
        (KeyError("missing"), False),
    ],
)
def test_retry_classification(exc, transient):
    assert is_transient(exc) is transient


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


def test_prefect_retries_transient_failures_only(prefect_api):
    from prefect import flow, task

    from rlfleet.config.models import RLConfig
    from rlfleet.tasks.rl import retry_options

    cfg = RLConfig.model_validate({"model": {"path": "m"}, "tasks": {"retries": 2, "retry_delay_s": 0}})
    calls: list[str] = []

    @task
    def flaky(kind: str) -> str:
        calls.append(kind)
        if kind == "transient" and calls.count(kind) < 3:
            raise httpx.ConnectError("connection refused")
        if kind == "deterministic":
            raise ValueError("wrong shape")
        return "ok"

    @flow
    def run(kind: str):
        return flaky.with_options(**retry_options(cfg))(kind)

    assert run("transient") == "ok"
    assert calls.count("transient") == 3
    with pytest.raises(ValueError, match="wrong shape"):
        run("deterministic")
    assert calls.count("deterministic") == 1


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


def test_status_reports_resume_point(store_with_checkpoints):
    s = status(store_with_checkpoints.url)
    assert s["checkpoints"] == "1,3" and s["resume_checkpoint"] == 3 and s["resume_step"] == 4
    assert spans([0, 1, 2, 5, 7, 8]) == "0-2,5,7-8"


def test_background_checkpoint_holds_the_state_at_save_and_failures_surface(
    tiny_model, tmp_path, monkeypatch
):
    """The trainer goes on while a checkpoint is written: the checkpoint is the state at `save`,
    not at the write; a failed write raises in the trainer's thread, naming the step."""
    import threading

    store = RunStore(tmp_path / "run")
    model = AutoModelForCausalLM.from_pretrained(tiny_model)
    opt = torch.optim.AdamW(model.parameters())
    model(torch.tensor([[1, 2, 3]]), labels=torch.tensor([[1, 2, 3]])).loss.backward()
    opt.step()
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    saved_opt = [s["exp_avg"].clone() for s in opt.state.values()]

    release, real_publish = threading.Event(), store.publish_dir
    monkeypatch.setattr(store, "publish_dir", lambda *a, **k: release.wait(30) and real_publish(*a, **k))
    ckpt = CheckpointManager(store, Parallel(), model, opt, str(tiny_model), keep=0, interval=1)
    ckpt.save(1, {"next_step": 2})
    with torch.no_grad():  # the next step changes everything while the write is held back
        for p in model.parameters():
            p.add_(1.0)
        for s in opt.state.values():
            s["exp_avg"].add_(1.0)
    ckpt.check()  # still in flight: nothing to raise
    assert store.manifest("checkpoints/step_1") is None
    release.set()
    ckpt.wait()

    back = AutoModelForCausalLM.from_pretrained(store.local_path("checkpoints", "step_1", "model"))
    for name, value in back.state_dict().items():
        assert torch.equal(value, saved[name]), name
    state = torch.load(store.local_path("checkpoints", "step_1", "optimizer.pt"), weights_only=True)["state"]
    assert all(torch.equal(state[i]["exp_avg"], saved_opt[i]) for i in range(len(saved_opt)))
    assert latest_checkpoint(store)["cursor"] == {"next_step": 2}

    def broken(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(store, "publish_dir", broken)
    ckpt.save(3, {"next_step": 4})
    with pytest.raises(RuntimeError, match="writing checkpoint 3 failed: disk full"):
        for _ in range(100):
            ckpt.check()
            time.sleep(0.05)
    ckpt.close()
    assert latest_checkpoint(store)["step"] == 1
