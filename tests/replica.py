"""One `rlfleet inference` replica over HTTP, with the engine interface tests/archmatrix.py's
`run_arch` drives (logprobs, sample, rpc, load): the architecture matrix on a GPU, where vLLM runs
as users run it (benchmarks/arch_matrix.py, tests/test_gpu.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx

from rlfleet.config.models import InferenceConfig, InferenceJobConfig, ModelConfig
from tests.archmatrix import WARNED, engine_settings
from tests.helpers import free_port, prompt_logprobs


class HttpReplica:
    """One `rlfleet inference` replica (HTTP) of the model at `model_dir`; `gpu`: its CUDA device."""

    def __init__(self, model_dir: Path, out: Path, gpu: str | None):
        from rlfleet.inference.server import launch_replicas

        s = engine_settings(gpu is not None)
        inference = InferenceConfig(
            port=free_port(),
            max_model_len=s["max_model_len"],
            dtype=s["dtype"],
            gpu_memory_utilization=s["gpu_util"],
        )
        model = ModelConfig(path=str(model_dir))
        cfg = InferenceJobConfig(
            output_dir=str(out), model=model, inference=inference, gpu_ids=[gpu] if gpu else []
        )
        self.replicas = launch_replicas(cfg)
        self.url, self.log = self.replicas[0].url, self.replicas[0].process.log_path

    def logprobs(self, ids: list[int]) -> list[float]:
        return prompt_logprobs(self.url, ids)

    def sample(self, prompt: list[int], n: int, max_tokens: int) -> list[tuple[list[int], list[float]]]:
        body = {"model": "policy", "prompt": prompt, "n": n, "max_tokens": max_tokens, "logprobs": 0}
        body |= {"return_token_ids": True, "temperature": 1.0, "seed": 0}
        resp = httpx.post(f"{self.url}/v1/completions", json=body, timeout=120)
        resp.raise_for_status()
        return [(c["token_ids"], c["logprobs"]["token_logprobs"]) for c in resp.json()["choices"]]

    def rpc(self, method: str, *args: str) -> list[Any]:
        body = {"method": method, "args": list(args)}
        resp = httpx.post(f"{self.url}/collective_rpc", json=body, timeout=300)
        resp.raise_for_status()
        return resp.json()["results"]

    def load(self, t: dict[str, Any]) -> dict[str, Any]:
        """`client.load` as the controller calls it, and vLLM's load warnings from the log."""
        from rlfleet.weights.client import load

        size = self.log.stat().st_size
        times = load(self.url, t)
        with open(self.log, errors="replace") as f:
            f.seek(size)
            times["warnings"] = [line.strip() for line in f if any(w in line for w in WARNED)]
        return times

    def close(self) -> None:
        from rlfleet.inference.server import stop_replicas

        stop_replicas(self.replicas)
