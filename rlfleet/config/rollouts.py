"""What the controller samples: the training envs and batch shape (`[orchestrator]`) and the eval
envs (`[eval]`); both go to vLLM through the same rollout path (orchestrator/generate.py)."""

from __future__ import annotations

from pydantic import Field, model_validator

from rlfleet.config.base import Strict
from rlfleet.config.envs import EnvList, EvalEnvList, RepeatEnvConfig, RepeatEvalEnv, env_name, split_counts
from rlfleet.config.shaping import ShapingConfig

# max_off_policy_steps when unset and k >= 1: at m = 3 a long-tailed job trained every group it
# sampled (1.12-1.20x m = k's tokens/s) and a SmolLM2 job learned as at m = k (docs/architecture.md)
DEFAULT_OFF_POLICY_STEPS = 3


class OrchestratorConfig(Strict):
    """What each step samples and how it becomes batches: envs, batch shape, staleness bounds."""

    env: EnvList = Field(
        default_factory=lambda: [RepeatEnvConfig()],
        description='The training tasks ([[orchestrator.env]]); `env = "repeat"` is shorthand.',
    )
    batch_size: int = Field(16, ge=1, description="Prompts per step.")
    group_size: int = Field(8, ge=2, description="Samples per prompt (GRPO group).")
    max_tokens: int = Field(16, ge=1, description="Tokens the model may sample per turn.")
    temperature: float = Field(
        1.0, gt=0.0, description="Sampling temperature (vLLM's logprobs are taken after it)."
    )
    micro_batch_size: int | None = Field(
        None,
        ge=1,
        description="Sequences per trainer micro-batch; unset = 32 right-padded sequences on a CPU. A GPU "
        "trainer with packed rows counts tokens: unless trainer.micro_batch_tokens is set, this becomes a "
        "cap of micro_batch_size x inference.max_model_len tokens, of which the trainer takes as many as "
        "fit without activation checkpointing; unset it sizes its micro-batches from the memory it finds free.",
    )
    seq_len: int | None = Field(
        None,
        ge=0,
        description="Pack sequences into rows of this many tokens in the batch files; 0 = one right-padded "
        "row each; unset = 0, or on a GPU trainer max(inference.max_model_len, 8192). Rows are a transport: "
        "a GPU trainer repacks their samples into micro-batches of its own size.",
    )
    max_async_level: int = Field(
        0,
        ge=0,
        description="Step N trains on groups whose every token was sampled by weights N-1-k .. N-1 (k=0: "
        "on-policy; max_off_policy_steps widens the oldest bound); with k >= 1 the replicas keep sampling "
        "while the trainer steps and weights load in flight.",
    )
    max_off_policy_steps: int | None = Field(
        None,
        ge=0,
        description="Step N trains on a group whose oldest token came from weights N-1-m or newer; "
        f"unset = 0 at k = 0 (on-policy), else max(k, {DEFAULT_OFF_POLICY_STEPS}). m above k keeps the "
        "samples that span more weight loads than k (the long ones, which the bound otherwise drops first) "
        "while k still bounds how far sampling runs ahead (prime-rl's max_off_policy_steps, default 8).",
    )
    stall_timeout_s: float = Field(
        600.0,
        gt=0,
        description="A request fails when no token arrives for this long (a replica hung); a long generation "
        "that makes progress never does.",
    )
    partials_flush_s: float = Field(
        1.0,
        gt=0,
        description="How often the tokens of the samples in flight are appended to the run store "
        "(buffer/partials/), so that a controller killed mid-step continues them from their tokens.",
    )
    shaping: ShapingConfig = Field(default_factory=ShapingConfig, description="Batch shaping (DAPO).")

    @property
    def max_staleness(self) -> int:
        """The oldest weights a step may train on, in versions behind its own (N-1)."""
        if self.max_off_policy_steps is not None:
            return self.max_off_policy_steps
        k = self.max_async_level
        return k and max(k, DEFAULT_OFF_POLICY_STEPS)

    def describe_async(self) -> str:
        """One line for the flow's log: how far sampling runs ahead and how stale a trained group may be."""
        k, m = self.max_async_level, self.max_staleness
        if not k:
            return "on-policy (max_async_level 0): each step samples on the weights of the step before"
        unset = (
            f" (max_off_policy_steps unset: max(k, {DEFAULT_OFF_POLICY_STEPS}))"
            if self.max_off_policy_steps is None
            else ""
        )
        return (
            f"async: sampling runs up to {k} step{'s' if k > 1 else ''} ahead of the trainer; a step trains "
            f"groups whose oldest token is at most {m} weight load{'s' if m > 1 else ''} old{unset}"
        )

    @model_validator(mode="after")
    def _shares_and_shaping(self) -> OrchestratorConfig:
        if self.max_staleness < self.max_async_level:
            raise ValueError(
                f"max_off_policy_steps={self.max_off_policy_steps} is below max_async_level="
                f"{self.max_async_level}: groups started k steps ahead could never train; raise it or unset it"
            )
        self.shaping.check(self.max_tokens)
        empty = [env_name(e) for e, c in zip(self.env, self.env_counts(), strict=True) if c == 0]
        if empty:
            raise ValueError(
                f"env: weights give {empty} none of batch_size={self.batch_size} prompts; "
                "raise their weight or the batch size"
            )
        return self

    def env_counts(self) -> list[int]:
        """Prompts per step of each env, by weight."""
        return split_counts([e.weight for e in self.env], self.batch_size)


class EvalConfig(Strict):
    """Eval envs through vLLM: mean reward, pass@1 and pass@k (a pass is reward >= 1.0)."""

    env: EvalEnvList = Field(
        default_factory=lambda: [RepeatEvalEnv()],
        description="[[eval.env]] entries; their own dataset/split, num_examples, rollouts_per_example.",
    )
    num_examples: int = Field(64, ge=1, description="Default for envs that do not set their own.")
    rollouts_per_example: int = Field(1, ge=1, description="Default k of pass@k.")
    max_tokens: int = Field(16, ge=1, description="Tokens the model may sample per turn.")
    temperature: float = Field(0.0, ge=0.0, description="0 = greedy.")
    interval: int = Field(0, ge=0, description="In an RL run: evaluate every k steps; 0 = never.")
    before_training: bool = Field(
        False,
        description="In an RL run with interval > 0: also evaluate the starting weights before step 0 "
        "(evals/base.json; verl's val_before_train), the first point of the learning curve.",
    )
    stall_timeout_s: float = Field(600.0, gt=0, description="As orchestrator.stall_timeout_s.")

    @model_validator(mode="after")
    def _greedy_once(self) -> EvalConfig:
        many = [env_name(e) for e in self.env if (e.rollouts_per_example or self.rollouts_per_example) > 1]
        if self.temperature == 0.0 and many:
            raise ValueError(
                f"temperature: greedy (0) samples each example once; {many} ask for more (pass@k)"
            )
        return self
