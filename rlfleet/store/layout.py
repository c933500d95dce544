"""Every path in a run's directory, named once: the run store is the processes' wire protocol.

The flow, the trainer, vLLM's workers, `rlfleet runs status` and the benchmarks never import each
other's state; they meet at these paths, so a path spelled in two modules would be two protocols.
Paths here are relative to the run's root (what `RunStore` methods take); `RunDir` names the files
that stay on one machine (logs, pidfiles, the configs child processes read) under
`RunStore.local_dir`. What each file holds is `store/records.py`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

MANIFEST = "manifest.json"  # written last: a directory artifact is complete once it exists

# Directory artifacts `<kind>/step_N/`, published whole (`RunStore.publish_dir`).
ROLLOUTS = "rollouts"  # the step's trajectory records (records.TrajectoryRecord), one JSONL
# that JSONL; it keeps the name of the per-replica shards it replaced, so older runs read the same
ROLLOUT_RECORDS = "replica_0.jsonl"
BATCHES = "batches"  # the trainer's micro-batches (rlfleet/microbatches.py)
WEIGHTS = "weights"  # an HF model directory vLLM reloads (the filesystem transport)
CHECKPOINTS = "checkpoints"  # trainer state and the HF model (`CHECKPOINT_MODEL`)

# Per-step JSON records `<kind>/step_N.json`.
METRICS = "metrics"  # the trainer's (records.TrainerMetrics), written last: step N is done
STEPS = "steps"  # the flow's (records.StepRecord)
SYNC = "sync"  # weight tickets of the transports that send tensors (weights/tickets.py)
EVALS = "evals"  # records.EvalRecord; `evals/base.json` before training

# Whole-run files.
SUMMARY = "summary.json"
REWARD_CURVE = "reward_curve.png"
LOSS_CURVE = "loss_curve.png"
ABLATION = "ablation.json"
LOGS = "logs"  # a remote store's copy of this machine's `RunDir.logs` (runs/logs.py)
PREFECT_RESULTS = "prefect/results"  # persisted task results (tasks/storage.py)
RECOVERIES = "run/recoveries.json"  # relaunches and resent samples (flows/monitor.py)
TRAINER_ERROR = "run/trainer_error.json"  # a dying trainer's cause (trainer/loop.py)
TRAINER_UP = "run/trainer_up.json"  # a trainer has its model and waits for batches (trainer/loop.py)
STALLS = "stalls"  # `stalls/<time>/`: py-spy dumps and summary.txt of a stalled run (runs/stalls.py)
WEIGHTS_SERVED = "run/weights_served.json"  # the step every replica holds (weights/tickets.py)
REGROUP = "sync/regroup.json"  # the controller asks for a new nccl group
REGROUPED = "sync/regrouped.json"  # the trainer's answer
BUFFER_GROUPS = "buffer/groups"  # finished groups the rollout stream has not published yet
BUFFER_CURSOR = "buffer/cursor.json"  # the next prompt chunk the stream draws
BUFFER_PARTIALS = "buffer/partials"  # the samples in flight, as they stream (orchestrator/partials.py)
SLURM_JOB = "slurm/job.json"

# Inside a checkpoint.
CHECKPOINT_MODEL = "model"  # HF model dir: eval, a relaunched replica, a resume's from_pretrained
OPTIMIZER = "optimizer.pt"  # unsharded trainer state; sharded (FSDP2) it is `DCP`
ADAPTER = "adapter.pt"  # LoRA adapters beside OPTIMIZER
DCP = "dcp"  # torch.distributed.checkpoint of every rank's shards

STEP_RECORDS = (METRICS, STEPS, SYNC)  # what a resume discards past its checkpoint (trainer/resume.py)


def step_dir(kind: str, step: int) -> str:
    return f"{kind}/step_{step}"


def step_json(kind: str, step: int) -> str:
    return f"{kind}/step_{step}.json"


def step_of(name: str, suffix: str = "") -> int | None:
    """N of a name `step_N<suffix>` (a `step_dir`, or with ".json" a `step_json`), else None."""
    n = name[5 : len(name) - len(suffix)] if name.startswith("step_") and name.endswith(suffix) else ""
    return int(n) if n.isdigit() else None


def micro_batch(k: int) -> str:
    """The k-th file of `batches/step_N`."""
    return f"micro_{k}.safetensors"


def eval_record(step: int | None) -> str:
    """`evals/step_N.json`; None: the base model's, before training."""
    return f"{EVALS}/base.json" if step is None else step_json(EVALS, step)


PLACEMENT = "configs/placement.json"  # what runs where (config/placement.py `Placement.to_json`)


def config(name: str) -> str:
    """The resolved config `name` (rl, trainer, inference, sft) as `configs/<name>.toml`."""
    return f"configs/{name}.toml"


def stall_dir(at: str) -> str:
    """`stalls/<at>/` (`at` a UTC time such as 20261127T101530.042Z): one stall's dumps and summary."""
    return f"{STALLS}/{at}"


def stall_dump(at: str, name: str) -> str:
    """A process's py-spy dump in a stall's directory (`name`: replica_0.api_server.1234, ...)."""
    return f"{stall_dir(at)}/{name}.txt"


def sbatch_script(command: str) -> str:
    return f"slurm/{command}.sbatch"


def buffered_group(uid: str) -> str:
    return f"{BUFFER_GROUPS}/{uid}.json"


def partials_log(life: int) -> str:
    """One sampling life's append-only log of its samples in flight (records.PartialRecord, JSONL)."""
    return f"{BUFFER_PARTIALS}/{life:08d}.jsonl"


PARTIALS_LOGS = f"{BUFFER_PARTIALS}/*.jsonl"  # every life's `partials_log`, as a glob


def partials_life(path: str) -> int | None:
    """The life of a `partials_log` path (a listing's entry), else None."""
    name = path.rsplit("/", 1)[-1].removesuffix(".jsonl")
    return int(name) if name.isdigit() else None


def group_uid(path: str) -> str:
    """The uid of a `buffered_group` path (a listing's entry)."""
    return path.rsplit("/", 1)[-1].removesuffix(".json")


@dataclass(frozen=True)
class RunDir:
    """A run's files on this machine: the output_dir itself, or a remote store's local cache."""

    root: Path

    def logs(self, component: str) -> Path:
        """`logs/<component>/`: trainer, sft, inference, slurm."""
        return self.root / LOGS / component

    def replica_log(self, index: int, model: str = "policy") -> Path:
        """The policy's replica i: `replica_<i>.log`; a `[[served]]` model's: `<name>_<i>.log`."""
        return self.logs("inference") / (
            f"replica_{index}.log" if model == "policy" else f"{model}_{index}.log"
        )

    @staticmethod
    def replica_pidfile(index: int, model: str = "policy") -> str:
        """The `pidfile` name of a replica: `inference_<i>`, or `<name>_<i>` for a served model."""
        return f"inference_{index}" if model == "policy" else f"{model}_{index}"

    def pidfile(self, name: str) -> Path:
        """`run/<name>.pid`: controller (the run's lock), trainer, inference_<i>, sft."""
        return self.root / "run" / f"{name}.pid"

    def pidfiles(self) -> list[Path]:
        return sorted((self.root / "run").glob("*.pid"))

    def config(self, name: str) -> Path:
        """The copy of `config(name)` a child process reads (a remote store's is in the cache)."""
        return self.root / config(name)

    @property
    def sft_ranks_config(self) -> Path:
        """The SFT config torchrun ranks read."""
        return self.root / "run" / "sft.toml"

    @property
    def eval_servers(self) -> Path:
        """The output_dir of a checkpoint eval's own vLLM servers (their logs)."""
        return self.root / "eval"


def rank_log(log_dir: str | Path, rank: int | str) -> Path:
    """`rank_R.log` in a torchrun launcher's log directory (`RunDir.logs`)."""
    return Path(log_dir) / f"rank_{rank}.log"
