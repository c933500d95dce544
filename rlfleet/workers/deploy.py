"""`rlfleet deploy`: Prefect's side of running rlfleet from a worker. It creates the work pool
(local processes, or `slurm`), the per-GPU concurrency limits, and the Prefect deployments of
rlfleet/resources/prefect.yaml (rl/main, sft/main, eval/scheduled, ablation/main). A run's
`[deployment]` section (config/deployment.py) is its placement, unrelated."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from rlfleet.config.placement import visible_gpus
from rlfleet.resources import PREFECT_FILE
from rlfleet.workers.leases import ensure_gpu_limits

POOL = "rlfleet-local"


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


def deploy(
    root: Path, pool: str = POOL, prefect_file: Path = PREFECT_FILE, pool_type: str = "process"
) -> str:
    """Create (or update) everything a worker on `pool` needs to run rlfleet's flows.

    `root` is the directory the worker runs flows in (any directory: the flows are imported from
    the installed rlfleet): parameters' relative paths (models/tiny, outputs/...) resolve against it.
    `prefect_file` defaults to the deployments shipped in the package.
    """
    root = root.expanduser().resolve()
    if not root.is_dir():
        raise FileNotFoundError(
            f"--root {root}: not a directory; pass the directory flow runs work in "
            "(relative paths in parameters, e.g. models/tiny, resolve against it)"
        )
    prefect_file = Path(prefect_file).resolve()
    if not prefect_file.is_file():
        raise FileNotFoundError(f"{prefect_file} not found: the rlfleet install is incomplete (reinstall it)")
    create_pool(pool, pool_type)
    limits = ensure_gpu_limits(visible_gpus())
    env = {**os.environ, "RLFLEET_ROOT": str(root), "RLFLEET_POOL": pool}
    out = prefect_cli("deploy", "--all", "--prefect-file", str(prefect_file), env=env, cwd=root)
    notes = "".join(f"\nnote: {m}" for m in missing_inputs(root, prefect_file))
    return f"{pool_type} work pool {pool}; GPU limits {limits or 'none (no GPU visible)'}\n{out}{notes}"


def missing_inputs(root: Path, prefect_file: Path) -> list[str]:
    """The files the deployments' default parameters name that `root` lacks: their runs need them,
    or a `--param config=...` that names others (deploying does not)."""
    import yaml  # prefect's dependency

    spec = yaml.safe_load(prefect_file.read_text())
    needs: dict[str, list[str]] = {}
    for d in spec.get("deployments", []):
        params = d.get("parameters", {})
        cfg = params.get("config") or params.get("base") or {}
        for path in (cfg.get("model", {}).get("path"), cfg.get("data", {}).get("path")):
            if path and not Path(path).is_absolute() and not (root / path).exists():
                flow = d["entrypoint"].rsplit(".", 1)[-1].removesuffix("_flow")
                needs.setdefault(path, []).append(f"{flow}/{d['name']}")
    hint = {"models/tiny": " (make it: `rlfleet model tiny --out models/tiny` in that directory)"}
    return [
        f"{root / p} does not exist; the default parameters of {', '.join(users)} name it"
        f"{hint.get(p, '')}; or run them with `--param config=...` naming your own"
        for p, users in needs.items()
    ]
