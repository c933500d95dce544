"""The processes a controller runs for one RL run, as one object the flow owns and hands to its tasks.

The flow creates a `RunHandles` per flow run, passes it to every task that acts on the vLLM pool,
the trainer or the rollout stream, and stops them in its `finally`. Nothing else holds them: a
second run in the same process (a test, a flow run retried from the UI) gets its own, and a task
that runs after the close finds a shut pool that relaunches nothing.
"""

from __future__ import annotations

from rlfleet.config.models import RLConfig
from rlfleet.inference.pool import InferencePool
from rlfleet.orchestrator.stream import RolloutStream
from rlfleet.store import RunStore, run_store
from rlfleet.trainer.launch import ExternalTrainer, TrainerProcess


class RunHandles:
    """One RL run's inference pool, trainer and rollout stream (started once the pool serves)."""

    def __init__(self, pool: InferencePool, trainer: TrainerProcess):
        self.pool = pool
        self.trainer = trainer
        self.stream: RolloutStream | None = None

    @classmethod
    def for_run(cls, cfg: RLConfig, inference_gpus: list[str], trainer_gpus: list[str]) -> RunHandles:
        """Starts nothing: the `launch_inference_pool` and `start_trainer` tasks do. On multi_node
        the trainer's ranks are the SLURM job's (started on its train nodes): waited on, never
        launched."""
        config_path = run_store(cfg.output_dir).local_dir / "configs" / "trainer.toml"
        kind = ExternalTrainer if cfg.deployment.type == "multi_node" else TrainerProcess
        return cls(
            InferencePool(cfg.inference_job(inference_gpus)), kind(cfg.trainer_job(trainer_gpus), config_path)
        )

    @property
    def served(self) -> int:
        """The weight version the replicas hold; -1 = the initial model."""
        return self.pool.policy_step

    def start_stream(self, cfg: RLConfig, store: RunStore, next_step: int) -> RolloutStream:
        """Keep the pool's replicas sampling into the run store's buffer, for steps from `next_step`."""
        self.stream = RolloutStream(
            cfg.orchestrator,
            store,
            cfg.model.path,
            self.pool,
            lambda: self.served,
            cfg.seed,
            cfg.inference.max_model_len,
            next_step,
        ).start()
        return self.stream

    def stop_sampling(self) -> None:
        """The stream first (a rollout waiting for its groups fails fast), then the replicas (a
        rollout still in flight cannot relaunch them)."""
        if self.stream is not None:
            self.stream.stop()
        self.pool.shutdown()

    def stop_trainer(self) -> None:
        """Apart from `stop_sampling`: the flow waits for its rollouts in flight between the two."""
        self.trainer.stop()
