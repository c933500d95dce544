"""TRL's samplers that run as a vLLM server on a GPU of their own (`--trl-vllm-mode server`,
`--trl-async`): which GPU each process gets, the server's command line, and its life around the
trainer's (started first, waited for, its whole process group stopped after, also when the
trainer fails or the harness is cut).

Server mode is TRL's own `trl vllm-serve` (TRL 1.16: `vllm serve` with the NCCL weight-transfer
engine, processed logprobs and VLLM_SERVER_DEV_MODE=1). AsyncGRPO talks to plain `vllm serve`: the
same dev-mode endpoints and weight-transfer engine, and sampled logprobs after temperature, which
its importance ratio divides by (its trainer's logprobs are temperature-scaled too); the request's
model name is the trainer's model path, vLLM's default served name when --model is that path.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

HOST = "127.0.0.1"
SAMPLERS = ("hf", "colocate", "server", "async")


def sampler_arguments(ap: argparse.ArgumentParser) -> None:
    """`--trl-vllm`, `--trl-vllm-mode`, `--trl-async`, for every script that runs TRL through vs_trl.run_trl."""
    ap.add_argument("--trl-vllm", action="store_true", help="TRL samples with vLLM (GPU only)")
    ap.add_argument(
        "--trl-vllm-mode",
        choices=["colocate", "server"],
        default="colocate",
        help="with --trl-vllm: a vLLM in each trainer process (colocate), or TRL's vLLM server on the last "
        "visible GPU, the trainer processes on the others (server)",
    )
    ap.add_argument(
        "--trl-async",
        action="store_true",
        help="TRL's experimental AsyncGRPOTrainer, its vLLM server on the last visible GPU (GPU only)",
    )


def sampler(ap: argparse.ArgumentParser, a: argparse.Namespace) -> str:
    """How TRL samples (one of SAMPLERS), from the parsed flags; refuses what a CPU cannot run and
    flags that mean nothing together."""
    if a.trl_async and (a.trl_vllm or a.trl_vllm_mode != "colocate"):
        ap.error("--trl-async samples from its own vLLM server: drop --trl-vllm / --trl-vllm-mode")
    if a.trl_vllm_mode == "server" and not a.trl_vllm:
        ap.error("--trl-vllm-mode server needs --trl-vllm")
    name = "async" if a.trl_async else a.trl_vllm_mode if a.trl_vllm else "hf"
    flag = {"colocate": "--trl-vllm", "server": "--trl-vllm-mode server", "async": "--trl-async"}
    if name != "hf" and a.device != "cuda":
        ap.error(f"{flag[name]} needs --device cuda")
    return name


def visible_gpus(env: dict[str, str] | None = None) -> list[str]:
    """The GPUs this process may use, as CUDA_VISIBLE_DEVICES names them (else every GPU torch sees)."""
    env = os.environ if env is None else env
    if (visible := env.get("CUDA_VISIBLE_DEVICES")) is not None:
        return [g for g in visible.split(",") if g.strip()]
    import torch

    return [str(i) for i in range(torch.cuda.device_count())]


def placement(gpus: list[str], processes: int) -> tuple[str, list[str]]:
    """(the server's GPU, the trainer processes' GPUs): the last visible GPU serves, the first
    `processes` train; refused when that leaves a trainer process without a GPU of its own."""
    if len(gpus) < processes + 1:
        raise SystemExit(
            f"TRL's vLLM server takes a GPU of its own: {len(gpus)} visible GPU(s) {gpus}, "
            f"{processes} trainer process(es) need {processes + 1}"
        )
    return gpus[-1], gpus[:processes]


def server_command(server: dict[str, Any]) -> list[str]:
    """The server's command line (this interpreter's); `server` is the spec's (vs_trl.trl_spec)."""
    s = server
    if s["kind"] == "server":
        # trl/scripts/vllm_serve.py: its ScriptArguments (HfArgumentParser: --snake_case), then `vllm serve`
        head = [sys.executable, "-m", "trl.scripts.vllm_serve", "--model", s["model"], "--host", HOST]
        return [
            *head,
            *("--port", str(s["port"]), "--tensor_parallel_size", "1", "--dtype", s["dtype"]),
            *("--gpu_memory_utilization", str(s["gpu_memory_utilization"])),
            *("--max_model_len", str(s["max_model_len"])),
        ]
    head = [
        sys.executable,
        "-m",
        "vllm.entrypoints.cli.main",
        "serve",
        s["model"],
        "--host",
        HOST,
    ]  # `vllm serve`
    return [
        *head,
        *("--port", str(s["port"]), "--dtype", s["dtype"], "--seed", str(s["seed"])),
        *("--gpu-memory-utilization", str(s["gpu_memory_utilization"])),
        *("--max-model-len", str(s["max_model_len"])),
        *("--weight-transfer-config", json.dumps({"backend": "nccl"})),
        *("--logprobs-mode", "processed_logprobs"),
    ]


def server_env(env: dict[str, str], gpu: str) -> dict[str, str]:
    """The server's environment: its one GPU and vLLM's dev-mode endpoints (weight transfer, pause)."""
    return env | {"CUDA_VISIBLE_DEVICES": gpu, "VLLM_SERVER_DEV_MODE": "1"}


def wait_ready(proc: subprocess.Popen, url: str, log: Path, timeout_s: float = 900.0) -> None:
    """Until vLLM's /health answers 200 (the engine is up); the server's exit or the timeout raises
    with the end of its log."""
    from rlfleet.inference.server import healthy
    from rlfleet.procs import wait_until

    def tail() -> str:
        return f"the end of {log}:\n" + "\n".join(log.read_text(errors="replace").splitlines()[-40:])

    wait_until(
        lambda: healthy(url),
        timeout_s,
        interval_s=1.0,
        what=f"TRL's vLLM server at {url}",
        abort=lambda: None if proc.poll() is None else f"it exited {proc.returncode}; {tail()}",
        on_timeout=lambda: RuntimeError(f"TRL's vLLM server not ready after {timeout_s:.0f}s; {tail()}"),
    )


@contextmanager
def serving(spec: dict[str, Any], env: dict[str, str], log: Path) -> Iterator[dict[str, str]]:
    """The trainer's environment while the spec's server runs (started and ready first, its process
    group stopped on the way out, whatever ends the block); without a server, `env` as it is."""
    if (server := spec.get("server")) is None:
        yield env
        return
    from common import Runs  # rlfleet's kill_group: the server's vLLM engine core is its child

    gpu, trainers = placement(visible_gpus(env), spec["processes"])
    runs = Runs()
    try:
        with log.open("w") as f:
            proc = runs.start(
                server_command(server), stdout=f, stderr=subprocess.STDOUT, env=server_env(env, gpu)
            )
        wait_ready(proc, f"http://{HOST}:{server['port']}", log)
        yield env | {"CUDA_VISIBLE_DEVICES": ",".join(trainers)}
    finally:
        runs.stop()
