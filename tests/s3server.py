"""A real S3-compatible HTTP server on loopback for tests and benchmarks: moto in server mode.

It runs as its own process (`python -m moto.server`), so a client under test that is killed or
busy never shares an interpreter with it. Credentials reach clients only through AWS_* variables.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def moto_server(log_path: Path, timeout_s: float = 60.0) -> Iterator[str]:
    """Start `moto.server` on a free loopback port; yields its endpoint URL; stops it on exit."""
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                httpx.get(f"{url}/moto-api/", timeout=1.0)
                break
            except httpx.HTTPError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(
                        f"moto server did not start:\n{log_path.read_text()[-2000:]}"
                    ) from None
                time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
