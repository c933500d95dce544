"""`rlfleet rl` starts a run's vLLM replicas, and a fresh run's trainer, before Prefect's temporary
server and the flow; the flow's `RunHandles` adopts them.

vLLM's start is the longest part of step 0 (on one H200 62 s, on 2 CPU cores 12-35 s); Prefect's
temporary server (4-14 s) and the flow's imports come up while it loads. The trainer starts with
it so that it has its model loaded when step 0's batch comes, and on a CPU box its imports no
longer take the cores from step 0's sampling. Only a fresh run's trainer: a resumed run's flow
first removes the dead life's work past its checkpoint (`discard_stale`), and an early trainer
would already train the kept batch and write the metrics that removes.

GPUs: the run's `gpu-<id>` slots (workers/leases.py) bind only on a Prefect API that runs share
(PREFECT_API_URL). There the slots are taken first, and held until the flow ends: another run may
hold the GPUs, and the flow, which leases them again, finds them held by its run. Without one, the
flow's temporary server is this process's own, so no other run can hold its slots: the processes
start at once and the flow leases them there.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field

from rlfleet.config.models import InferenceJobConfig, RLConfig, TrainerJobConfig
from rlfleet.config.placement import Placement
from rlfleet.fleet.attach import fleet_hold
from rlfleet.inference.pool import InferencePool
from rlfleet.runs.configs import resolve, trainer_config, write_configs
from rlfleet.runs.lock import acquire_run_lock, release_run_lock
from rlfleet.store import run_store
from rlfleet.trainer.launch import TrainerProcess
from rlfleet.trainer.resume import pristine


@dataclass
class Early:
    """What `early_start` started for one run, until its flow adopts it."""

    pool: InferencePool | None  # none: the run attaches to a fleet's replicas (fleet/attach.py)
    served: dict[str, InferencePool] = field(default_factory=dict)  # [[served]] models, by name
    trainer: TrainerProcess | None = None

    def stop(self) -> None:
        for p in (self.pool, *self.served.values()):
            if p is not None:
                p.shutdown()
        if self.trainer is not None:
            self.trainer.stop()


# output_dir -> what `early_start` started for that run, until its flow adopts it
_RUNS: dict[str, Early] = {}


def started_early(output_dir: str) -> bool:
    """Whether `early_start` holds processes for the run in `output_dir`, not yet adopted."""
    return output_dir in _RUNS


def adopt(
    output_dir: str, job: InferenceJobConfig, trainer_job: TrainerJobConfig, served: list[InferenceJobConfig]
) -> tuple[InferencePool | None, TrainerProcess | None, dict[str, InferencePool]]:
    """The run's early processes that were started for the configs the flow resolved (pool,
    trainer, served pools by name); the rest are stopped: they are not this run's."""
    early = _RUNS.pop(output_dir, None)
    if early is None:
        return None, None, {}
    pool = early.pool if early.pool is not None and early.pool.cfg == job else None
    trainer = early.trainer if early.trainer is not None and early.trainer.cfg == trainer_job else None
    kept = {n: p for n, p in early.served.items() if p.cfg in served}
    if pool is None and early.pool is not None:
        early.pool.shutdown()
    for name in early.served.keys() - kept.keys():
        early.served[name].shutdown()
    if trainer is None and early.trainer is not None:
        early.trainer.stop()
    return pool, trainer, kept


@contextmanager
def early_start(config: RLConfig) -> Iterator[None]:
    """Preflight `config`, then start its processes for the flow run inside the `with` to adopt;
    what no flow adopted (it failed first, or resolved another config) is stopped on the way out.
    A run on given servers (`inference.urls`) or on SLURM starts nothing here; one attached to a
    fleet starts only its trainer (the fleet's replicas serve already)."""
    with fleet_hold(config.fleet, config.output_dir):  # its replica, before its config names it
        cfg, placement = resolve(config)
        if (cfg.inference.urls and cfg.fleet is None) or cfg.deployment.type != "single_node":
            yield
            return
        with _started(cfg, placement):
            yield


@contextmanager
def _started(cfg: RLConfig, placement: Placement) -> Iterator[None]:
    store = run_store(cfg.output_dir)
    with _lease_first(cfg, placement):
        acquire_run_lock(store)  # a second controller would reap the first one's replicas
        try:
            own = None if cfg.fleet else InferencePool(cfg.inference_job(placement.inference_gpus))
            early = _RUNS[cfg.output_dir] = Early(own)
            if own is not None:
                own.start()
            early.served = {j.name: InferencePool(j) for j in cfg.served_jobs(placement.served_gpus)}
            for p in early.served.values():
                p.start()
            if pristine(store):
                write_configs(cfg, placement)  # the trainer reads configs/trainer.toml
                early.trainer = TrainerProcess(cfg.trainer_job(placement.trainer_gpus), trainer_config(store))
                early.trainer.ensure()
            yield
        finally:
            if (left := _RUNS.pop(cfg.output_dir, None)) is not None:
                left.stop()
            release_run_lock(store)


def _lease_first(cfg: RLConfig, placement: Placement) -> AbstractContextManager[None]:
    """The run's GPU slots where they bind (workers/leases.py decides); a CPU run has none, and
    imports no Prefect before its processes start."""
    if not placement.gpus:
        return nullcontext()
    from rlfleet.workers.leases import lease_before_start

    return lease_before_start(cfg.output_dir, placement.gpus)
