"""Environment configs: `[[orchestrator.env]]` and `[[eval.env]]` entries, one per task.

Each entry is `{name, type, weight, args}`; `type` picks the args model, so a typo in an env's
args fails at load time naming `orchestrator.env.0.python.args.<field>`. What needs the filesystem
or an import (the dataset's columns, a reward function's parameters) is checked by
`rlfleet.orchestrator.envs.check_envs` in preflight, before any process starts.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BeforeValidator, Field, field_validator, model_validator

from rlfleet.config.base import NonEmptyStr, Strict


class RepeatArgs(Strict):
    """The built-in toy task: the prompt is one letter written min_len..max_len times; the reward is
    the fraction of the completion's characters that are that letter."""

    alphabet: NonEmptyStr = Field("abcdefgh", description="The letters prompts are drawn from.")
    min_len: int = Field(4, ge=1, description="Shortest prompt, in letters.")
    max_len: int = Field(8, ge=1, description="Longest prompt, in letters.")
    per: Literal["max_tokens", "completion"] = Field(
        "max_tokens",
        description="The reward's denominator: max_tokens (longer completions score higher) or the "
        "completion's own characters (its letter fraction; an empty completion scores 0).",
    )

    @model_validator(mode="after")
    def _lengths(self) -> RepeatArgs:
        if self.min_len > self.max_len:
            raise ValueError(f"min_len ({self.min_len}) must not exceed max_len ({self.max_len})")
        return self


class RewardFnConfig(Strict):
    """One reward function; a bare string in `rewards` is `{fn = "..."}`."""

    fn: NonEmptyStr = Field(description="`path/to/file.py:name` or `package.module:name`.")
    weight: float = Field(1.0, description="Its weight in the sample's reward (0 = logged only).")


class PythonArgs(Strict):
    """A dataset plus reward functions (and optionally tools and an environment response)."""

    dataset: NonEmptyStr = Field(
        description="A .jsonl/.json/.parquet file, a directory saved by `datasets`, or a hub dataset id."
    )
    split: str = Field("train", description="Split of a hub id or a DatasetDict directory.")
    prompt_column: NonEmptyStr = Field(
        "prompt", description="A string, or chat messages `[{role, content}, ...]`."
    )
    answer_column: str | None = Field("answer", description="None: the task has no reference answer.")
    system_prompt: str | None = Field(None, description="Put before each prompt as a system message.")
    chat: bool = Field(True, description="Render prompts with the chat template; False: raw text.")
    rewards: list[RewardFnConfig] = Field(
        min_length=1, description="The reward functions; the sample's reward is their weighted sum."
    )
    reward_timeout_s: float = Field(10.0, gt=0, description="Per reward function call.")
    tools: list[NonEmptyStr] = Field(default_factory=list, description="`file.py:fn` tool functions.")
    tool_timeout_s: float = Field(
        10.0, gt=0, description="Per tool call; a timeout goes back to the model as the tool's error."
    )
    env_response: str | None = Field(
        None, description="`file.py:fn`: the environment's reply after each model turn (None = done)."
    )
    max_turns: int = Field(1, ge=1, description="Model turns per rollout.")
    shuffle: bool = Field(True, description="A fresh permutation of the dataset per epoch (from the seed).")

    @field_validator("rewards", mode="before")
    @classmethod
    def _short_rewards(cls, v: Any) -> Any:  # rewards = ["f.py:fn"] is rewards = [{fn = "f.py:fn"}]
        return [{"fn": r} if isinstance(r, str) else r for r in v] if isinstance(v, list) else v

    @model_validator(mode="after")
    def _turns(self) -> PythonArgs:
        if self.tools and self.max_turns < 2:
            raise ValueError("tools need max_turns >= 2 (a tool's result goes back to the model)")
        if self.max_turns > 1 and not (self.tools or self.env_response):
            raise ValueError("max_turns > 1 needs tools or env_response (what answers the model?)")
        if (self.tools or self.env_response) and not self.chat:
            raise ValueError("tools and env_response need chat = true (turns are chat messages)")
        return self


class VerifiersArgs(Strict):
    """A verifiers (v1) taskset, loaded by module name and run unchanged."""

    module: NonEmptyStr = Field(description="Importable module (or file.py) exposing `load_taskset`.")
    kwargs: dict[str, Any] = Field(default_factory=dict, description="Passed to `load_taskset(**kwargs)`.")
    max_turns: int = Field(8, ge=1, description="Model turns per rollout.")
    reward_timeout_s: float = Field(30.0, gt=0, description="Per `Task.score` call.")
    tool_timeout_s: float = Field(30.0, gt=0, description="Per tool call.")


class ReasoningGymDataset(Strict):
    name: NonEmptyStr = Field(description="A reasoning-gym dataset (`reasoning_gym.factory.DATASETS`).")
    weight: float = Field(1.0, gt=0, description="Its share of the env's examples.")
    config: dict[str, Any] = Field(default_factory=dict, description="Fields of the dataset's config.")


class ReasoningGymArgs(Strict):
    """Procedural tasks from the `reasoning-gym` package, scored by each dataset's own `score_answer`."""

    datasets: list[ReasoningGymDataset] = Field(min_length=1, description="`[{name, weight, config}]`.")
    size: int = Field(10_000, ge=1, description="Examples in the training pool (the stream cycles over it).")
    seed: int = Field(0, description="Draws the training pool; eval draws its own with seed + 1.")
    answer_format: Literal["answer_tag", "last_number", "plain"] = Field(
        "answer_tag",
        description="answer_tag: the last <answer>...</answer> of the completion is the answer (reasoning-gym's "
        "convention); last_number: the completion's last number (lm-eval's flexible extract); plain: the whole "
        "completion, stripped.",
    )
    system_prompt: str | None = Field(
        None, description="Default: reasoning-gym's own prompt for answer_tag, none for plain."
    )
    reward_timeout_s: float = Field(10.0, gt=0, description="Per score_answer call.")


class _EnvBase(Strict):
    name: str | None = Field(None, description="Shown in logs and metrics; default: type (or module).")
    weight: float = Field(1.0, gt=0, description="Share of each step's prompts (normalized over envs).")


class RepeatEnvConfig(_EnvBase):
    type: Literal["repeat"] = "repeat"
    args: RepeatArgs = Field(default_factory=RepeatArgs, description="The toy task's letters and lengths.")


class PythonEnvConfig(_EnvBase):
    type: Literal["python"]
    args: PythonArgs


class VerifiersEnvConfig(_EnvBase):
    type: Literal["verifiers"]
    args: VerifiersArgs


class ReasoningGymEnvConfig(_EnvBase):
    type: Literal["reasoning_gym"]
    args: ReasoningGymArgs


EnvConfig = Annotated[
    RepeatEnvConfig | PythonEnvConfig | VerifiersEnvConfig | ReasoningGymEnvConfig,
    Field(discriminator="type"),
]


class EvalEnvKeys(Strict):
    """What an eval env adds: how many examples and rollouts (default: `[eval]`'s)."""

    num_examples: int | None = Field(None, ge=1, description="Examples evaluated; unset = eval.num_examples.")
    rollouts_per_example: int | None = Field(
        None, ge=1, description="Rollouts per example (k of pass@k); unset = eval.rollouts_per_example."
    )


class RepeatEvalEnv(RepeatEnvConfig, EvalEnvKeys):
    pass


class PythonEvalEnv(PythonEnvConfig, EvalEnvKeys):
    pass


class VerifiersEvalEnv(VerifiersEnvConfig, EvalEnvKeys):
    pass


class ReasoningGymEvalEnv(ReasoningGymEnvConfig, EvalEnvKeys):
    pass


EvalEnvConfig = Annotated[
    RepeatEvalEnv | PythonEvalEnv | VerifiersEvalEnv | ReasoningGymEvalEnv, Field(discriminator="type")
]


def env_name(env: Any) -> str:
    if env.name:
        return env.name
    if env.type == "verifiers":
        return env.args.module.rsplit("/", 1)[-1].removesuffix(".py")
    if env.type == "reasoning_gym":
        return "+".join(d.name for d in env.args.datasets)
    return env.type


def env_list(v: Any) -> Any:
    """`env = "repeat"` (a type), one table, or a list of tables: always a list."""
    if isinstance(v, str):
        return [{"type": v}]
    if isinstance(v, dict):
        return [v]
    return v


def unique_names(envs: list[Any]) -> list[Any]:
    if not envs:
        raise ValueError("at least one environment is needed")
    names = [env_name(e) for e in envs]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ValueError(f"environment names must be unique; repeated: {dup} (set `name`)")
    return envs


def split_counts(weights: list[float], total: int) -> list[int]:
    """`total` prompts shared by weight (largest remainder), deterministic; sums to `total`."""
    s = sum(weights)
    exact = [w / s * total for w in weights]
    counts = [int(x) for x in exact]
    order = sorted(range(len(weights)), key=lambda i: (-(exact[i] - counts[i]), i))
    for i in order[: total - sum(counts)]:
        counts[i] += 1
    return counts


EnvList = Annotated[list[EnvConfig], BeforeValidator(env_list), AfterValidator(unique_names)]
EvalEnvList = Annotated[list[EvalEnvConfig], BeforeValidator(env_list), AfterValidator(unique_names)]
