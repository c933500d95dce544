"""The launch check of `output_dir`: the run store must be a directory this process can write."""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import urlsplit


def check_output_dir(output_dir: str) -> list[str]:
    if "://" in output_dir and not output_dir.startswith("file://"):
        return check_remote_output_dir(output_dir)
    p = Path(output_dir.removeprefix("file://")).resolve()
    if p.exists() and not p.is_dir():
        return [f"output_dir: {p} exists and is not a directory"]
    parent = p
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        return [f"output_dir: {parent} is a file, not a directory"]
    if not os.access(parent, os.W_OK):
        return [f"output_dir: {parent} is not writable"]
    return []


def check_remote_output_dir(url: str) -> list[str]:
    """An object-store output_dir: credentials come from the environment, and it must be writable.

    One tiny object is written and deleted, so a wrong endpoint, bucket or key fails here and not
    after vLLM has taken a minute to start.
    """
    if "@" in urlsplit(url).netloc:
        return [
            "output_dir: credentials do not belong in the URL (they would be written into configs and "
            "logs); set AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY / AWS_ENDPOINT_URL instead"
        ]
    from rlfleet.store.runstore import run_store

    try:
        store = run_store(url)
        store.write_bytes(".rlfleet-probe", b"")
        store.fs.rm(store.path(".rlfleet-probe"))
    except Exception as e:  # any failure is the user's to fix; name it without the request details
        return [f"output_dir: cannot write to {url}: {type(e).__name__}: {str(e)[:300]}"]
    return []
