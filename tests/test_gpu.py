"""`pytest -m gpu`: what only a GPU shows, on the stack the `gpu` extra pins (docs/gpus.md): the
loop on one GPU per weight transport, sleep mode, a fleet's rest and wake, the FA4 path, and
weights identical after a reload for each architecture of the matrix. Skipped where no GPU is
visible (CI has none); run on a GPU machine with `pytest -m gpu`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.archmatrix import make_arch_model, row_ok, run_arch
from tests.helpers import (
    assert_every_step_once,
    assert_no_process_left,
    free_port,
    prompt_logprobs,
    rl_config,
)
from tests.replica import HttpReplica

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU visible"),
]

ONE_GPU = {"deployment.num-inference-gpus": "1", "deployment.num-train-gpus": "1", "wandb.mode": "disabled"}
TOL = 5e-2  # bf16 vLLM against the float32 trainer (benchmarks/arch_matrix.py)


def _run(tiny_model: Path, out: Path, steps: int, **overrides: str) -> None:
    from rlfleet.flows.rl import rl

    state = rl(config=rl_config(tiny_model, out, max_steps=steps, **ONE_GPU, **overrides), return_state=True)
    assert state.is_completed(), state
    assert_every_step_once(out, steps)
    assert_no_process_left(out)


@pytest.mark.parametrize("transport", ["filesystem", "cuda_ipc", "nccl"])
def test_the_loop_on_one_gpu_per_transport(tiny_model, prefect_api, tmp_path, transport):
    """vLLM and the trainer on GPU 0 (nccl: vLLM on GPU 0, the trainer on GPU 1); every step's
    rollout sampled by the previous step's weights, so each load reached vLLM."""
    if transport == "nccl" and torch.cuda.device_count() < 2:
        pytest.skip("nccl needs a second GPU: NCCL refuses two ranks on one GPU")
    extra = {"deployment.num-train-gpus": "1"} if transport == "nccl" else {}
    _run(tiny_model, tmp_path / "run", 4, **{"weights.transport": transport, **extra})
    placement = json.loads((tmp_path / "run" / "configs" / "placement.json").read_text())
    assert transport in json.dumps(placement)


def test_sleep_mode_frees_vllm_while_the_trainer_steps(tiny_model, prefect_api, tmp_path):
    """`inference.sleep` (one shared GPU, k = 0): vLLM sleeps while the trainer steps and wakes to
    load the new weights; the run is the same run."""
    _run(tiny_model, tmp_path / "run", 3, **{"inference.sleep": "true"})
    log = (tmp_path / "run" / "logs" / "inference" / "replica_0.log").read_text()
    assert "sleep" in log.lower()


def test_a_fleet_replica_rests_and_wakes_with_its_weights(tiny_model, tmp_path):
    """A GPU fleet's idle replica sleeps at level 1 (weights to host memory) and wakes serving the
    same weights: its prompt logprobs before and after are equal."""
    from rlfleet.config.fleet import FleetConfig
    from rlfleet.config.inference import InferenceConfig
    from rlfleet.config.model import ModelConfig
    from rlfleet.fleet.rest import asleep, rest_idle, wake
    from rlfleet.inference.server import launch_replicas, stop_replicas

    fleet = FleetConfig(
        name=f"gpu-{free_port()}",
        model=ModelConfig(path=str(tiny_model)),
        inference=InferenceConfig(port=free_port(), max_model_len=128),
        gpu_ids=["0"],
    )
    job = fleet.job().model_copy(update={"output_dir": str(tmp_path / "fleet")})
    replicas = launch_replicas(job)
    try:
        urls = [r.url for r in replicas]
        prompt = [1, *range(40, 80)]
        before = prompt_logprobs(urls[0], prompt)
        assert rest_idle(fleet.name, urls) == [0] and asleep(urls) == [True]
        wake(urls)
        assert asleep(urls) == [False]
        assert prompt_logprobs(urls[0], prompt) == pytest.approx(before, abs=1e-4)
    finally:
        stop_replicas(replicas)


def test_the_trainer_takes_the_fa4_path_where_it_is_installed():
    """Packed rows go through FA4's varlen kernel on Hopper and Blackwell (trainer/fa4.py); it
    computes what torch's own attention does, sample by sample."""
    from rlfleet.trainer import fa4

    why = fa4.available()
    if why is not None:
        pytest.skip(f"FA4 not usable here: {why}")
    q, k, v = (torch.randn(64, 4, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    cu = torch.tensor([0, 24, 64], device="cuda", dtype=torch.int32)
    out, _ = fa4.fa4_varlen(q, k, v, cu, 40, None, None)
    ref = torch.cat(
        [
            torch.nn.functional.scaled_dot_product_attention(
                q[a:b].transpose(0, 1), k[a:b].transpose(0, 1), v[a:b].transpose(0, 1), is_causal=True
            ).transpose(0, 1)
            for a, b in ((0, 24), (24, 64))
        ]
    )
    torch.testing.assert_close(out, ref, atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3", "gemma2", "gemma3", "qwen3_moe"])
def test_each_architecture_reloads_to_identical_weights(arch, tmp_path):
    """Through filesystem and cuda_ipc on one GPU: each load of the start weights leaves vLLM's
    tensors as its own loader built them, and after an RL step vLLM's logprobs are the trainer's."""
    model = make_arch_model(tmp_path / "models", arch, sharpen=False)
    transports = ("filesystem", "cuda_ipc")
    row = run_arch(
        arch,
        model,
        tmp_path,
        lambda m: HttpReplica(m, tmp_path / arch / "serve", "0"),
        transports,
        torch.device("cuda", 0),
    )
    assert row_ok(row, TOL) == [], json.dumps(row, indent=1, default=str)
    assert set(row["transports"]) == set(transports)
