"""`rlfleet inference` serves the model, logs under the run, and SIGTERM stops its whole tree."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import httpx
import psutil
import pytest

from rlfleet.orchestrator.sampler import GENERATE, generate_body
from tests.helpers import free_port

pytestmark = pytest.mark.e2e


def test_inference_cli_serves_and_stops_its_process_tree(tiny_model, tmp_path):
    """Also: a CPU replica's first sampled batch builds no inductor kernels (vLLM compiles two
    sampler helpers even when eager; g++ on 2 cores made step 0's rollout 13 s)."""
    port = free_port()
    inductor = tmp_path / "inductor"
    out = tmp_path / "run"
    cmd = [
        sys.executable,
        "-m",
        "rlfleet.cli",
        "inference",
        "--model.path",
        str(tiny_model),
        "--output-dir",
        str(out),
        "--inference.port",
        str(port),
        "--inference.max-model-len",
        "128",
    ]
    env = os.environ | {"TORCHINDUCTOR_CACHE_DIR": str(inductor)}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        deadline = time.monotonic() + 300
        line = ""
        while "serving:" not in line:
            assert time.monotonic() < deadline and proc.poll() is None, "server did not come up"
            line = proc.stdout.readline()
        assert f"http://127.0.0.1:{port}" in line
        models = httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=10).json()
        assert [m["id"] for m in models["data"]] == ["policy"]
        body = generate_body([5, 6, 7], n=8, max_tokens=8)
        resp = httpx.post(f"http://127.0.0.1:{port}/{GENERATE}", json=body, timeout=120).json()
        assert len(resp["choices"]) == 8  # a random model may sample EOS early: then it stopped
        assert all(len(c["token_ids"]) == 8 or c["finish_reason"] == "stop" for c in resp["choices"])
        assert all(1 <= len(c["token_ids"]) <= 8 for c in resp["choices"])
        assert not [p.name for p in inductor.rglob("*") if p.is_file()], "the replica compiled kernels"
        tree = psutil.Process(proc.pid).children(recursive=True)
        assert len(tree) >= 2, "expected the vLLM API server and its engine core"
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    gone, alive = psutil.wait_procs(tree, timeout=30)
    assert not alive, f"left running: {alive}"
    assert "Application startup complete" in (out / "logs/inference/replica_0.log").read_text()
    assert not list((out / "run").glob("*.pid"))


def test_a_cpu_replica_leaves_a_core_to_its_api_server_and_the_controller():
    """Unpinned: the cores but one (at least one), shared by the replicas, unbound; a pinned
    replica keeps its cores; a GPU replica gets no OpenMP settings."""
    from rlfleet.config.models import InferenceJobConfig
    from rlfleet.inference.server import cpu_threads, replica_env

    assert cpu_threads(1, cpus=2) == {"VLLM_CPU_OMP_THREADS_BIND": "nobind", "OMP_NUM_THREADS": "1"}
    assert cpu_threads(2, cpus=16)["OMP_NUM_THREADS"] == "7"
    assert cpu_threads(4, cpus=2)["OMP_NUM_THREADS"] == "1"

    def env(**inference: object) -> dict[str, str]:
        gpus = inference.pop("gpu_ids", [])
        cfg = InferenceJobConfig.model_validate(
            {"model": {"path": "m"}, "inference": inference, "gpu_ids": gpus}
        )
        return replica_env(cfg, 0)

    assert env()["VLLM_CPU_OMP_THREADS_BIND"] == "nobind" and env()["TORCHDYNAMO_DISABLE"] == "1"
    pinned = env(cpu_threads_bind="0")
    assert pinned["VLLM_CPU_OMP_THREADS_BIND"] == "0" and "OMP_NUM_THREADS" not in pinned
    on_gpu = env(gpu_ids=["0"])
    assert on_gpu["CUDA_VISIBLE_DEVICES"] == "0"
    assert on_gpu["VLLM_WORKER_MULTIPROC_METHOD"] == "fork"  # its engine core inherits the imports
    assert not {"VLLM_CPU_OMP_THREADS_BIND", "OMP_NUM_THREADS", "TORCHDYNAMO_DISABLE"} & set(on_gpu)
