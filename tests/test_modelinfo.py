"""vLLM's model-info cache filled beside a starting replica (rlfleet/inference/modelinfo.py), with
the real vLLM: what the helper writes is what vLLM's own server then reads instead of inspecting
the class in a subprocess of its own."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

from rlfleet.inference import modelinfo

# vLLM's registry as its API server resolves a model, with the subprocess it would start on a miss
# made to fail: it returns only from the cache.
SERVER_SIDE = """
import sys
from vllm.model_executor.models import registry
def no_subprocess(fn):
    raise SystemExit("cache miss: vLLM would inspect the class in a subprocess")
registry._run_in_subprocess = no_subprocess
info = registry.ModelRegistry.models[sys.argv[1]].inspect_model_cls()
print(type(info).__name__, info.architecture)
"""


def test_the_helper_writes_what_vllm_reads_and_a_cached_architecture_starts_none(tiny_model, tmp_path):
    env = {**os.environ, "VLLM_CACHE_ROOT": str(tmp_path / "vllm")}
    arch = modelinfo.architecture(str(tiny_model))
    assert arch == "LlamaForCausalLM" and not modelinfo.cached(arch, env)

    helper = modelinfo.prefill(str(tiny_model), env)
    assert helper is not None
    assert modelinfo.prefill(str(tiny_model), env) is None  # a second replica of the same start: one helper
    assert helper.wait(timeout=300) == 0 and modelinfo.cached(arch, env)

    served = subprocess.run(
        [sys.executable, "-c", SERVER_SIDE, arch], env=env, capture_output=True, text=True, timeout=300
    )
    assert served.returncode == 0, served.stderr[-2000:]
    assert served.stdout.split()[-2:] == ["_ModelInfo", "LlamaForCausalLM"]
    shutil.copytree(tmp_path / "vllm", tmp_path / "another")  # a host whose vLLM has it cached
    assert modelinfo.prefill(str(tiny_model), {**env, "VLLM_CACHE_ROOT": str(tmp_path / "another")}) is None


def test_a_model_that_is_not_a_local_checkpoint_starts_no_helper(tmp_path):
    assert modelinfo.architecture("HuggingFaceTB/SmolLM2-135M-Instruct") is None
    (tmp_path / "config.json").write_text("{not json")
    assert modelinfo.prefill(str(tmp_path), dict(os.environ)) is None
