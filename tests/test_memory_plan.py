"""The memory plan (rlfleet/config/memory.py): from the model's config, the job, the placement and
the GPU's memory, the levers a run leaves unset are chosen before anything starts, the choice reaches
the resolved config and the log line, a lever the user set stays, and a job no choice fits is
refused naming each lever that would fit it. Real configs of the models users bring (no weights:
parameters are counted from config.json), an H100's and an H200's memory as nvidia-smi reports it."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlfleet.config.gpu_defaults import gpu_defaults
from rlfleet.config.loader import ConfigError, load
from rlfleet.config.memory import Job, head_chunk, plan, step_bytes, token_bytes
from rlfleet.config.models import RLConfig
from rlfleet.config.placement import assign_gpus, model_shape
from rlfleet.config.sizing import GIB
from rlfleet.trainer.shapes import PUBLISHED, real_config

H100, H200 = 81559 << 20, 143771 << 20
LONG_TAIL = ["--inference.max-model-len", "4608", "--orchestrator.max-tokens", "4096"]
ONE_GPU = ["--deployment.num-inference-gpus", "1", "--deployment.num-train-gpus", "1"]


@pytest.fixture(scope="module")
def configs(tmp_path_factory) -> dict[str, Path]:
    """The real configs, config.json only."""
    out = {}
    for name in ("qwen2.5-1.5b", "qwen3-4b", "qwen3-8b", "qwen3-30b-a3b"):
        path = tmp_path_factory.mktemp(name.replace(".", "_"))
        real_config(name).save_pretrained(path)
        out[name] = path
    return out


def resolve(model: Path, gpu_bytes: int, *args: str, dtype: str = "bfloat16"):
    cfg = load(RLConfig, ["--model.path", str(model), "--model.dtype", dtype, *ONE_GPU, *LONG_TAIL, *args])
    inference, trainer = assign_gpus(cfg.deployment, visible=["0"])
    return gpu_defaults(cfg, inference, trainer, gpu_bytes=gpu_bytes)


def test_parameters_are_counted_from_the_config_where_there_are_no_weights(configs):
    for name, path in configs.items():
        shape = model_shape(str(path))
        assert shape.params == pytest.approx(PUBLISHED[name][0], rel=0.01), name
    moe = model_shape(str(configs["qwen3-30b-a3b"]))
    assert moe.intermediate == 8 * 768  # a token runs through its 8 experts of 768


def test_the_estimate_is_near_the_probes_measurements_and_not_under_them():
    """Qwen2-0.5B's and -1.5B's bodies at a 32k vocabulary: the probe measured 1.126 and 1.124 MiB a
    token without checkpointing (rows of 4,608 and 8,192 tokens). The plan's estimate is within 10%
    below and 50% above: a plan may leave memory unused (the probe then fills it), rarely too little."""
    from rlfleet.config.sizing import ModelShape

    bodies = {
        ModelShape(0, 24, 896, 14, 2, intermediate=4864, vocab=32768): (4608, 1.126),
        ModelShape(0, 28, 1536, 12, 2, intermediate=8960, vocab=32768): (8192, 1.124),
    }
    for shape, (row, measured) in bodies.items():
        job = Job(shape, row_tokens=row, max_model_len=row, in_flight=1)
        per_token = (step_bytes(job, "none", False, row) - step_bytes(job, "none", False, 0)) / row
        assert 0.9 * measured <= per_token / (1 << 20) <= 1.5 * measured
    assert token_bytes(job, "full") < token_bytes(job, "selective") < token_bytes(job, "none")


def test_the_lm_head_chunk_keeps_a_chunks_logits_at_two_gib():
    assert head_chunk(32768) == head_chunk(49152) == 8192  # SmolLM2's and the bodies': as measured
    assert head_chunk(151936) == 2048 and head_chunk(128256) == 4096
    assert head_chunk(10**7) == 1024


def test_the_table_rows_are_each_fitted_or_refused_before_anything_starts(configs):
    """The rows issue 78 asks for, on-policy (k = 0), long-tail job."""
    lora8, p = resolve(configs["qwen3-8b"], H100, "--trainer.lora.rank", "16")
    assert (p.sleep, p.checkpointing, p.offload) == (True, "none", False)  # vLLM sleeps, no recompute
    assert lora8.inference.sleep and lora8.trainer.activation_checkpointing == "none"
    assert lora8.inference.gpu_memory_utilization == p.vllm_share and p.kv_seqs >= 4

    full4, p = resolve(configs["qwen3-4b"], H100)
    assert not p.sleep and not p.offload and full4.trainer.optimizer_offload is False
    assert p.trainer_bytes + p.vllm_share * H100 <= H100  # both awake fit the GPU by the estimate
    _, on_h200 = resolve(configs["qwen3-4b"], H200)
    assert on_h200.kv_seqs >= 64 and on_h200.vllm_share > p.vllm_share  # every rollout in flight

    _, p = resolve(configs["qwen2.5-1.5b"], H100)  # ran out of memory beside vLLM at 0.45 (2026-11-26)
    assert (p.checkpointing, p.sleep, p.offload) == ("none", False, False) and p.vllm_share < 0.45

    _, p = resolve(configs["qwen3-8b"], H100)  # full bf16 fine-tuning: only with AdamW on the host
    assert p.offload
    with pytest.raises(ConfigError) as refused:
        resolve(configs["qwen3-8b"], H100, "--trainer.optimizer-offload", "false", dtype="float32")
    said = str(refused.value)
    assert said.startswith("orchestrator.seq_len: a trainer step of one packed row of 8192 tokens")
    assert "trainer.optimizer_offload = true" in said and "more trainer GPUs" in said
    assert "leave trainer.optimizer_offload unset" in said
    assert "[trainer.lora]" not in said  # a float32 base beside vLLM's copy and the transport's two: no
    with pytest.raises(ConfigError, match=r"\[trainer\.lora\]"):
        resolve(configs["qwen3-8b"], H100, "--trainer.optimizer-offload", "false")


def test_async_jobs_never_sleep_and_the_log_line_says_what_was_chosen(configs):
    """Sleep needs k = 0: at k = 1 the 8B LoRA job keeps vLLM awake and recomputes instead."""
    cfg, p = resolve(
        configs["qwen3-8b"], H100, "--trainer.lora.rank", "16", "--orchestrator.max-async-level", "1"
    )
    assert not p.sleep and not cfg.inference.sleep and p.checkpointing == "full"
    line = p.line()
    assert f"vLLM {p.vllm_share:.2f} of the GPU" in line and "activation checkpointing full" in line


def test_a_lever_the_user_set_is_kept(configs):
    cfg, p = resolve(
        configs["qwen3-4b"], H200, "--trainer.activation-checkpointing", "full", "--inference.sleep", "false"
    )
    assert p.checkpointing == "full" and cfg.trainer.activation_checkpointing == "full" and not p.sleep
    cfg, p = resolve(configs["qwen3-4b"], H200, "--inference.gpu-memory-utilization", "0.3")
    assert cfg.inference.gpu_memory_utilization == 0.3 == p.vllm_share
    with pytest.raises(ConfigError, match="leave inference.gpu_memory_utilization unset"):
        resolve(configs["qwen3-4b"], H100, "--inference.gpu-memory-utilization", "0.8")


def test_vllm_on_its_own_gpu_leaves_the_trainer_the_whole_of_its_own(configs):
    path = configs["qwen3-4b"]
    two = ["--deployment.num-inference-gpus", "1", "--deployment.num-train-gpus", "1"]
    cfg = load(RLConfig, ["--model.path", str(path), "--model.dtype", "bfloat16", *two, *LONG_TAIL])
    resolved, p = gpu_defaults(cfg, ["0"], ["1"], gpu_bytes=H100)
    assert not p.shared and resolved.inference.gpu_memory_utilization is None  # vLLM's own 0.9
    assert p.checkpointing == "none" and p.micro_batch_tokens > 8192
    assert plan(Job(model_shape(str(path)), 8192, 4608, 64), 8 * GIB, shared=False) is None


def test_rlfleet_plan_says_what_a_run_would_choose_and_starts_nothing(configs, tmp_path, capsys):
    from rlfleet.cli import main

    out = tmp_path / "never"
    args = [
        "plan",
        "--model.path",
        str(configs["qwen3-8b"]),
        "--model.dtype",
        "bfloat16",
        *ONE_GPU,
        *LONG_TAIL,
    ]
    args += ["--output-dir", str(out), "--trainer.lora.rank", "16", "--gpus", "1", "--gpu-gib", "79.6"]
    assert main(args) == 0
    said = capsys.readouterr().out
    assert "asleep while the trainer steps" in said and "inference.sleep = true" in said
    assert not out.exists()  # nothing started, nothing written
    assert main([*args[:-4], "--model.dtype", "float32", "--gpus", "1", "--gpu-gib", "40"]) == 2
    assert "Each of these would make it fit" in capsys.readouterr().err


def test_fp8_rollouts_halve_vllms_weights_turn_the_correction_on_and_need_gpu_replicas(configs, tmp_path):
    """inference.quantization = "fp8": vLLM is started with --quantization fp8, the plan counts its
    weights at a byte each, [loss] is_correction defaults to token_tis (as set, it stays), and a run
    whose replica is on the CPU is refused before anything starts."""
    from rlfleet.inference.server import server_args

    bf16, p16 = resolve(
        configs["qwen3-8b"], H100, "--trainer.lora.rank", "16", "--orchestrator.max-async-level", "1"
    )
    fp8, p8 = resolve(
        configs["qwen3-8b"],
        H100,
        "--trainer.lora.rank",
        "16",
        "--orchestrator.max-async-level",
        "1",
        "--inference.quantization",
        "fp8",
    )
    assert p8.kv_seqs > p16.kv_seqs  # 8 GB of weights fewer: more room for KV at the same share or less
    assert (bf16.loss.is_correction, fp8.loss.is_correction) == ("none", "token_tis")
    args = server_args(fp8.inference_job(["0"]), 8000)
    assert args[args.index("--quantization") + 1] == "fp8" and "--quantization" not in server_args(
        bf16.inference_job(["0"]), 8000
    )
    kept, _ = resolve(
        configs["qwen3-8b"], H100, "--inference.quantization", "fp8", "--loss.is-correction", "none"
    )
    assert kept.loss.is_correction == "none"
    cpu = load(RLConfig, ["--model.path", str(configs["qwen3-8b"]), "--inference.quantization", "fp8"])
    with pytest.raises(ConfigError, match="inference.quantization: fp8 needs vLLM on GPUs"):
        gpu_defaults(cpu, [], [])
