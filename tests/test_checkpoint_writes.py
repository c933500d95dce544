"""Checkpoints written in the background while the trainer goes on."""

from __future__ import annotations

import time

import pytest
import torch
from transformers import AutoModelForCausalLM

from rlfleet.store import RunStore
from rlfleet.trainer.checkpoint import CheckpointManager
from rlfleet.trainer.files import latest_checkpoint
from rlfleet.trainer.parallel import Parallel


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
