"""`trainer.profile_step`: torch.profiler over one step the loop really trains."""

from __future__ import annotations

import json

from rlfleet.config.models import ModelConfig, TrainerConfig, TrainerJobConfig
from rlfleet.store import RunStore
from rlfleet.trainer.profile import kind
from rlfleet.trainer.rl import run_trainer
from tests.synthetic_run import publish_steps


def test_kernels_are_grouped_by_what_they_do():
    assert kind("void flash_fwd_kernel<Flash_fwd_kernel_traits>") == "attention"
    assert kind("nvjet_tst_128x256_64x4_2x1_v_bz_coopA_NNT") == "matmul"
    assert kind("sm90_xmma_gemm_bf16bf16_bf16f32") == "matmul"
    assert kind("triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_0") == "compiled (triton)"
    assert kind("ncclDevKernel_AllGather_RING_LL") == "collectives"
    assert kind("Memcpy HtoD (Pageable -> Device)") == "copies"
    assert kind("aten::mm") == "matmul"
    assert kind("aten::silu") == "other"


def test_the_asked_step_alone_is_profiled_and_trains_as_before(tiny_model, tmp_path):
    runs = {}
    for name, profile_step in (("plain", None), ("profiled", 1)):
        out = tmp_path / name
        publish_steps(RunStore(out), 3)
        cfg = TrainerJobConfig(
            output_dir=str(out),
            max_steps=3,
            model=ModelConfig(path=str(tiny_model)),
            trainer=TrainerConfig(lr=1e-2, param_dtype="float32", profile_step=profile_step),
        )
        run_trainer(cfg)
        runs[name] = [json.loads((out / "metrics" / f"step_{s}.json").read_text())["loss"] for s in range(3)]
    logs = tmp_path / "profiled" / "logs" / "trainer"
    assert [p.name for p in logs.glob("profile_step_*.txt")] == ["profile_step_1.txt"]
    text = (logs / "profile_step_1.txt").read_text()
    assert "aten::" in text  # the op table
    assert "wall " in text and " matmul " in text  # the step's seconds and its kinds
    assert runs["profiled"] == runs["plain"]
    assert not list((tmp_path / "plain").rglob("profile_step_*"))
