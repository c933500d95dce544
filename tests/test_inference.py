"""`rlfleet inference` serves the model, logs under the run, and SIGTERM stops its whole tree."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import httpx
import psutil
import pytest

from tests.conftest import free_port

pytestmark = pytest.mark.e2e


def test_inference_cli_serves_and_stops_its_process_tree(tiny_model, tmp_path):
    port = free_port()
    out = tmp_path / "run"
    cmd = [
        sys.executable,
        "-m",
        "rlfleet.cli",
        "inference",
        "--model.path",
        str(tiny_model),
        "--output-dir",
        str(out),
        "--inference.port",
        str(port),
        "--inference.max-model-len",
        "128",
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 300
        line = ""
        while "serving:" not in line:
            assert time.monotonic() < deadline and proc.poll() is None, "server did not come up"
            line = proc.stdout.readline()
        assert f"http://127.0.0.1:{port}" in line
        models = httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=10).json()
        assert [m["id"] for m in models["data"]] == ["policy"]
        tree = psutil.Process(proc.pid).children(recursive=True)
        assert len(tree) >= 2, "expected the vLLM API server and its engine core"
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    gone, alive = psutil.wait_procs(tree, timeout=30)
    assert not alive, f"left running: {alive}"
    assert "Application startup complete" in (out / "logs/inference/replica_0.log").read_text()
    assert not list((out / "run").glob("*.pid"))
