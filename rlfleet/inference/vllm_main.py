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

vLLM 0.26's token stream (`/inference/v1/generate`, which the rollout stream reads) sizes its
per-choice token counts from the first output, which with n > 1 may hold fewer choices than n: a
later choice raised IndexError and cut the stream. rlfleet continued each cut request on a new one,
losing nothing, but the short-answer job on one H100 met ~100 in 40 steps. Later vLLM sizes them
from n (0.32); on one whose stream still has the bug, its first output is padded to every choice.
"""

from __future__ import annotations

import copy
import inspect
import os
import runpy
from collections.abc import AsyncIterator
from typing import Any

SERVER = "vllm.entrypoints.openai.api_server"


def inspect_in_process() -> None:
    """Run vLLM's model-class inspection in this process instead of a subprocess of its own
    (a private hook of vLLM's registry, in 0.26 and 0.32; where absent, vLLM's subprocess stays)."""
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


BUG = "num_generated_tokens = [0] * len(res.outputs)"  # the line vLLM 0.26's stream sizes its counts by


def every_choice_first() -> None:
    """Pad the first output of every token stream to n choices, where the stream has the bug above."""
    try:
        from vllm.entrypoints.scale_out.token_in_token_out.serving import ServingTokens
    except ImportError:  # a vLLM without the token stream
        return
    stream = ServingTokens.serve_tokens_stream_generator
    if BUG not in inspect.getsource(stream):
        return

    def serve_tokens_stream_generator(
        self: Any, request: Any, results: Any, *args: Any, **kwargs: Any
    ) -> Any:
        return stream(self, request, padded_first(results, request.sampling_params.n), *args, **kwargs)

    ServingTokens.serve_tokens_stream_generator = serve_tokens_stream_generator


async def padded_first(results: AsyncIterator[Any], n: int) -> AsyncIterator[Any]:
    """`results` (vLLM RequestOutputs) with the first one's outputs padded to choices 0..n-1: a
    choice it lacks gets an empty output, which the stream skips (no tokens, no finish reason)."""
    from vllm.outputs import CompletionOutput

    first = True
    async for res in results:
        if first and len(res.outputs) < n:
            have = {o.index for o in res.outputs}
            missing = [i for i in range(n) if i not in have]
            res = copy.copy(res)
            res.outputs = [
                *res.outputs,
                *(
                    CompletionOutput(index=i, text="", token_ids=[], cumulative_logprob=None, logprobs=None)
                    for i in missing
                ),
            ]
        first = False
        yield res


if __name__ == "__main__":
    from vllm.platforms import current_platform

    inspect_in_process()
    every_choice_first()
    if current_platform.is_cpu():
        fork_engine_core()
    runpy.run_module(SERVER, run_name="__main__", alter_sys=True)
