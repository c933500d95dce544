"""The GPU-scale trainer paths, on CPU: chunked LM head, activation checkpointing, and FSDP2 over
gloo with two torchrun ranks (same loss as one process; a checkpoint saved by 2 ranks resumes in 1)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from rlfleet.config.deployment import DeploymentConfig
from rlfleet.config.gpu_defaults import PACKED_ROW_TOKENS, gpu_defaults
from rlfleet.config.models import ModelConfig, RLConfig, TrainerJobConfig
from rlfleet.config.placement import assign_gpus
from rlfleet.store import RunStore, layout
from rlfleet.trainer.checkpoint import optimizer_steps
from rlfleet.trainer.launch import TrainerProcess, torchrun_cmd
from rlfleet.trainer.lm_head import chunked_logprobs, token_logprobs
from rlfleet.trainer.parallel import apply_activation_checkpointing, apply_compile
from rlfleet.trainer.train import Policy, load_model
from tests.helpers import dcp_ranks
from tests.synthetic_run import logged_losses, publish_steps, run_job


def test_chunked_logprobs_match_full_logits_values_and_grads():
    torch.manual_seed(0)
    h = torch.randn(3, 7, 16, dtype=torch.float64, requires_grad=True)
    w = torch.randn(50, 16, dtype=torch.float64, requires_grad=True)
    t = torch.randint(0, 50, (3, 7))
    g = torch.randn(3, 7, dtype=torch.float64)
    lp, ent = chunked_logprobs(h, w, t, chunk=4, temperature=0.7)  # 21 tokens: chunks of 4 and a ragged 1
    gh, gw = torch.autograd.grad((lp * g).sum(), (h, w))

    logits = (h @ w.t()) / 0.7
    ref = logits.log_softmax(-1).gather(-1, t[..., None])[..., 0]
    rh, rw = torch.autograd.grad((ref * g).sum(), (h, w))
    assert torch.allclose(lp.double(), ref, atol=1e-5)
    assert torch.allclose(gh, rh, atol=1e-5) and torch.allclose(gw, rw, atol=1e-5)
    ref_ent = -(logits.softmax(-1) * logits.log_softmax(-1)).sum(-1)
    assert torch.allclose(ent.double(), ref_ent, atol=1e-4)
    assert torch.allclose(token_logprobs(h @ w.t(), t, 0.7).double(), ref, atol=1e-5)


@pytest.mark.parametrize("mode", ["full", "selective"])
def test_activation_checkpointing_keeps_loss_and_grads(tiny_model, mode):
    ids = torch.randint(4, 100, (2, 24), generator=torch.Generator().manual_seed(0))

    def loss_and_grads(ac: str, chunk: int):
        policy = Policy(load_model(str(tiny_model), "float32", torch.device("cpu")), lm_head_chunk=chunk)
        apply_activation_checkpointing(policy, ac)
        lp, _ = policy(ids)
        lp.sum().backward()
        return lp.detach(), [p.grad.clone() for p in policy.parameters()]

    ref_lp, ref_g = loss_and_grads("none", 0)
    lp, grads = loss_and_grads(mode, 8)
    assert torch.allclose(lp, ref_lp, atol=1e-5)
    assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(grads, ref_g, strict=True))


def test_the_trainer_compiles_into_the_host_cache_not_the_job_temp_dir(tiny_model, tmp_path, monkeypatch):
    """Torch puts inductor's cache under the temp dir; a job's own TMPDIR (SLURM, a container)
    would hide it from the next run. A TORCHINDUCTOR_CACHE_DIR the user set is kept."""
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    # "" reads as unset, and unlike delenv of an unset name it is undone at teardown (apply_compile
    # writes the variable into this process)
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "")
    monkeypatch.setenv("TMPDIR", str(tmp_path / "job-tmp"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    model = load_model(str(tiny_model), "float32", torch.device("cpu"))
    apply_compile(model)
    assert Path(cache_dir()) == tmp_path / "cache/rlfleet/torchinductor"

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "mine"))
    apply_compile(model)
    assert Path(cache_dir()) == tmp_path / "mine"


def test_more_than_one_trainer_gpu_is_placed_and_launched_with_torchrun(tmp_path):
    assert assign_gpus(DeploymentConfig(num_inference_gpus=1, num_train_gpus=2), ["0", "1", "2"]) == (
        ["0"],
        ["1", "2"],
    )
    cmd = torchrun_cmd(2, ["trainer", "@", "t.toml"])
    assert cmd[1:3] == ["-m", "torch.distributed.run"] and "--nproc-per-node=2" in cmd
    assert cmd[-4:] == ["rlfleet.cli", "trainer", "@", "t.toml"]
    cfg = TrainerJobConfig(model=ModelConfig(path="m"), output_dir=str(tmp_path), gpu_ids=["1", "2"])
    assert TrainerProcess(cfg, tmp_path / "t.toml").cfg.gpu_ids == ["1", "2"]


def test_a_gpu_trainer_trains_packed_rows_bounded_by_tokens_unless_the_config_says_otherwise(tmp_path):
    """Long samples must not OOM a GPU trainer: unset, its micro-batch is one packed row of
    max(max_model_len, 8192) tokens; a CPU trainer keeps 32 right-padded sequences."""

    def shape(gpus: list[str], **kw: object) -> tuple[int | None, int | None]:
        cfg = RLConfig.model_validate({"model": {"path": "m"}, "output_dir": str(tmp_path), **kw})
        o = gpu_defaults(cfg, gpus, gpus)[0].orchestrator
        return o.seq_len, o.micro_batch_size

    assert shape([]) == (0, 32)
    assert shape(["0"]) == (PACKED_ROW_TOKENS, 1)
    assert shape(["0"], inference={"max_model_len": 20000}, orchestrator={"max_tokens": 16000}) == (20000, 1)
    assert shape(["0"], orchestrator={"seq_len": 0, "micro_batch_size": 8}) == (0, 8)
    assert shape([], orchestrator={"seq_len": 1024, "micro_batch_size": 2}) == (1024, 2)


def test_two_gloo_ranks_match_one_process_and_resume_on_one(tiny_model, tmp_path):
    ref, dist2 = tmp_path / "ref", tmp_path / "dist"
    publish_steps(RunStore(ref), 3)
    shutil.copytree(ref, dist2)

    run_job(ref, tiny_model, 3, None)  # one plain process: the reference
    # FSDP2 over 2 gloo ranks: steps 0 and 1, each checkpointed as DCP shards (the second through
    # the host buffers the first filled: it must hold step 1's state, not step 0's)
    run_job(dist2, tiny_model, 2, 2)
    ckpt = dist2 / "checkpoints" / "step_0"
    assert (ckpt / "dcp" / ".metadata").is_file() and not (ckpt / "optimizer.pt").exists()
    assert dcp_ranks(ckpt / "dcp") == {0, 1}  # each rank wrote its shards
    # The HF export gathered on rank 0 is the same model the reference has after step 0.
    ref_model = load_model(str(ref / "checkpoints" / "step_0" / "model"), "float32", torch.device("cpu"))
    got_model = load_model(str(ckpt / "model"), "float32", torch.device("cpu"))
    # Adam's first step moves each weight by about lr (1e-2) whatever its gradient's size, so float
    # noise in a near-zero gradient (kernels compiled for another thread count, gloo's sum order)
    # shows here as up to ~3e-4 on a few elements; a wrong gather or another step's state is off by ~lr
    for (name, a), b in zip(ref_model.state_dict().items(), got_model.state_dict().values(), strict=True):
        torch.testing.assert_close(b, a, atol=1e-3, rtol=0, msg=lambda m, name=name: f"{name}: {m}")

    assert (dist2 / "checkpoints" / "step_1" / "dcp" / ".metadata").is_file()
    # what a soak reads of each checkpoint, without a model: step N's optimizer has taken N + 1 steps
    assert optimizer_steps(RunStore(ref), layout.step_dir(layout.CHECKPOINTS, 0)) == {1}  # optimizer.pt
    assert [optimizer_steps(RunStore(dist2), layout.step_dir(layout.CHECKPOINTS, s)) for s in (0, 1)] == [
        {1},
        {2},
    ]
    run_job(dist2, tiny_model, 3, None)  # resumes step 2 in one process from the 2-rank DCP checkpoint 1
    want, got = logged_losses(ref, range(3)), logged_losses(dist2, range(3))
    assert want[0] != want[2]  # the steps really trained
    assert got == pytest.approx(want, rel=1e-4, abs=1e-6)
