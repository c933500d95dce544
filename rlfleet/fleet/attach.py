"""A run and the warm fleets of its host: attach to the one it names, keep off the others' GPUs,
and hold one of its replicas (with its warm trainer) alone for the run's life.

Attaching refuses up front (ConfigError, before anything starts): a fleet that is not up, a run
whose replicas would start differently, a run that also names `inference.urls`. A run that names
no fleet is refused the GPUs of every live fleet: fleets outlive runs by design, and a run placed
on a fleet's GPU would fight its vLLM for memory. The hold is an flock on `<name>.<i>.lock` in the
fleet dir, one per replica, so a fleet of N replicas runs N runs at once (an ablation's children)
and the rest wait: the kernel drops it when the holding process dies, so a killed run gives its
replica back without anyone reaping anything, and the fleet's processes are never the run's to kill."""

from __future__ import annotations

import fcntl
import json
import logging
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rlfleet.config.inference import InferenceConfig
from rlfleet.config.loader import ConfigError
from rlfleet.config.model import ModelConfig
from rlfleet.config.models import InferenceJobConfig, RLConfig
from rlfleet.config.weights import FILES
from rlfleet.fleet.state import FleetState, fleet_dir, live_fleets, mismatches, read_state, shape
from rlfleet.inference.server import healthy
from rlfleet.weights.controller import Ticket

if TYPE_CHECKING:  # the controller imports this module before it needs a pool
    from rlfleet.inference.pool import InferencePool

log = logging.getLogger("rlfleet.fleet")


def _live(name: str) -> FleetState:
    state = read_state(name)
    if state is None:
        raise ConfigError(
            f"fleet: {name!r} is not up (no live fleet of that name in {fleet_dir()}); "
            f"start it with `rlfleet fleet up @ fleet.toml`"
        )
    return state


def fleet_urls(name: str, model: ModelConfig, inference: InferenceConfig, seed: int) -> list[str]:
    """Fleet `name`'s replicas, for a run or an eval whose own replicas would be `model` served as
    `inference`; a ConfigError when the fleet is not up or serves differently."""
    return _checked_urls(name, _live(name), model, inference, seed)


def _checked_urls(
    name: str, state: FleetState, model: ModelConfig, inference: InferenceConfig, seed: int
) -> list[str]:
    if inference.urls:
        raise ConfigError("fleet, inference.urls: name one; a fleet gives its own replicas' urls")
    one = InferenceJobConfig(
        model=model,
        seed=seed,
        inference=_attached_inference(inference, state).model_copy(update={"num_replicas": 1}),
        gpu_ids=state["gpu_ids"][: inference.tensor_parallel_size],
    )
    if diffs := mismatches(state["server"], shape(one)):
        raise ConfigError(
            f"fleet: {name!r} serves with other vLLM arguments than this run's replicas would "
            "(set the run's [model]/[inference] as the fleet's, or start a fleet for it):\n  "
            + "\n  ".join(diffs)
        )
    return state["urls"]


def _attached_inference(inference: InferenceConfig, state: FleetState) -> InferenceConfig:
    """`inference` as a run attached to the fleet has it: vLLM's share, where the run leaves it unset
    (the placement's to pick, and it starts no vLLM), is the fleet's, which its trainer sizing reads."""
    share = state["server"].get("--gpu-memory-utilization")
    if inference.gpu_memory_utilization is not None or not share:
        return inference
    return inference.model_copy(update={"gpu_memory_utilization": float(share)})


def attach(cfg: RLConfig) -> RLConfig:
    """`cfg` with its fleet's replica as `inference.urls`, the one it holds (`fleet_hold`); all of
    them where it holds none (a check); unchanged when it names no fleet."""
    if cfg.fleet is None:
        return cfg
    state = _live(cfg.fleet)
    urls = _checked_urls(cfg.fleet, state, cfg.model, cfg.inference, cfg.seed)
    if (slot := held_slot(cfg.fleet, cfg.output_dir)) is not None:
        urls = urls[slot : slot + 1]  # the replica the run holds; its checks see them all
    data = cfg.model_dump()
    data["inference"] = _attached_inference(cfg.inference, state).model_dump() | {
        "urls": urls,
        "num_replicas": len(urls),
    }
    return RLConfig.model_validate(data)  # the rules on urls (weight transports) hold for it too


def replica_gpus(name: str | None, holder: str, tp: int) -> list[str]:
    """The GPUs of the replica of fleet `name` that `holder` holds (a run's output_dir, an eval's
    name), each replica `tp` GPUs wide: where its vLLM is, for what depends on placement (vLLM's
    dtype, whether the trainer shares its GPU: `config/gpu_defaults.py`) and for the GPU lease of
    whoever holds it; [] for none."""
    state = None if name is None else read_state(name)
    slot = held_slot(name, holder)
    if state is None or slot is None:
        return []
    return state["gpu_ids"][slot * tp : (slot + 1) * tp]


def run_gpus(cfg: RLConfig, visible: list[str]) -> list[str]:
    """The visible GPUs a run attached to its fleet places its own processes on: the warm trainer's
    GPU beside the replica it holds first (a one-GPU trainer lands there and the warm trainer
    waiting on it takes the job), then GPUs the fleet does not hold; never a replica's GPU, where
    the trainer would fight vLLM for memory. Checked before it holds one (an ablation checks every
    point first), as if it held the first: every slot leaves a run the same count of GPUs. A run
    that names no fleet: `visible` as is."""
    state = None if cfg.fleet is None else read_state(cfg.fleet)
    if state is None:
        return visible
    trainers = state.get("trainer_gpu_ids", [])
    slot = held_slot(cfg.fleet, cfg.output_dir) or 0
    mine = [g for g in trainers[slot : slot + 1] if g in visible]
    held = {*state["gpu_ids"], *trainers}
    return mine + [g for g in visible if g not in held]


def fleet_gpu_problems(cfg: RLConfig, gpus: list[str]) -> list[str]:
    """The run's GPUs that a live fleet other than its own holds."""
    problems = []
    for state in live_fleets():
        taken = sorted(set(gpus) & {*state["gpu_ids"], *state.get("trainer_gpu_ids", [])})
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


@dataclass(frozen=True)
class _Hold:
    slot: int  # the replica held
    fd: int  # its lock file, flocked
    found: dict[str, str]  # what the lock's last holder left in it (`mark_clean`)


# (fleet, holder) -> the replica this process holds for it: `rlfleet rl` takes it before its early
# start, and the flow, the trainer's launch and the eval in the same process find it here
_HELD: dict[tuple[str, str], _Hold] = {}
WAIT_POLL_S = 0.5


def held_slot(name: str | None, holder: str) -> int | None:
    """The replica of fleet `name` this process holds for `holder` (a run's output_dir), if any."""
    hold = None if name is None else _HELD.get((name, holder))
    return None if hold is None else hold.slot


@contextmanager
def fleet_hold(name: str | None, holder: str) -> Iterator[int | None]:
    """Hold one replica of fleet `name` (and its warm trainer) for `holder`, alone: the first free
    one, waiting while every one is held. Yields its index (None: no fleet). Held again by the same
    holder in this process, the same replica, without a second lock."""
    if name is None:
        yield None
        return
    if (hold := _HELD.get((name, holder))) is not None:
        yield hold.slot
        return
    n = len(_live(name)["urls"])
    hold = _HELD[(name, holder)] = _take(name, n, holder)
    try:
        yield hold.slot
    finally:
        del _HELD[(name, holder)]
        os.close(hold.fd)  # drops the lock; the kernel drops it too when this process dies


def try_lock(name: str, i: int) -> int | None:
    """An fd holding the flock on `<name>.<i>.lock`, None where another process holds it."""
    fleet_dir().mkdir(parents=True, exist_ok=True)
    fd = os.open(fleet_dir() / f"{name}.{i}.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def _take(name: str, n: int, holder: str) -> _Hold:
    """The flock on `<name>.<i>.lock` for the first free replica i; polls while all are held."""
    waiting = False
    while True:
        for i in range(n):
            if (fd := try_lock(name, i)) is None:
                continue
            found = _read_lock(fd)
            _write_lock(fd, {"run": holder, "pid": os.getpid()})  # no `serves`: dirty until marked
            if waiting:
                log.info("fleet %s: replica %d is free: %s takes it", name, i, holder)
            return _Hold(i, fd, found)
        if not waiting:
            held = ", ".join(_holder(fleet_dir() / f"{name}.{i}.lock") for i in range(n))
            log.warning("fleet %s: its %d replica(s) are held (%s): waiting for one", name, n, held)
            waiting = True
        time.sleep(WAIT_POLL_S)


def held_by(state: FleetState) -> list[str | None]:
    """Per replica of a live fleet, who holds it (`run <output_dir> (pid N)`), None where idle."""
    out: list[str | None] = []
    for i in range(len(state["urls"])):
        path = fleet_dir() / f"{state['name']}.{i}.lock"
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            out.append(None)
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)  # takes it only where nobody holds it
            out.append(None)
        except BlockingIOError:
            out.append(_holder(path))
        finally:
            os.close(fd)
    return out


def _holder(path: os.PathLike[str]) -> str:
    try:
        with open(path) as f:
            h = json.loads(f.read())
        return f"run {h['run']} (pid {h['pid']})"
    except (OSError, ValueError, KeyError):
        return "another run"


def _read_lock(fd: int) -> dict[str, str]:
    try:
        found = json.loads(os.pread(fd, 1 << 16, 0) or b"{}")
    except ValueError:
        return {}
    return found if isinstance(found, dict) else {}


def _write_lock(fd: int, content: dict[str, object]) -> None:
    os.ftruncate(fd, 0)
    os.pwrite(fd, json.dumps(content).encode(), 0)


# A replica's clean mark: the lock file says which base model's weights the replica serves unchanged
# (`serves`: the model's fingerprint). A holder writes it only after loading that base itself
# (`give_back`) and the fleet after starting it; taking the lock wipes it, so a run killed mid-way
# leaves the replica marked dirty and the next one loads its base weights as before.


def model_fingerprint(path: str) -> str:
    """The model directory and its files' names, sizes and mtimes: a directory rewritten in place
    is another model."""
    files = sorted(os.scandir(path), key=lambda e: e.name)
    stats = [(e.name, e.stat().st_size, e.stat().st_mtime_ns) for e in files if e.is_file()]
    return json.dumps([os.path.realpath(path), stats])


def serves_base(cfg: RLConfig) -> bool:
    """The replica the run holds serves the run's base model unchanged: its first load is not needed."""
    hold = None if cfg.fleet is None else _HELD.get((cfg.fleet, cfg.output_dir))
    return hold is not None and hold.found.get("serves") == model_fingerprint(str(cfg.model.path))


def mark_clean(cfg: RLConfig) -> None:
    """After the holder loaded its base model back onto its replica: the next holder may skip it."""
    hold = _HELD[(str(cfg.fleet), cfg.output_dir)]
    holder = {"run": cfg.output_dir, "pid": os.getpid()}
    _write_lock(hold.fd, holder | {"serves": model_fingerprint(str(cfg.model.path))})


def give_back(cfg: RLConfig, pool: InferencePool) -> bool:
    """A finished run's end on its fleet: its base model loaded back onto the replica it holds, and
    the replica marked clean, so the next run there starts without that load. Best effort: a replica
    that is down, or a load that fails, stays unmarked (the next run loads its own base)."""
    try:
        if not all(healthy(u) for u in pool.urls):
            return False
        pool.broadcast(base_ticket(cfg))
        mark_clean(cfg)
    except Exception as e:  # noqa: BLE001 - the run is done; the next holder loads its base instead
        log.warning(
            "fleet %s: the base model did not go back onto the replica (%r): the next run loads it",
            cfg.fleet,
            e,
        )
        return False
    return True


def mark_started(name: str, replicas: int, model: str) -> None:
    """The fleet's replicas just started from `model`: each is clean, unless a run holds it."""
    clean = {"serves": model_fingerprint(model)}
    for i in range(replicas):
        if (fd := try_lock(name, i)) is not None:
            _write_lock(fd, clean)
            os.close(fd)
