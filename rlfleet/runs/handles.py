"""The processes a controller runs for one RL run, as one object the flow owns and hands to its tasks.

The flow creates a `RunHandles` per flow run, passes it to every task that acts on the vLLM pool,
the trainer or the rollout stream, and stops them in its `finally`. Nothing else holds them: a
second run in the same process (a test, a flow run retried from the UI) gets its own, and a task
that runs after the close finds a shut pool that relaunches nothing.

`rlfleet rl` starts a CPU run's vLLM replicas, and a fresh run's trainer, before Prefect's
temporary server and the flow (`vllm_started_early`); the flow's `RunHandles` adopts them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from rlfleet import judges
from rlfleet.config.models import RLConfig
from rlfleet.config.placement import Placement
from rlfleet.inference.pool import InferencePool
from rlfleet.orchestrator.stream import RolloutStream
from rlfleet.orchestrator.teacher import Teacher
from rlfleet.procs import kill_group
from rlfleet.progress import Progress
from rlfleet.runs.configs import resolve, write_configs
from rlfleet.runs.dumps import processes
from rlfleet.runs.lock import acquire_run_lock, release_run_lock
from rlfleet.runs.stalls import Stall, StallWatchdog
from rlfleet.runs.waits import Diagnosis, ReplicaState, RunState, StreamState, replica_party
from rlfleet.store import RunDir, RunStore, run_store
from rlfleet.trainer.launch import ExternalTrainer, TrainerProcess
from rlfleet.trainer.resume import pristine

# output_dir -> the pool `vllm_started_early` started for that run, until its flow adopts it
_EARLY: dict[str, InferencePool] = {}
# output_dir -> the trainer it started with them (a fresh run's only), until the flow adopts it
_EARLY_TRAINER: dict[str, TrainerProcess] = {}
# output_dir -> the [[served]] models' pools it started, by name
_EARLY_SERVED: dict[str, dict[str, InferencePool]] = {}


class RunHandles:
    """One RL run's inference pool, trainer and rollout stream (started once the pool serves)."""

    def __init__(
        self, pool: InferencePool, trainer: TrainerProcess, served: dict[str, InferencePool] | None = None
    ):
        self.pool = pool
        self.trainer = trainer
        self.served_pools = served or {}  # [[served]]: frozen teachers and judges, by name
        self.stream: RolloutStream | None = None
        # what moved last, for the stall watchdog: the parties update one tracker
        self.progress = pool.progress = trainer.progress = Progress()
        for p in self.served_pools.values():
            p.progress = self.progress
        self.watchdog: StallWatchdog | None = None

    @classmethod
    def for_run(cls, cfg: RLConfig, placement: Placement | None = None) -> RunHandles:
        """Starts nothing: the `launch_inference_pool` and `start_trainer` tasks do. On multi_node
        the trainer's ranks are the SLURM job's (started on its train nodes): waited on, never
        launched."""
        config_path = trainer_config(run_store(cfg.output_dir))
        kind = ExternalTrainer if cfg.deployment.type == "multi_node" else TrainerProcess
        job = cfg.inference_job(placement.inference_gpus if placement else [])  # None: no GPUs
        trainer_job = cfg.trainer_job(placement.trainer_gpus if placement else [])
        pool = _EARLY.pop(cfg.output_dir, None)
        if pool is not None and pool.cfg != job:  # started for another config: not this run's
            pool.shutdown()
            pool = None
        trainer = _EARLY_TRAINER.pop(cfg.output_dir, None)
        if trainer is not None and trainer.cfg != trainer_job:
            trainer.stop()
            trainer = None
        early = _EARLY_SERVED.pop(cfg.output_dir, {})
        served = {}
        for sjob in cfg.served_jobs(placement.served_gpus if placement else {}):
            p = early.pop(sjob.name, None)
            served[sjob.name] = p if p is not None and p.cfg == sjob else InferencePool(sjob)
            if p is not None and p is not served[sjob.name]:
                p.shutdown()
        for p in early.values():
            p.shutdown()
        return cls(pool or InferencePool(job), trainer or kind(trainer_job, config_path), served)

    @property
    def served(self) -> int:
        """The weight version the replicas hold; -1 = the initial model."""
        return self.pool.policy_step

    def start_stream(self, cfg: RLConfig, store: RunStore, next_step: int) -> RolloutStream:
        """Keep the pool's replicas sampling into the run store's buffer, for steps from `next_step`;
        the served models answer `judge()` from now on, and a distillation teacher scores each group."""
        judges.serve(dict(self.served_pools))
        d = cfg.loss.distill
        teacher = None
        if d is not None:
            teacher = Teacher(self.served_pools[d.teacher], d.teacher, cfg.orchestrator.stall_timeout_s)
        self.stream = RolloutStream(
            cfg.orchestrator,
            store,
            cfg.model.path,
            self.pool,
            lambda: self.served,
            cfg.seed,
            cfg.inference.max_model_len,
            next_step,
            cfg.max_steps,
            self.progress,
            teacher,
        ).start()
        return self.stream

    def ensure_served(self) -> list[str]:
        """Start every served model's replicas at once, then wait for them: what the launch logs."""
        for p in self.served_pools.values():
            p.start()
        return [rep.started for p in self.served_pools.values() if p.ensure() for rep in p.replicas]

    def watch_stalls(self, cfg: RLConfig, store: RunStore, on_stall: Callable[[Stall], None]) -> None:
        """Start the stall watchdog (`[faults]`, runs/stalls.py), unless it is disabled."""
        if cfg.faults.enabled:
            self.watchdog = StallWatchdog(cfg.faults, self.progress, store, self, on_stall).start()

    # -- what the watchdog sees and does (runs/stalls.RunView) --------------------------------
    def starting(self) -> bool:
        store = run_store(self.trainer.cfg.output_dir)
        return bool(self.progress.starting) or self.pool.starting or self.trainer.starting(store)

    def run_state(self, timeout_s: float) -> RunState:
        replicas: list[ReplicaState] = [
            {"index": r.index, "url": r.url, "pid": r.process.pid} for r in list(self.pool.replicas)
        ]
        p = self.trainer.process
        trainer_pid = p.pid if p is not None and p.alive() else None
        roots = {replica_party(r["index"]): r["pid"] for r in replicas} | {"trainer": trainer_pid}
        stream: StreamState | None = None
        if self.stream is not None:
            books = self.stream.buffer  # read without its lock: a diagnosis needs no exact cut
            stream = {
                "next_step": books.taken,
                "batch_size": self.stream.cfg.batch_size,
                "ready": len(books.ready),
                "in_flight": sum(books.in_flight.values()),
                "served": self.served,
            }
        return {
            "timeout_s": timeout_s,
            "progress": self.progress.snapshot(),
            "replicas": replicas,
            "trainer": {
                "pid": trainer_pid,
                "starting": self.trainer.starting(run_store(self.trainer.cfg.output_dir)),
            },
            "stream": stream,
            "processes": processes(roots),
        }

    def relaunch(self, d: Diagnosis) -> str | None:
        """Kill the stuck part: the pool relaunches a dead replica, the `train` task's retry a dead
        trainer. SLURM's trainer ranks are not this controller's to kill."""
        if d.culprit == "replica":
            victims = [r for r in list(self.pool.replicas) if r.index in d.replicas]
            _kill([r.process.pid for r in victims])
            return f"killed replica {', '.join(str(r.index) for r in victims)}" if victims else None
        if d.culprit == "trainer" and (pid := self._trainer_pid()) is not None:
            _kill([pid])
            return "killed the trainer"
        return None

    def halt(self) -> None:
        replicas = [r for pool in (self.pool, *self.served_pools.values()) for r in list(pool.replicas)]
        _kill([*(r.process.pid for r in replicas), self._trainer_pid()])

    def _trainer_pid(self) -> int | None:
        """The trainer process this controller started (SLURM's ranks are not its to kill)."""
        p = self.trainer.process
        return None if p is None or isinstance(self.trainer, ExternalTrainer) else p.pid

    def stop_sampling(self) -> None:
        """The stream first (a rollout waiting for its groups fails fast), then the replicas (a
        rollout still in flight cannot relaunch them). The stall watchdog before either: their
        stop is no stall."""
        if self.watchdog is not None:
            self.watchdog.stop()
        if self.stream is not None:
            self.stream.stop()
        judges.withdraw(list(self.served_pools))
        self.pool.shutdown()
        for p in self.served_pools.values():
            p.shutdown()

    def stop_trainer(self) -> None:
        """Apart from `stop_sampling`: the flow waits for its rollouts in flight between the two."""
        self.trainer.stop()


def _kill(pids: list[int | None]) -> None:
    for pid in pids:
        if pid is not None:
            kill_group(pid, grace_s=1.0)  # SIGKILL reaches a frozen process too


def trainer_config(store: RunStore) -> Path:
    """The trainer's config as its process reads it (`write_configs` puts it there)."""
    return RunDir(store.local_dir).config("trainer")


def started_early(output_dir: str) -> bool:
    """Whether `vllm_started_early` holds replicas for the run in `output_dir`, not yet adopted."""
    return output_dir in _EARLY


@contextmanager
def vllm_started_early(config: RLConfig) -> Iterator[None]:
    """Preflight `config`; on a CPU box, start its vLLM replicas now for the flow run inside the
    `with` to adopt, instead of after Prefect's temporary server and the flow have started (about
    20 s on 2 cores; vLLM's own start is the longest part of a run's first step).

    A fresh run's trainer starts here too: its imports and model load took the cores from step
    0's sampling when the flow started it. Only a fresh one: a resumed run's flow first removes the
    dead life's work past its checkpoint (`discard_stale`), and an early trainer would already
    train the kept batch and write the metrics that removes.

    A run on GPUs starts nothing here: the flow leases its GPUs first (workers/leases.py), and
    another run may hold them. What no flow adopted (it failed first, or resolved another config)
    is stopped on the way out.
    """
    cfg, placement = resolve(config)
    if placement.gpus or cfg.inference.urls or cfg.deployment.type != "single_node":
        yield
        return
    store = run_store(cfg.output_dir)
    acquire_run_lock(store)  # a second controller would reap the first one's replicas
    pool = _EARLY[cfg.output_dir] = InferencePool(cfg.inference_job(placement.inference_gpus))
    pool.start()
    served = _EARLY_SERVED[cfg.output_dir] = {j.name: InferencePool(j) for j in cfg.served_jobs()}
    for p in served.values():
        p.start()
    trainer = None
    if pristine(store):
        write_configs(cfg, placement)  # the trainer reads configs/trainer.toml
        trainer = _EARLY_TRAINER[cfg.output_dir] = TrainerProcess(
            cfg.trainer_job(placement.trainer_gpus), trainer_config(store)
        )
        trainer.ensure()
    try:
        yield
    finally:
        if _EARLY.pop(cfg.output_dir, None) is pool:
            pool.shutdown()
        for p in _EARLY_SERVED.pop(cfg.output_dir, {}).values():
            p.shutdown()
        if trainer is not None and _EARLY_TRAINER.pop(cfg.output_dir, None) is trainer:
            trainer.stop()
        release_run_lock(store)
