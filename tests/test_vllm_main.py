"""The replica's vLLM wrapper (rlfleet/inference/vllm_main.py) with the real vLLM: on a host whose
cache lacks the architecture, the model's class is inspected in the server's own process (vLLM's
subprocess for it is made to fail here), and vLLM's cache is written as before."""

from __future__ import annotations

import os
import subprocess
import sys

# vLLM's registry as the API server resolves a model on a cold host, with the subprocess it would
# start made to fail: first as vLLM ships it, then through the wrapper's hook.
RESOLVE = """
import sys
from vllm.model_executor.models import registry
from rlfleet.inference import vllm_main
registry._SUBPROCESS_COMMAND = [sys.executable, "-c", "raise SystemExit('no subprocess')"]
model = registry.ModelRegistry.models[sys.argv[1]]
try:
    model.inspect_model_cls()
    print("inspected without the hook")
except RuntimeError as e:
    print("subprocess:", "no subprocess" in str(e))
vllm_main.inspect_in_process()
print("hooked:", model.inspect_model_cls().architecture)
"""


def test_a_cold_host_inspects_the_model_class_in_the_server_and_fills_vllms_cache(tmp_path):
    arch = "LlamaForCausalLM"  # the tiny model's and SmolLM2's
    cache = tmp_path / "vllm"
    env = {**os.environ, "VLLM_CACHE_ROOT": str(cache)}
    done = subprocess.run(
        [sys.executable, "-c", RESOLVE, arch], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.splitlines()[-2:] == ["subprocess: True", f"hooked: {arch}"]
    assert list((cache / "modelinfos").glob(f"*-{arch}.json"))  # what the next start reads


def _output(index: int, tokens: list[int]):
    from vllm.outputs import CompletionOutput

    return CompletionOutput(index=index, text="", token_ids=tokens, cumulative_logprob=None, logprobs=None)


def _request_output(outputs: list):
    from vllm.outputs import RequestOutput

    return RequestOutput("r", None, [1, 2], None, outputs, finished=False)


def test_a_token_stream_whose_first_output_lacks_choices_counts_every_choice():
    """vLLM 0.26's token stream sized its per-choice counts from the first output (`BUG`): a choice
    that output lacked raised IndexError later. Padded, the first output holds every choice (the
    added ones empty); later outputs and a first output that has them all pass through as they are."""
    import asyncio

    from rlfleet.inference.vllm_main import padded_first

    async def stream(outs):
        for o in outs:
            yield o

    async def read(outs, n):
        return [r async for r in padded_first(stream(outs), n)]

    first, later = _request_output([_output(0, [5])]), _request_output([_output(2, [6]), _output(1, [7])])
    got = asyncio.run(read([first, later], 3))
    assert [(o.index, list(o.token_ids)) for o in got[0].outputs] == [(0, [5]), (1, []), (2, [])]
    assert [o.index for o in first.outputs] == [0]  # vLLM's own object is not changed
    assert got[1] is later
    counts = [0] * len(got[0].outputs)  # what vLLM 0.26's stream does with them
    for res in got:
        for o in res.outputs:
            counts[o.index] += len(o.token_ids)
    assert counts == [1, 1, 1]
    whole = _request_output([_output(0, [5]), _output(1, [6])])
    assert asyncio.run(read([whole], 2))[0] is whole


def test_the_stream_is_patched_only_where_it_has_the_bug():
    import inspect

    from vllm.entrypoints.scale_out.token_in_token_out.serving import ServingTokens

    from rlfleet.inference import vllm_main

    before = ServingTokens.serve_tokens_stream_generator
    has_bug = vllm_main.BUG in inspect.getsource(before)
    vllm_main.every_choice_first()
    try:
        assert (ServingTokens.serve_tokens_stream_generator is not before) == has_bug
    finally:
        ServingTokens.serve_tokens_stream_generator = before
