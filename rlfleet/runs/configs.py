"""What a run checks and writes before anything starts: preflight and the resolved configs."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from rlfleet.config.deployment import slurm_missing
from rlfleet.config.gpu_defaults import gpu_defaults, split_cpus
from rlfleet.config.inference import check_ports
from rlfleet.config.loader import raise_if, to_toml
from rlfleet.config.lora import check_lora
from rlfleet.config.model import check_model
from rlfleet.config.models import RLConfig
from rlfleet.config.placement import Placement, check_gpus, gpus_here, shares
from rlfleet.config.served import check_teacher_tokenizer
from rlfleet.fleet.attach import attach, fleet_gpu_problems, replica_gpus, run_gpus
from rlfleet.orchestrator.envs import check_envs
from rlfleet.runs.lock import check_not_running, reap_earlier_life
from rlfleet.runs.resumable import check_resumable
from rlfleet.store import RunDir, RunStore, layout, local_dir, run_store
from rlfleet.store.writable import check_output_dir


def write_configs(cfg: RLConfig, placement: Placement) -> dict[str, str]:
    """Write rl.toml, the trainer / inference sub-configs (their `gpu_ids` are the placement's) and
    `placement.json` (what runs where, `Placement.describe`) to `<output_dir>/configs/`.

    A remote store also gets a local copy (`<local_dir>/configs/`) that child processes read.
    On multi_node the trainer and inference configs are the nodes' (rlfleet/slurm/submit.py): kept.
    """
    store = run_store(cfg.output_dir)
    jobs = {"rl": cfg}
    if cfg.deployment.type == "single_node":
        jobs["trainer"] = cfg.trainer_job(placement.trainer_gpus)
        jobs["inference"] = cfg.inference_job(placement.inference_gpus)
        for job in cfg.served_jobs(placement.served_gpus):
            jobs[f"served_{job.name}"] = job
    paths = {}
    for name, job in jobs.items():
        store.write_text(layout.config(name), to_toml(job))
        if not store.is_local:
            local = RunDir(store.local_dir).config(name)
            local.parent.mkdir(parents=True, exist_ok=True)
            local.write_text(to_toml(job))
        paths[name] = store.uri(layout.config(name))
    store.write_text(layout.PLACEMENT, placement.to_json())
    return paths


def trainer_config(store: RunStore) -> Path:
    """The trainer's config as its process reads it (`write_configs` puts it there)."""
    return RunDir(store.local_dir).config("trainer")


def preflight(cfg: RLConfig, ports: bool = True) -> Placement:
    """The launch checks, all at once, before anything starts: what the config alone cannot tell
    (files, user code, GPUs and ports here); returns the placement on this machine's GPUs.
    ports=False: the run's replicas were started already (they hold the ports)."""
    problems = check_model(cfg.model) + check_output_dir(cfg.output_dir) + check_lora(cfg.trainer.lora)
    problems += [] if problems else check_resumable(cfg)  # a rerun: its checkpoint is this model's
    problems += check_ports(cfg.inference) if ports else []
    problems += check_served(cfg, ports)
    problems += check_envs(cfg.orchestrator.env, "orchestrator.env")
    if cfg.eval.interval:
        problems += check_envs(cfg.eval.env, "eval.env")
    # The flow never submits: a multi_node controller is the one inside the job, given its urls.
    if problem := slurm_missing(cfg.deployment, None, cfg.inference.urls):
        problems.append(problem)
    here = gpus_here(cfg)
    placement, placing = check_gpus(cfg, mine := run_gpus(cfg, here))
    if placing and mine != here:
        placing.append(
            f"fleet: {cfg.fleet!r} holds GPUs {','.join(g for g in here if g not in mine)} of the visible "
            f"{','.join(here)}; an attached run's trainer goes on its replica's warm-trainer GPU or GPUs "
            "the fleet does not hold"
        )
    placing += fleet_gpu_problems(cfg, placement.gpus) if placement is not None else []
    raise_if(problems + placing)
    assert placement is not None  # no problems: placed
    return placement


def check_served(cfg: RLConfig, ports: bool = True) -> list[str]:
    """The `[[served]]` models' launch checks: their directories, free ports, and a distillation
    teacher that tokenizes as the policy does (config/served.py)."""
    problems = []
    for k, (s, job) in enumerate(zip(cfg.served, cfg.served_jobs(), strict=True)):
        if not (Path(s.path) / "config.json").is_file():
            problems.append(f"served.{k}.path: {s.path} is not a model directory (no config.json)")
        elif cfg.loss.distill and cfg.loss.distill.teacher == s.name:
            problems += check_teacher_tokenizer(cfg.model.path, s, "loss.distill.teacher")
        if ports:
            problems += [p.replace("inference.port", f"served.{k}.port") for p in check_ports(job.inference)]
    return problems


def resolve(config: RLConfig, ports: bool = True) -> tuple[RLConfig, Placement]:
    """The config a run executes (cores split, placement defaults filled) after its preflight, and
    its placement: what the flow runs and what `runs/early.py` starts. ports=True (a launch):
    first reaps what a killed controller of this run left running. A run that names a fleet gets
    its replica as `inference.urls` and is sized as if it had started that replica where the fleet
    did (fleet/attach.py)."""
    config = attach(config)
    if ports:  # a launch: a live controller of this run holds its ports; say that, not "port in use"
        check_not_running(local_dir(config.output_dir), config.output_dir)
    # a launch that starts its own replicas (given urls, a SLURM job's steps own them and the
    # trainer): what a killed controller of this run left would hold their ports
    if ports and not config.inference.urls:
        reap_earlier_life(config.output_dir)
    cfg = split_cpus(config)  # async on a CPU box: vLLM and the trainer on separate cores
    p = preflight(cfg, ports)
    fleet_gpus = (
        []
        if p.inference_gpus
        else replica_gpus(cfg.fleet, cfg.output_dir, cfg.inference.tensor_parallel_size)
    )
    resolved, memory = gpu_defaults(cfg, p.inference_gpus or fleet_gpus, p.trainer_gpus)
    p = replace(p, memory=memory.line() if memory else "")
    if fleet_gpus:  # attached: its replica is the fleet's, on the fleet's GPUs; the log and lease say so
        mode = "colocated" if shares(fleet_gpus, p.trainer_gpus) else "disaggregated"
        p = replace(p, mode=mode, replicas=(tuple(fleet_gpus),), transport=resolved.weights.transport)
    return resolved, p
