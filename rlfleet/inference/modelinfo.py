"""vLLM's model-info cache, filled beside a starting replica.

The first time a host serves an architecture, vLLM's API server inspects the model's class in a
fresh Python subprocess (its `modelinfos` cache is empty; the subprocess keeps CUDA out of the
server), after its own imports and before its engine core starts. That subprocess imports vLLM
again: 21 s on a cold H200 host (docs/benchmarks/startup.md). `prefill` starts the same
inspection when a GPU replica starts, so it runs on a spare core while the server imports, and the
server finds the answer cached. Not on a CPU box: there the cores are busy with the server's, the
trainer's and Prefect's imports, and `rlfleet rl` on 2 cores measured no gain. The helper runs
vLLM's own inspection and cache write in its process; where vLLM's registry differs (another
version) it does nothing, and the server inspects as before.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
from collections.abc import Mapping
from pathlib import Path

log = logging.getLogger("rlfleet.inference")
_STARTED: set[tuple[str, Path]] = set()


def cache_dir(env: Mapping[str, str]) -> Path:
    """vLLM's `$VLLM_CACHE_ROOT/modelinfos` under `env` (vllm/envs.py's default root, read without
    importing vLLM)."""
    root = env.get("VLLM_CACHE_ROOT") or os.path.join(
        env.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "vllm"
    )
    return Path(os.path.expanduser(root)) / "modelinfos"


def architecture(model_path: str) -> str | None:
    """The first `architectures` entry of a local checkpoint's config.json; None elsewhere."""
    try:
        archs = json.loads((Path(model_path) / "config.json").read_text()).get("architectures") or []
    except (OSError, ValueError):
        return None
    return archs[0] if archs and isinstance(archs[0], str) else None


def cached(arch: str, env: Mapping[str, str]) -> bool:
    """Whether vLLM has cached this class's info on this host (its file: `<module>-<Class>.json`)."""
    return any(cache_dir(env).glob(f"*-{arch}.json"))


def prefill(model_path: str, env: dict[str, str]) -> subprocess.Popen[bytes] | None:
    """Start the inspection of `model_path`'s class beside the replica unless vLLM has it cached
    (the helper's process, reaped by a thread of its own; None: none started)."""
    arch = architecture(model_path)
    if arch is None or cached(arch, env) or (arch, cache_dir(env)) in _STARTED:
        return None
    _STARTED.add((arch, cache_dir(env)))  # N replicas start together: one helper
    proc = subprocess.Popen(
        [sys.executable, "-m", __name__, arch],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    threading.Thread(target=proc.wait, name=f"modelinfo-{arch}", daemon=True).start()  # reaps it
    log.debug("inspecting %s for vLLM's model-info cache beside the replica (pid %d)", arch, proc.pid)
    return proc


def main(arch: str) -> None:
    from vllm.model_executor.models import registry

    model = registry.ModelRegistry.models.get(arch)
    if model is None or not callable(getattr(registry, "_run_in_subprocess", None)):
        return
    registry._run_in_subprocess = lambda fn: fn()  # this process is the subprocess vLLM would start
    model.inspect_model_cls()  # vLLM's own inspection, hash and cache write


if __name__ == "__main__":
    main(sys.argv[1])
