"""LoRA (`[trainer.lora]`) on the tiny model: bad settings fail before anything starts; what the
transports send is the base model's tensors, merged; SFT with LoRA learns, and its export loads in
PEFT (adapter on the base) and in transformers (merged) to the same logprobs; a checkpoint holds
only the adapters and their optimizer state and resumes, in one process and from 2 FSDP2 ranks, to
the losses of an uninterrupted run, with the KL reference as the base under the adapters."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from rlfleet.config.loader import ConfigError, load, to_toml
from rlfleet.config.lora import LoraConfig, check_lora
from rlfleet.config.models import ModelConfig, RLConfig, SFTConfig, TrainerConfig, TrainerJobConfig
from rlfleet.store import RunStore
from rlfleet.trainer.hf_export import sent_tensors
from rlfleet.trainer.launch import torchrun_cmd
from rlfleet.trainer.lora import wrap
from rlfleet.trainer.rl import run_trainer
from rlfleet.trainer.sft import run_sft
from rlfleet.trainer.tiny import make_tiny_model
from rlfleet.trainer.train import Policy, load_model
from rlfleet.weights.tensors import bucket_sizes, fill, make_layout, views
from tests.synthetic_run import logged_losses, publish_steps

CPU = torch.device("cpu")
EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "tiny"
TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@pytest.fixture(autouse=True)
def _restore_torch_threads():
    """trainer.num_threads is process-wide; other tests keep theirs."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


@pytest.mark.parametrize(
    "args, message",
    [
        (["--trainer.lora.rank", "0"], "trainer.lora.rank: Input should be greater than or equal to 1"),
        (["--trainer.lora.alpha", "0"], "trainer.lora.alpha: Input should be greater than 0"),
        (["--trainer.lora.dropout", "1"], "trainer.lora.dropout: Input should be less than 1"),
        (["--trainer.lora.target-modules", "[]"], "trainer.lora.target_modules: List should have at least 1"),
        (["--trainer.lora.target-modules", '["q_proj", "q_proj"]'], "listed more than once: ['q_proj']"),
        (["--trainer.lora.target-modules", '["lm_head"]'], "trained only by full fine-tuning"),
        (["--trainer.lora.rnak", "8"], "trainer.lora.rnak: Extra inputs are not permitted"),
    ],
)
def test_bad_lora_settings_fail_naming_the_field(args, message):
    with pytest.raises(ConfigError) as e:
        load(RLConfig, ["--model.path", "m", *args])
    assert message in str(e.value)


def test_lora_defaults_a_missing_peft_and_unknown_targets(tiny_model, monkeypatch):
    cfg = load(RLConfig, ["--model.path", "m", "--trainer.lora.rank", "8"])
    assert cfg.trainer.lora == LoraConfig(rank=8, alpha=32.0, dropout=0.0, target_modules=None)
    assert load(RLConfig, ["--model.path", "m"]).trainer.lora is None  # unset: full fine-tuning
    assert "[trainer.lora]\nrank = 8" in to_toml(cfg)  # the trainer's sub-config carries it

    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == "peft" else real(n, *a))
    assert check_lora(cfg.trainer.lora) == [
        "trainer.lora needs peft, which is not installed: pip install 'rlfleet[lora]'"
    ]
    assert check_lora(None) == []  # full fine-tuning needs no peft
    monkeypatch.undo()

    lm = load_model(str(tiny_model), "float32", CPU)
    with pytest.raises(
        ValueError, match=r"target_modules: \['q_prj'\] match no layer of the model \(its linear"
    ):
        wrap(lm, LoraConfig(target_modules=["q_proj", "q_prj"]))


@pytest.mark.parametrize("arch", ["llama", "qwen2"])  # qwen2: q/k/v biases and a tied LM head
def test_transports_send_the_base_models_tensors_merged(tmp_path, arch):
    model_dir = make_tiny_model(tmp_path / arch, seed=0, arch=arch)
    lm = load_model(str(model_dir), "float32", CPU)
    base = {k: v.clone() for k, v in sent_tensors(lm, lm.state_dict()).items()}
    model = wrap(lm, LoraConfig(rank=4, alpha=8.0))
    with torch.no_grad():  # a trained-looking adapter: B = 0 would merge to the base
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(std=0.05)
    live = {k: v.clone() for k, v in model.state_dict().items()}

    sent = sent_tensors(model, model.state_dict())
    assert {k: v.shape for k, v in sent.items()} == {k: v.shape for k, v in base.items()}
    q = "model.layers.0.self_attn.q_proj"
    peft_q = model.base_model.model.model.layers[0].self_attn.q_proj
    delta = 2.0 * peft_q.lora_B["default"].weight @ peft_q.lora_A["default"].weight
    torch.testing.assert_close(sent[f"{q}.weight"], base[f"{q}.weight"] + delta, rtol=0, atol=1e-6)
    assert not torch.equal(sent[f"{q}.weight"], base[f"{q}.weight"])
    for k in ("model.embed_tokens.weight", "model.norm.weight", "model.layers.1.input_layernorm.weight"):
        assert torch.equal(sent[k], base[k])
    if arch == "qwen2":
        assert "lm_head.weight" not in sent and torch.equal(sent[f"{q}.bias"], base[f"{q}.bias"])
    # reading them merged nothing into the trained weights
    assert all(torch.equal(v, live[k]) for k, v in model.state_dict().items())
    # the flat layout of cuda_ipc/nccl carries the same tensors
    layout = make_layout(sent, torch.float32, bucket_bytes=1 << 16)
    buckets = [torch.empty(n) for n in bucket_sizes(layout)]
    fill(buckets, layout, sent)
    assert all(torch.equal(v, sent[k]) for k, v in views(buckets, layout))


def _logprobs(lm: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return Policy(lm)(ids)[0]


def test_sft_with_lora_learns_and_its_export_loads_in_peft_and_transformers(tiny_model, tmp_path):
    from peft import PeftModel

    out = tmp_path / "sft"
    cfg = load(
        SFTConfig,
        ["@", str(EXAMPLE / "sft.toml"), "--model.path", str(tiny_model), "--output-dir", str(out)]
        + ["--data.path", str(EXAMPLE / "sft_repeat.jsonl"), "--max-steps", "12", "--trainer.lr", "1e-2"]
        + ["--trainer.lora.rank", "8", "--trainer.lora.alpha", "16"],
    )
    summary = run_sft(cfg, progress=False)
    losses = [s["loss"] for s in summary["steps"]]
    assert losses[-1] < 0.7 * losses[0], losses  # the adapters alone learn the task

    export = Path(summary["weights"])
    adapter = load_file(export / "adapter" / "adapter_model.safetensors")
    assert {k.split(".")[-2] for k in adapter} == {"lora_A", "lora_B"} and len(adapter) == 2 * 2 * len(
        TARGETS
    )
    assert all(v.abs().max() > 0 for k, v in adapter.items() if "lora_B" in k)  # trained: B moved off 0
    assert json.loads((export / "adapter" / "adapter_config.json").read_text())["r"] == 8

    merged = AutoModelForCausalLM.from_pretrained(export, dtype=torch.float32)
    base = load_model(str(tiny_model), "float32", CPU)
    via_peft = PeftModel.from_pretrained(load_model(str(tiny_model), "float32", CPU), export / "adapter")
    ids = torch.tensor([[1, *range(40, 90)], [1, *range(60, 110)]])
    lp_merged, lp_peft, lp_base = (
        _logprobs(merged, ids),
        _logprobs(via_peft.eval(), ids),
        _logprobs(base, ids),
    )
    torch.testing.assert_close(lp_merged, lp_peft, rtol=0, atol=2e-5)
    assert (lp_merged - lp_base).abs().max() > 1e-2  # the export is not the base

    # The base did not move: what no adapter touches is the base's bit for bit, and each adapted
    # weight is the base's plus exactly its adapter's update.
    got, want = merged.state_dict(), base.state_dict()
    for name, w in want.items():
        if not any(f".{t}." in name for t in TARGETS):
            assert torch.equal(got[name], w), name
    a = adapter["base_model.model.model.layers.1.mlp.down_proj.lora_A.weight"]
    b = adapter["base_model.model.model.layers.1.mlp.down_proj.lora_B.weight"]
    down = "model.layers.1.mlp.down_proj.weight"
    torch.testing.assert_close(got[down] - want[down], 2.0 * b @ a, rtol=0, atol=1e-6)


def _rl(out: Path, model: Path, max_steps: int, nproc: int | None = None) -> None:
    """The RL trainer with LoRA and a KL term on the batches `publish_steps` wrote: in this process, or
    as `nproc` torchrun ranks (FSDP2 over gloo)."""
    cfg = TrainerJobConfig(
        output_dir=str(out),
        max_steps=max_steps,
        model=ModelConfig(path=str(model)),
        trainer=TrainerConfig(
            lr=1e-2, checkpoint_interval=1, lm_head_chunk=16, param_dtype="float32", lora=LoraConfig(rank=8)
        ),
        loss={"kl_coef": 0.1},
    )
    if nproc is None:
        run_trainer(cfg)
        return
    (out / "trainer.toml").write_text(to_toml(cfg))
    cmd = torchrun_cmd(nproc, ["trainer", "@", str(out / "trainer.toml"), "--trainer.fsdp", "on"])
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]


def _metric(out: Path, step: int, key: str) -> float:
    return json.loads((out / "metrics" / f"step_{step}.json").read_text())[key]


def test_lora_checkpoints_hold_only_adapters_and_resume_like_an_uninterrupted_run(tiny_model, tmp_path):
    ref, one, two = tmp_path / "ref", tmp_path / "one", tmp_path / "two"
    publish_steps(RunStore(ref), 3)
    shutil.copytree(ref, one)
    shutil.copytree(ref, two)

    _rl(ref, tiny_model, 3)  # one process, never stopped: the reference
    # The KL reference is the base with the adapters off: 0 while B = 0, then the policy moves away.
    assert _metric(ref, 0, "kl") == 0.0 and _metric(ref, 2, "kl") > 1e-6

    _rl(one, tiny_model, 2)  # steps 0-1 in one process ...
    ckpt = one / "checkpoints" / "step_1"
    adapter = torch.load(ckpt / "adapter.pt", weights_only=True)
    optim = torch.load(ckpt / "optimizer.pt", weights_only=True)
    assert len(adapter) == 2 * 2 * len(TARGETS) and all(".lora_A." in k or ".lora_B." in k for k in adapter)
    assert len(optim["state"]) == len(adapter)  # Adam moments of the adapters only
    n_adapter = sum(v.numel() for v in adapter.values())
    n_model = sum(v.numel() for v in load_file(tiny_model / "model.safetensors").values())
    assert sum(v["exp_avg"].numel() for v in optim["state"].values()) == n_adapter < n_model / 4
    assert (ckpt / "model" / "adapter" / "adapter_model.safetensors").is_file()  # for inference and PEFT
    _rl(one, tiny_model, 3)  # ... and step 2 after a resume onto the base
    full = TrainerJobConfig(output_dir=str(one), max_steps=4, model=ModelConfig(path=str(tiny_model)))
    with pytest.raises(
        ValueError, match=r"checkpoints/step_2 was trained with \[trainer.lora\] and this config"
    ):
        run_trainer(full)  # a run keeps its choice

    _rl(two, tiny_model, 2, nproc=2)  # steps 0-1 on 2 FSDP2 ranks: DCP shards of the adapters only
    from torch.distributed.checkpoint import FileSystemReader

    keys = FileSystemReader(str(two / "checkpoints" / "step_1" / "dcp")).read_metadata().state_dict_metadata
    model_keys = [k for k in keys if k.startswith("model.")]
    assert len(model_keys) == len(adapter) and all(".lora_" in k for k in model_keys)
    _rl(two, tiny_model, 3)  # step 2 in one process from the 2-rank checkpoint

    want = logged_losses(ref, range(3))
    assert want[0] != want[2]
    assert logged_losses(one, range(3)) == pytest.approx(want, rel=1e-4, abs=1e-6)
    assert logged_losses(two, range(3)) == pytest.approx(want, rel=1e-4, abs=1e-6)


def test_mfu_counts_what_lora_runs(tiny_model):
    """With the base frozen its matmuls run forward and for their inputs' gradients, not their own:
    4 FLOPs a parameter a token, the adapters' 6 (trainer/flops.py). The tiny Llama: 2 layers of
    hidden 128, 2 x 64-wide heads, MLP 256, vocab 128, untied head; rank 8 on every projection."""
    from rlfleet.trainer.flops import adapter_params, matmul_params, model_flops

    lm = AutoModelForCausalLM.from_pretrained(tiny_model)
    assert adapter_params(lm) is None  # everything trains
    cfg = lm.config
    base = 2 * (4 * 128 * 128 + 3 * 128 * 256) + 128 * 128  # q, k, v, o and the gated MLP; the head
    assert matmul_params(cfg) == base
    peft = wrap(lm, LoraConfig(rank=8))
    adapters = 2 * (4 * 8 * (128 + 128) + 2 * 8 * (128 + 256) + 8 * (256 + 128))  # A and B per projection
    assert adapter_params(peft) == adapters
    tokens, squares = 1000, 10 * 100 * 100
    attention = 6 * 2 * 2 * 64 * squares
    assert model_flops(cfg, tokens, squares) == 6 * base * tokens + attention
    assert model_flops(cfg, tokens, squares, adapters) == (4 * base + 6 * adapters) * tokens + attention
