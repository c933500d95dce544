"""A run and the warm fleets of its host: attach to the one it names, keep off the others' GPUs,
and hold the named one alone for the run's life.

Attaching refuses up front (ConfigError, before anything starts): a fleet that is not up, a run
whose replicas would start differently, a run that also names `inference.urls`. A run that names
no fleet is refused the GPUs of every live fleet: fleets outlive runs by design, and a run placed
on a fleet's GPU would fight its vLLM for memory. The hold is an flock on `<name>.lock` in the
fleet dir: the kernel drops it when the holding process dies, so a killed run gives the fleet
back without anyone reaping anything, and the fleet's processes are never the run's to kill."""

from __future__ import annotations

import fcntl
import json
import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager

from rlfleet.config.inference import InferenceConfig
from rlfleet.config.loader import ConfigError
from rlfleet.config.model import ModelConfig
from rlfleet.config.models import InferenceJobConfig, RLConfig
from rlfleet.config.weights import FILES
from rlfleet.fleet.state import fleet_dir, live_fleets, mismatches, read_state, shape
from rlfleet.weights.controller import Ticket

log = logging.getLogger("rlfleet.fleet")


def fleet_urls(name: str, model: ModelConfig, inference: InferenceConfig, seed: int) -> list[str]:
    """Fleet `name`'s replicas, for a run or an eval whose own replicas would be `model` served as
    `inference`; a ConfigError when the fleet is not up or serves differently."""
    state = read_state(name)
    if state is None:
        raise ConfigError(
            f"fleet: {name!r} is not up (no live fleet of that name in {fleet_dir()}); "
            f"start it with `rlfleet fleet up @ fleet.toml`"
        )
    if inference.urls:
        raise ConfigError("fleet, inference.urls: name one; a fleet gives its own replicas' urls")
    one = InferenceJobConfig(
        model=model,
        seed=seed,
        inference=inference.model_copy(update={"num_replicas": 1}),
        gpu_ids=state["gpu_ids"][: inference.tensor_parallel_size],
    )
    if diffs := mismatches(state["server"], shape(one)):
        raise ConfigError(
            f"fleet: {name!r} serves with other vLLM arguments than this run's replicas would "
            "(set the run's [model]/[inference] as the fleet's, or start a fleet for it):\n  "
            + "\n  ".join(diffs)
        )
    return state["urls"]


def attach(cfg: RLConfig) -> RLConfig:
    """`cfg` with its fleet's replicas as `inference.urls` (unchanged when it names none)."""
    if cfg.fleet is None:
        return cfg
    urls = fleet_urls(cfg.fleet, cfg.model, cfg.inference, cfg.seed)
    data = cfg.model_dump()
    data["inference"] |= {"urls": urls, "num_replicas": len(urls)}
    return RLConfig.model_validate(data)  # the rules on urls (weight transports) hold for it too


def fleet_gpu_problems(cfg: RLConfig, gpus: list[str]) -> list[str]:
    """The run's GPUs that a live fleet other than its own holds."""
    problems = []
    for state in live_fleets():
        taken = sorted(set(gpus) & set(state["gpu_ids"]))
        if taken and state["name"] != cfg.fleet:
            problems.append(
                f"deployment: GPUs {','.join(taken)} belong to fleet {state['name']!r} (pid {state['pid']}); "
                f'attach with `fleet = "{state["name"]}"`, place the run on other GPUs, or stop the fleet'
            )
    return problems


def base_ticket(cfg: RLConfig) -> Ticket:
    """The run's initial weights as a filesystem load: what a fresh run attached to a fleet loads
    first, whatever the fleet's last run left on its replicas."""
    return model_ticket(-1, str(cfg.model.path))


def model_ticket(step: int, model_dir: str) -> Ticket:
    """A filesystem load of the model in `model_dir` as step `step` (-1: a base model)."""
    return {"transport": FILES, "step": step, "path": model_dir}


@contextmanager
def fleet_hold(name: str | None, holder: str) -> Iterator[None]:
    """Hold fleet `name` alone (none: nothing to hold); waits while another run holds it."""
    if name is None:
        yield
        return
    path = fleet_dir() / f"{name}.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log.warning("fleet %s is held by %s: waiting for it", name, _holder(path))
            fcntl.flock(fd, fcntl.LOCK_EX)
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps({"run": holder, "pid": os.getpid()}).encode(), 0)
        yield
    finally:
        os.close(fd)  # drops the lock; the kernel drops it too when this process dies


def _holder(path: os.PathLike[str]) -> str:
    try:
        with open(path) as f:
            h = json.loads(f.read())
        return f"run {h['run']} (pid {h['pid']})"
    except (OSError, ValueError, KeyError):
        return "another run"
