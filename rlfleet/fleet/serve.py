"""`rlfleet fleet up`: start the fleet's replicas and its Prefect API (fleet/api.py), say where they
are, keep them serving until SIGTERM or SIGINT (`rlfleet fleet down NAME` sends it). A replica that
dies is relaunched by the pool's watch (inference/pool.py), from the base model; a run attached to
it waits for it and loads its own weights on it again (`InferencePool._rejoin`). A Prefect server
that dies is started again here, and a fresh warm trainer (fleet/warm.py) and warm controller
(fleet/controller.py) for each one a run took (fleet/keeper.py)."""

from __future__ import annotations

import logging
import os
import signal
import threading

from rlfleet.config.fleet import FleetConfig
from rlfleet.config.inference import check_ports
from rlfleet.config.loader import ConfigError, raise_if
from rlfleet.config.model import check_model
from rlfleet.config.placement import visible_gpus
from rlfleet.fleet.api import FleetApi, check_api_port
from rlfleet.fleet.attach import mark_started
from rlfleet.fleet.keeper import WarmKeeper
from rlfleet.fleet.rest import rest_idle
from rlfleet.fleet.state import FleetState, fleet_dir, read_state, remove_state, write_state
from rlfleet.inference.pool import InferencePool
from rlfleet.procs import running, wait_until

log = logging.getLogger("rlfleet.fleet")
KEEP_S = 1.0  # how often the fleet looks at its Prefect server


def preflight(cfg: FleetConfig, visible: list[str] | None = None) -> None:
    """What must hold before a replica starts: one fleet of a name, its model, its GPUs, free ports."""
    if (up := read_state(cfg.name)) is not None:
        raise ConfigError(
            f"name: fleet {cfg.name!r} is already up (pid {up['pid']}): `rlfleet fleet down {cfg.name}` first"
        )
    problems = check_model(cfg.model) + check_gpu_ids(cfg, visible) + check_ports(cfg.inference)
    raise_if(problems + check_api_port(cfg))


def check_gpu_ids(cfg: FleetConfig, visible: list[str] | None = None) -> list[str]:
    """gpu_ids and trainer_gpu_ids name GPUs as CUDA_VISIBLE_DEVICES does, as a run's placement does:
    one this process cannot see would put a replica where another process already is."""
    if not (cfg.gpu_ids or cfg.trainer_gpu_ids):
        return []
    visible = visible_gpus() if visible is None else visible
    where = f"visible: {','.join(visible) or 'none'} (CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', '<unset>')})"
    return [
        f"{field}: GPU {gpu} is not visible here; {where}"
        for field, ids in (("gpu_ids", cfg.gpu_ids), ("trainer_gpu_ids", cfg.trainer_gpu_ids))
        for gpu in ids
        if gpu not in visible
    ]


def serve(cfg: FleetConfig, stop: threading.Event, ready: threading.Event | None = None) -> FleetState:
    """Run the fleet until `stop` is set; returns the state it published."""
    preflight(cfg)
    home = fleet_dir() / cfg.name
    job = cfg.job(str(home))
    pool, api = InferencePool(job), FleetApi(cfg, home)
    n = cfg.inference.num_replicas
    m = cfg.model
    early = bool(cfg.gpu_ids or cfg.trainer_gpu_ids)  # the next warm ones start beside a run (keeper.py)
    trainers = [
        WarmKeeper.trainer(home, i, cfg.trainer_gpu_ids[i : i + 1], m.path, m.dtype, early) for i in range(n)
    ]
    trainers = trainers if cfg.trainer else []
    warm = trainers + [WarmKeeper.controller(home, i, m.path, early) for i in range(n)]
    try:
        pool.start()
        api.start()  # beside the replicas
        for w in warm:
            w.start()
        urls = pool.ensure()
        for w in warm:
            w.release()
        mark_started(cfg.name, n, cfg.model.path)  # its replicas serve the base model: runs skip that load
        spools = str(home / "trainer") if trainers else ""
        api_url = api.wait_ready()
        api.create_gpu_limits(sorted({*cfg.gpu_ids, *cfg.trainer_gpu_ids}))
        for w in warm:
            w.wait_ready()
        state = write_state(cfg.name, urls, job, api_url, spools, cfg.trainer_gpu_ids)
        log.info(
            "fleet %s up: %s serving %s, Prefect API %s, %s; runs attach with fleet = %r",
            cfg.name,
            ", ".join(state["urls"]),
            cfg.model.path,
            state["api_url"],
            f"{n} warm controller(s), "
            + (
                f"{n} warm trainer(s) on {','.join(cfg.trainer_gpu_ids) or 'the CPU'}"
                if trainers
                else "no warm trainer"
            ),
            cfg.name,
        )
        if ready is not None:
            ready.set()
        while not stop.wait(KEEP_S):
            api.keep()
            for w in warm:
                w.keep()
            if job.inference.sleep:  # a GPU fleet: its idle replicas rest asleep (fleet/rest.py)
                rest_idle(cfg.name, state["urls"])
        return state
    finally:
        remove_state(cfg.name)
        pool.shutdown()
        api.stop()
        for w in warm:
            w.stop()


def up(cfg: FleetConfig) -> int:
    """The `rlfleet fleet up` command: serve in the foreground, down on SIGTERM / SIGINT."""
    stop = threading.Event()
    if threading.current_thread() is threading.main_thread():  # only it may set handlers
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
    serve(cfg, stop)
    log.info("fleet %s down", cfg.name)
    return 0


def down(name: str, timeout_s: float = 120.0) -> bool:
    """SIGTERM fleet `name`'s process and wait for it to stop; False if it was not up."""
    state = read_state(name)
    if state is None:
        return False
    os.kill(state["pid"], signal.SIGTERM)
    wait_until(lambda: not running(state["pid"], state["started"]), timeout_s, what=f"fleet {name} to stop")
    return True
