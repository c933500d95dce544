"""Run lifecycle in the store: resolved configs, the resume point, and stale work from a dead life."""

from __future__ import annotations

from pathlib import Path

from rlfleet.config.checks import check_model, check_output_dir, check_ports, raise_if
from rlfleet.config.loader import ConfigError, to_toml
from rlfleet.config.models import RLConfig
from rlfleet.store import RunStore, step_dir
from rlfleet.trainer.checkpoint import latest_checkpoint
from rlfleet.workers.placement import assign_gpus


def write_configs(cfg: RLConfig, inference_gpus: list[str], trainer_gpus: list[str]) -> dict[str, str]:
    """Write rl.toml and the trainer / orchestrator / inference sub-configs to `<output_dir>/configs/`."""
    store = RunStore(cfg.output_dir)
    jobs = {
        "rl": cfg,
        "trainer": cfg.trainer_job(trainer_gpus),
        "orchestrator": cfg.orchestrator_job(),
        "inference": cfg.inference_job(inference_gpus),
    }
    paths = {}
    for name, job in jobs.items():
        store.write_text(f"configs/{name}.toml", to_toml(job))
        paths[name] = store.path(f"configs/{name}.toml")
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
    for kind in ("metrics", "steps"):
        if not store.exists(kind):
            continue
        for path in store.fs.ls(store.path(kind), detail=False):
            name = path.rsplit("/", 1)[-1]
            if name.startswith("step_") and name.endswith(".json") and int(name[5:-5]) >= start:
                store.fs.rm(path)
                removed.append(f"{kind}/{name}")
    return removed


def weights_path(store: RunStore, step: int) -> str:
    """Local path vLLM reloads step N's weights from (weights/step_N, or the checkpoint's model)."""
    for rel in (step_dir("weights", step), f"{step_dir('checkpoints', step)}/model"):
        if store.exists(rel):
            return str(Path(store.path(rel)))
    raise FileNotFoundError(f"no weights for step {step} in {store.url}")


def preflight(cfg: RLConfig) -> tuple[list[str], list[str]]:
    """Check everything checkable before anything starts; returns (inference GPUs, trainer GPUs)."""
    problems = check_model(cfg.model) + check_output_dir(cfg.output_dir) + check_ports(cfg.inference)
    try:
        gpus = assign_gpus(cfg.deployment)
    except ConfigError as e:
        problems.append(str(e))
        gpus = ([], [])
    raise_if(problems)
    return gpus


def step_records(store: RunStore) -> list[dict]:
    """The flow's per-step records (`steps/step_N.json`), in step order."""
    if not store.exists("steps"):
        return []
    names = [p.rsplit("/", 1)[-1] for p in store.fs.ls(store.path("steps"), detail=False)]
    steps = sorted(int(n[5:-5]) for n in names if n.startswith("step_") and n.endswith(".json"))
    return [store.read_json(f"steps/step_{s}.json") for s in steps]
