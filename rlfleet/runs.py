"""Run lifecycle in the store: resolved configs, the resume point, and stale work from a dead life."""

from __future__ import annotations

import logging
import os

from rlfleet.config.checks import check_model, check_output_dir, check_ports, raise_if
from rlfleet.config.loader import ConfigError, to_toml
from rlfleet.config.models import RLConfig
from rlfleet.config.placement import assign_gpus
from rlfleet.orchestrator.envs import check_envs
from rlfleet.procs import pid_alive, write_pidfile
from rlfleet.store import RunStore, step_dir
from rlfleet.trainer.checkpoint import latest_checkpoint

log = logging.getLogger(__name__)


def write_configs(cfg: RLConfig, inference_gpus: list[str], trainer_gpus: list[str]) -> dict[str, str]:
    """Write rl.toml and the trainer / inference sub-configs to `<output_dir>/configs/`.

    A remote store also gets a local copy (`<local_dir>/configs/`) that child processes read.
    On multi_node the trainer and inference configs are the nodes' (rlfleet/slurm/submit.py): kept.
    """
    store = RunStore(cfg.output_dir)
    jobs = {"rl": cfg}
    if cfg.deployment.type == "single_node":
        jobs["trainer"] = cfg.trainer_job(trainer_gpus)
        jobs["inference"] = cfg.inference_job(inference_gpus)
    paths = {}
    for name, job in jobs.items():
        store.write_text(f"configs/{name}.toml", to_toml(job))
        if not store.is_local:
            local = store.local_dir / "configs" / f"{name}.toml"
            local.parent.mkdir(parents=True, exist_ok=True)
            local.write_text(to_toml(job))
        paths[name] = store.uri(f"configs/{name}.toml")
    return paths


def resume_step(store: RunStore) -> int:
    """First step to run: one past the latest complete checkpoint, or 0."""
    ckpt = latest_checkpoint(store)
    return 0 if ckpt is None else ckpt["step"] + 1


def discard_stale(store: RunStore, start: int) -> list[str]:
    """Remove work a previous life did past its last checkpoint that a resumed run cannot reuse.

    Weights and metrics for steps >= start are redone by the resumed trainer. Rollouts and batches
    for `start` were sampled from the checkpointed weights and stay; later ones came from weights
    that are about to be recomputed, so they go.
    """
    removed = []
    for kind, first in (("weights", start), ("rollouts", start + 1), ("batches", start + 1)):
        for s in store.complete_steps(kind):
            if s >= first:
                store.remove(step_dir(kind, s))
                removed.append(step_dir(kind, s))
    for kind in ("metrics", "steps", "sync"):  # sync/: a dead trainer's weight tickets
        if not store.exists(kind):
            continue
        for path in store.fs.ls(store.path(kind), detail=False):
            name = path.rsplit("/", 1)[-1]
            if name.startswith("step_") and name.endswith(".json") and int(name[5:-5]) >= start:
                store.fs.rm(path)
                removed.append(f"{kind}/{name}")
    return removed


def preflight(cfg: RLConfig) -> tuple[list[str], list[str]]:
    """Check everything checkable before anything starts; returns (inference GPUs, trainer GPUs)."""
    problems = check_model(cfg.model) + check_output_dir(cfg.output_dir) + check_ports(cfg.inference)
    problems += check_envs(cfg.orchestrator.env, "orchestrator.env")
    if cfg.eval.interval:
        problems += check_envs(cfg.eval.env, "eval.env")
    if cfg.deployment.type == "multi_node" and not cfg.inference.urls:
        problems.append(
            "deployment.type: multi_node runs as a SLURM job; add a [slurm] block "
            "(inside the job the sbatch script passes the inference nodes' --inference.urls)"
        )
    try:
        gpus = assign_gpus(cfg.deployment)
    except ConfigError as e:
        problems.append(str(e))
        gpus = ([], [])
    ipc = cfg.weights.transport == "cuda_ipc"
    needs_shared_gpu = {
        "weights.transport: cuda_ipc maps the trainer's GPU memory into vLLM, so it": ipc,
        "inference.sleep": cfg.inference.sleep,
    }
    for field, on in needs_shared_gpu.items():
        if on and not set(gpus[0]) & set(gpus[1]):
            problems.append(
                f"{field} needs vLLM and the trainer on one GPU; they got {gpus[0] or 'none'} and {gpus[1] or 'none'}"
            )
    raise_if(problems)
    return gpus


def step_records(store: RunStore) -> list[dict]:
    """The flow's per-step records (`steps/step_N.json`), in step order."""
    return [store.read_json(f"steps/step_{s}.json") for s in _json_steps(store, "steps")]


def acquire_run_lock(store: RunStore) -> None:
    """One controller per run: a second one would reap the first one's trainer and servers.

    For a remote store the lock lives in this machine's cache, so it guards this machine only.
    """
    lock = store.local_dir / "run" / "controller.pid"
    owner = pid_alive(lock)
    if owner is not None and owner != os.getpid():
        raise ConfigError(f"output_dir: {store.url} is in use by a running controller (pid {owner})")
    write_pidfile(lock, os.getpid())


def release_run_lock(store: RunStore) -> None:
    (store.local_dir / "run" / "controller.pid").unlink(missing_ok=True)


def sync_logs(store: RunStore) -> list[str]:
    """Copy this machine's process logs of a remote store's run into its `logs/`; local: no-op."""
    if store.is_local or not (store.local_dir / "logs").is_dir():
        return []
    done = []
    for f in sorted((store.local_dir / "logs").rglob("*")):
        if f.is_file():
            rel = f"logs/{f.relative_to(store.local_dir / 'logs').as_posix()}"
            store.fs.put_file(str(f), store.path(rel))  # one object per log, whole or not at all
            done.append(rel)
    return done


def status(output_dir: str) -> dict:
    """What `rlfleet runs status` prints: finished steps, the resume point, and what is running."""
    store = RunStore(output_dir)
    ckpt = latest_checkpoint(store)
    running = {}
    if (store.local_dir / "run").is_dir():
        for pidfile in sorted((store.local_dir / "run").glob("*.pid")):
            pid = pid_alive(pidfile)
            running[pidfile.stem] = pid
    return {
        "output_dir": store.url,
        "steps_done": spans(r["step"] for r in step_records(store)),
        "trained_steps": spans(_json_steps(store, "metrics")),
        "rollouts": spans(store.complete_steps("rollouts")),
        "batches": spans(store.complete_steps("batches")),
        "weights": spans(store.complete_steps("weights")),
        "checkpoints": spans(store.complete_steps("checkpoints")),
        "resume_checkpoint": None if ckpt is None else ckpt["step"],
        "resume_step": resume_step(store),
        "processes": {name: ("running" if pid else "stale pidfile") for name, pid in running.items()},
        "pids": {name: pid for name, pid in running.items() if pid},
        "summary": store.exists("summary.json"),
    }


def spans(steps) -> str:
    """[0, 1, 2, 5, 7, 8] -> "0-2,5,7-8"."""
    out: list[list[int]] = []
    for s in sorted(steps):
        if out and s == out[-1][1] + 1:
            out[-1][1] = s
        else:
            out.append([s, s])
    return ",".join(f"{a}" if a == b else f"{a}-{b}" for a, b in out)


def _json_steps(store: RunStore, kind: str) -> list[int]:
    if not store.exists(kind):
        return []
    names = [p.rsplit("/", 1)[-1] for p in store.fs.ls(store.path(kind), detail=False)]
    return sorted(int(n[5:-5]) for n in names if n.startswith("step_") and n.endswith(".json"))
