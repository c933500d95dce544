"""vLLM's OpenAI server for a CPU replica, with its engine core forked rather than spawned.

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
    fork_engine_core()
    runpy.run_module(SERVER, run_name="__main__", alter_sys=True)
