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
