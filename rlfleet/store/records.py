"""What the run store's files hold: one TypedDict per record that crosses a process boundary.

Writers fill every required key, so readers index (`m["clip_frac"]`) instead of guessing a
default. One name per quantity: the mean reward is `mean_reward` everywhere (rollout manifest,
step record, eval record, summary). The trainer's metrics and the flow's step records are written
and read only through the functions below; where each file lives is `layout.py`.
"""

# No `from __future__ import annotations`: Python 3.11's TypedDict sees NotRequired only in
# evaluated annotations (`__optional_keys__`, which tests/test_e2e.py checks the files against).
from typing import Any, NotRequired, TypedDict

from rlfleet.store import layout
from rlfleet.store.runstore import RunStore


class Manifest(TypedDict):
    """Every directory artifact's `manifest.json` (RunStore.publish_dir) begins with these."""

    artifact: str
    created: float
    files: dict[str, dict[str, Any]]  # relative name -> {size, sha256}


class TrajectoryRecord(TypedDict):
    """One sample in `rollouts/step_N` (orchestrator/rollout.py:trajectory_record)."""

    group: int
    env: str
    example_uid: str
    input_ids: list[int]
    loss_mask: list[int]  # 1 on sampled tokens only
    logprobs: list[float]  # the sampler's, 0.0 on prompt and fed tokens
    prompt_len: int
    reward: float
    metrics: dict[str, float]  # the env's reward functions and named metrics
    error: str | None  # a reward function that raised or timed out (reward 0)
    policy_step: int  # the oldest weight version among its sampled tokens
    policy_step_max: int  # the newest
    truncated: bool
    turns: list[dict[str, Any]]
    messages: list[dict[str, Any]]
    completion: str
    group_uid: NotRequired[str]  # set when the stream takes the group for a step
    sample_id: NotRequired[str]  # "<group uid>/<index in the group>": stable across a restart
    overlong: NotRequired[bool]  # orchestrator.shaping
    overlong_penalty: NotRequired[float]
    advantage: NotRequired[float]  # set while batching
    teacher_logprobs: NotRequired[list[float]]  # loss.distill: the teacher's, 0.0 where logprobs is


class PartialStart(TypedDict):
    """`buffer/partials/<life>.jsonl`: a group began sampling (orchestrator/partials.py)."""

    group: str  # its uid, "<prompt chunk>-<env>-<index in it>"
    env: str
    n: int  # samples: "<group>/0" .. "<group>/<n-1>"
    served: int  # the weight version served when it started


class PartialTokens(TypedDict):
    """What one sample streamed since the log's last flush: its first turn's tokens from offset `at`."""

    sample: str  # "<group uid>/<index>"
    at: int  # where `ids` begin in the sample's completion (a re-written prefix overlaps: same tokens)
    ids: list[int]
    logprobs: list[float]
    versions: list[list[int]]  # per token, as runs [[version, count], ...]
    finish: NotRequired[str]  # the turn's finish_reason, once it finished


class PartialEnd(TypedDict):
    """A group left the books: its partial tokens no longer count."""

    group: str
    ended: str  # "finished" (its group file superseded them), "failed", "aborted_stale", "dropped_stale"


PartialRecord = PartialStart | PartialTokens | PartialEnd


class RolloutStats(TypedDict):
    """A rollout's step-level numbers (orchestrator/rollout.py:rollout_stats)."""

    num_samples: int
    mean_reward: float
    reward_std: float
    reward_max: float
    num_completion_tokens: int
    reward_errors: int
    first_error: str | None
    truncated: int
    resent_samples: int
    turns_mean: float
    metrics: dict[str, float]  # "<env>/<metric>", and "<env>/mean_reward" with several envs


class RolloutManifest(Manifest, RolloutStats):
    """`rollouts/step_N/manifest.json` (orchestrator/stream.py:RolloutStream.take)."""

    step: int
    policy_step: int  # the oldest weights among the step's samples
    policy_steps: list[int]
    sample_seconds: float  # how long the step waited for its groups
    group_uids: list[str]
    buffered_groups: int
    stream: dict[str, int]  # the stream's lifetime counts (orchestrator/buffer.py:Counts)
    taken_at: float
    shaping: NotRequired[dict[str, float]]


class BatchManifest(Manifest):
    """`batches/step_N/manifest.json` (orchestrator/step_batches.py:publish_batches)."""

    step: int
    micro_batches: int
    num_sequences: int
    max_tokens: int
    num_loss_tokens: int
    policy_steps: list[int]
    max_staleness: int
    cursor: dict[str, Any]  # where the data continues: the checkpoint keeps it
    temperature: float
    seq_len: int


class CheckpointManifest(Manifest):
    """`checkpoints/step_N/manifest.json` (trainer/checkpoint.py)."""

    step: int
    cursor: dict[str, Any]
    lora: bool


class TrainerMetrics(TypedDict):
    """`metrics/step_N.json` of an RL trainer (trainer/loop.py with trainer/rl.py's fields); its
    existence says step N is done.

    Also: each loss term's metric (trainer/losses/objective.py) and an MoE's `router/<name>`."""

    step: int
    loss: float
    grad_norm: float
    lr: float
    clip_frac: float
    mask_frac: float
    ratio_mean: float
    mismatch_kl: float
    logprob_diff_max: float
    num_loss_tokens: int
    train_seconds: float  # forward, backward and the optimizer step
    train_tokens_per_s: float  # real tokens trained (all ranks) / train_seconds
    padding_frac: float  # of the positions the trainer computed, those that were no token
    mfu: NotRequired[float]  # a GPU of known peak: trainer/flops.py's model FLOPs / train_seconds / peak
    publish_seconds: float  # handing the weights to the transport
    step_seconds: float  # the whole step in the trainer, from its batch to this record
    policy_steps: list[int]
    max_staleness: int
    micro_batches: NotRequired[int]  # a GPU trainer's sizing (trainer/budget.py)
    micro_batch_tokens: NotRequired[int]
    activation_checkpointing: NotRequired[bool]
    peak_memory_gib: NotRequired[float]
    checkpoint_seconds: NotRequired[float]  # on checkpoint steps
    distill_kl: NotRequired[float]  # loss.distill: mean sampler - teacher logprob per loss token
    wait_seconds: NotRequired[float]  # added by the controller: how long it waited for the record


class SFTMetrics(TypedDict):
    """`metrics/step_N.json` of an SFT trainer (trainer/sft.py); the summary's `steps`."""

    step: int
    epoch: int
    loss: float
    loss_tokens: int
    tokens: int  # input tokens, prompts included
    grad_norm: float
    lr: float
    train_seconds: float
    seconds: float


class StepRecord(TypedDict):
    """`steps/step_N.json`: the flow's record of a step (flows/rl.py), the summary's `steps`."""

    step: int
    mean_reward: float
    reward_errors: int  # samples whose reward function raised or timed out
    env_metrics: dict[str, float]  # per env: reward functions' scores and named metrics
    step_seconds: float
    loss: float
    train_seconds: float
    policy_step: int
    policy_steps: list[int]
    max_staleness: int
    clip_frac: float  # stale samples show up here and in mask_frac
    mask_frac: float
    sample_seconds: float  # how long the step waited for its groups
    num_completion_tokens: int
    trainer_seconds: float
    broadcast_seconds: float
    broadcast_parts: dict[str, Any]  # replica 0: pause, load, resume; empty after a regroup
    phase_seconds: dict[str, float]  # each task as the flow saw it
    stream: dict[str, int]  # the rollout stream's counts when the step took its groups
    finished_at: float
    router: NotRequired[dict[str, float]]  # MoE: the router's load balance (trainer/router.py)
    shaping: NotRequired[dict[str, float]]  # orchestrator.shaping's counts
    eval: NotRequired[dict[str, dict[str, float]]]  # env -> {mean_reward, pass@1} on eval steps


class EvalRecord(TypedDict):
    """`evals/step_N.json` or `evals/base.json` (tasks/eval.py)."""

    step: int | None
    source: str  # "rl": the run's own servers; "eval": a checkpoint on its own
    envs: list[dict[str, Any]]
    num_samples: int
    mean_reward: float
    pass_rate: float
    temperature: float


def write_metrics(store: RunStore, step: int, metrics: TrainerMetrics | SFTMetrics) -> None:
    store.write_json(layout.step_json(layout.METRICS, step), metrics)


def read_metrics(store: RunStore, step: int) -> TrainerMetrics | SFTMetrics | None:
    """Step N's trainer metrics (TrainerMetrics or SFTMetrics, by the run), None before it is done."""
    rel = layout.step_json(layout.METRICS, step)
    return store.read_json(rel) if store.exists(rel) else None


def write_step(store: RunStore, record: StepRecord) -> None:
    store.write_json(layout.step_json(layout.STEPS, record["step"]), record)


def read_steps(store: RunStore) -> list[StepRecord]:
    """The flow's step records, in step order."""
    return [store.read_json(layout.step_json(layout.STEPS, s)) for s in store.json_steps(layout.STEPS)]


def read_rollout_manifest(store: RunStore, step: int, verify: bool = False) -> RolloutManifest | None:
    """`rollouts/step_N`'s manifest if complete. A resumed run reuses its first step's rollout,
    which rlfleet before the one name wrote with `reward_mean`: read as `mean_reward`."""
    manifest = store.manifest(layout.step_dir(layout.ROLLOUTS, step), verify=verify)
    if manifest is not None and "reward_mean" in manifest:
        manifest["mean_reward"] = manifest.pop("reward_mean")
    return manifest
