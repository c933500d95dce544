"""Checkpoints as a resume reads them: the newest complete one wins, a corrupt one falls back
to the one before with a warning, weights fall back to a checkpoint's model, and `rlfleet status`
names the resume point."""

from __future__ import annotations

import logging

import pytest
import torch
from transformers import AutoModelForCausalLM

from rlfleet.runs.status import spans, status
from rlfleet.store import RunStore
from rlfleet.trainer.checkpoint import CheckpointManager
from rlfleet.trainer.files import latest_checkpoint
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


def test_status_reports_resume_point(store_with_checkpoints):
    s = status(store_with_checkpoints.url)
    assert s["checkpoints"] == "1,3" and s["resume_checkpoint"] == 3 and s["resume_step"] == 4
    assert spans([0, 1, 2, 5, 7, 8]) == "0-2,5,7-8"


def test_a_rerun_with_another_model_is_refused_before_anything_starts(store_with_checkpoints, tmp_path):
    """The run's checkpoint is the tiny Llama; a rerun that names a wider model, or LoRA, is refused
    by the launch checks, naming what differs and a way on, and the run store is left as it was."""
    from rlfleet.config.loader import ConfigError
    from rlfleet.runs.configs import resolve
    from rlfleet.trainer.tiny import make_tiny_model
    from tests.helpers import rl_config

    out = store_with_checkpoints.local_dir
    before = sorted(p.relative_to(out) for p in out.rglob("*"))
    wider = make_tiny_model(tmp_path / "wider", seed=0, hidden=256)
    with pytest.raises(ConfigError) as refused:
        resolve(rl_config(wider, out, max_steps=6))
    said = str(refused.value)
    assert "is not the model of the run" in said and "hidden_size 128 there, 256 here" in said
    assert "another output_dir; nothing in" in said
    ckpt_model = out / "checkpoints" / "step_3" / "model"
    with pytest.raises(ConfigError, match="trainer.lora: the run in .* trained the full model"):
        resolve(rl_config(ckpt_model, out, max_steps=6, **{"trainer.lora.rank": "8"}))
    assert sorted(p.relative_to(out) for p in out.rglob("*")) == before
