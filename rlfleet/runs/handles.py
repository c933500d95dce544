"""The processes a controller runs for one RL run, as one object the flow owns and hands to its tasks.

The flow creates a `RunHandles` per flow run, passes it to every task that acts on the vLLM pool,
the trainer or the rollout stream, and stops them in its `finally`. Nothing else holds them: a
second run in the same process (a test, a flow run retried from the UI) gets its own, and a task
that runs after the close finds a shut pool that relaunches nothing.

`rlfleet rl` starts a run's vLLM replicas, and a fresh run's trainer, before Prefect's temporary
server and the flow (runs/early.py); the flow's `RunHandles` adopts them.
"""

from __future__ import annotations

from collections.abc import Callable

from rlfleet import judges
from rlfleet.config.models import RLConfig
from rlfleet.config.placement import Placement
from rlfleet.fleet.attach import give_back as fleet_give_back
from rlfleet.inference.pool import InferencePool
from rlfleet.orchestrator.stream import RolloutStream
from rlfleet.orchestrator.teacher import Teacher
from rlfleet.procs import kill_group
from rlfleet.progress import Progress
from rlfleet.runs.configs import trainer_config
from rlfleet.runs.dumps import processes
from rlfleet.runs.early import adopt
from rlfleet.runs.stalls import Stall, StallWatchdog
from rlfleet.runs.waits import Diagnosis, ReplicaState, RunState, StreamState, replica_party
from rlfleet.store import RunStore, run_store
from rlfleet.trainer.launch import ExternalTrainer, TrainerProcess


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
        """Starts nothing: the `launch_inference_pool` and `start_trainer` tasks do, or adopt what
        `rlfleet rl` started for this run (runs/early.py). On multi_node the trainer's ranks are the
        SLURM job's (started on its train nodes): waited on, never launched."""
        kind = ExternalTrainer if cfg.deployment.type == "multi_node" else TrainerProcess
        job = cfg.inference_job(placement.inference_gpus if placement else [])  # None: no GPUs
        trainer_job = cfg.trainer_job(placement.trainer_gpus if placement else [])
        served_jobs = cfg.served_jobs(placement.served_gpus if placement else {})
        pool, trainer, early = adopt(cfg.output_dir, job, trainer_job, served_jobs)
        served = {j.name: early.get(j.name) or InferencePool(j) for j in served_jobs}
        config_path = trainer_config(run_store(cfg.output_dir))
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

    def stop_sampling(self, give_back: RLConfig | None = None) -> None:
        """The stream first (a rollout waiting for its groups fails fast), then the replicas (a
        rollout still in flight cannot relaunch them). The stall watchdog before either: their
        stop is no stall. give_back: a finished run on a fleet, whose base model goes back onto
        its replica in between (fleet/attach.py `give_back`)."""
        if self.watchdog is not None:
            self.watchdog.stop()
        if self.stream is not None:
            self.stream.stop()
        if give_back is not None:
            fleet_give_back(give_back, self.pool)
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
