"""`rlfleet deploy`: the local process work pool, per-GPU limits, and the deployments of prefect.yaml."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from rlfleet.config.placement import visible_gpus
from rlfleet.workers.leases import ensure_gpu_limits

POOL = "rlfleet-local"
PREFECT_FILE = "deployments/prefect.yaml"


def prefect_cli(
    *args: str, env: dict[str, str] | None = None, cwd: Path | None = None, timeout: float | None = None
) -> str:
    """Run the `prefect` CLI of this interpreter non-interactively; its stdout, or an error with both streams."""
    proc = subprocess.run(
        [sys.executable, "-m", "prefect", "--no-prompt", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=timeout,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"prefect {' '.join(args)} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    return proc.stdout


def create_pool(pool: str, pool_type: str) -> None:
    """A process pool, or a slurm pool whose base job template is the SLURM worker's default."""
    if pool_type == "process":
        prefect_cli("work-pool", "create", pool, "--type", "process", "--overwrite")
        return
    import json
    import tempfile

    from rlfleet.workers.slurm import SlurmWorker

    with tempfile.NamedTemporaryFile("w", suffix=".json") as f:
        json.dump(SlurmWorker.get_default_base_job_template(), f)
        f.flush()
        prefect_cli(
            "work-pool", "create", pool, "--type", pool_type, "--base-job-template", f.name, "--overwrite"
        )


def deploy(root: Path, pool: str = POOL, prefect_file: str = PREFECT_FILE, pool_type: str = "process") -> str:
    """Create (or update) everything a worker on `pool` needs to run rlfleet's flows.

    `root` is the repository checkout the worker runs flows from: parameters' relative paths
    (models/tiny, outputs/...) resolve against it.
    """
    root = root.resolve()
    if not (root / prefect_file).is_file():
        raise FileNotFoundError(
            f"{root / prefect_file} not found: run `rlfleet deploy` from the rlfleet checkout"
        )
    create_pool(pool, pool_type)
    limits = ensure_gpu_limits(visible_gpus())
    env = {**os.environ, "RLFLEET_ROOT": str(root), "RLFLEET_POOL": pool}
    out = prefect_cli("deploy", "--all", "--prefect-file", prefect_file, env=env, cwd=root)
    return f"{pool_type} work pool {pool}; GPU limits {limits or 'none (no GPU visible)'}\n{out}"
