"""vLLM's OpenAI server as a replica runs it: the model's class inspected in the server's process,
and on a CPU the engine core forked rather than spawned.

The first time a host serves an architecture (vLLM's `$VLLM_CACHE_ROOT/modelinfos` lacks it),
vLLM's API server inspects the model's class in a fresh Python subprocess, so that importing it
cannot initialise CUDA in the server. That subprocess imports vLLM and torch again: 21-27 s of a
cold H200 replica's start (docs/benchmarks/startup.md). Here the inspection runs in the server,
which has imported both already; vLLM then writes its cache as before. Should a model's module
initialise CUDA on import, vLLM's own check starts the engine core by spawn instead of fork
(`vllm.utils.system_utils._maybe_force_spawn`), as it does for any server that touched CUDA.

vLLM's CPU platform sets `VLLM_WORKER_MULTIPROC_METHOD=spawn`. Its engine core process then
imports vLLM, torch and transformers a second time: on 2 cores that is 7-8 s of a replica's
19-21 s start, and stopping the spawned process takes another ~2 s. On a GPU vLLM forks the
engine core from the API server. On a CPU the API server has run no torch op by then, so no
thread pool is inherited. With `VLLM_ENABLE_V1_MULTIPROCESSING=0` (replica_env) the engine core
also starts no worker process of its own. So for one worker (tensor_parallel_size = 1) it is
forked here too; with more workers vLLM's spawn stays.
"""

from __future__ import annotations

import os
import runpy
from typing import Any

SERVER = "vllm.entrypoints.openai.api_server"


def inspect_in_process() -> None:
    """Run vLLM's model-class inspection in this process instead of a subprocess of its own
    (a private hook of vLLM 0.32's registry; where absent, vLLM's subprocess stays)."""
    from vllm.model_executor.models import registry

    if callable(getattr(registry, "_run_in_subprocess", None)):
        registry._run_in_subprocess = lambda fn: fn()


def fork_engine_core() -> None:
    """Have CpuPlatform leave the start method at fork for a one-worker engine."""
    from vllm.platforms.cpu import CpuPlatform

    spawning = CpuPlatform.check_and_update_config.__func__

    def check_and_update_config(cls: type, vllm_config: Any) -> None:
        spawning(cls, vllm_config)
        if vllm_config.parallel_config.world_size == 1:
            os.environ["VLLM_WORKER_MULTIPROC_METHOD"] = "fork"

    CpuPlatform.check_and_update_config = classmethod(check_and_update_config)


if __name__ == "__main__":
    from vllm.platforms import current_platform

    inspect_in_process()
    if current_platform.is_cpu():
        fork_engine_core()
    runpy.run_module(SERVER, run_name="__main__", alter_sys=True)
