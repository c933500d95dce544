"""What every environment is made of: examples in, a token-level trajectory out, a score on it.

The rollout loop itself lives in `rlfleet.orchestrator.generate` (one path for training rollouts
and eval); an environment only says what the prompts are, how it answers a model turn (tool
results, an environment message, or "done"), and how a finished trajectory scores.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass(frozen=True)
class Example:
    """One task instance: a prompt (raw text, or chat messages with any system prompt), a reference
    answer and every other dataset column (`info`)."""

    uid: str
    prompt: str | list[dict[str, Any]]
    answer: Any = None
    info: dict[str, Any] = field(default_factory=dict)


@dataclass
class Trajectory:
    """One rollout, token level: `ids` is everything the model saw or sampled, `mask` is 1 exactly
    on the tokens it sampled, `logprobs` the sampler's logprob of those (0 elsewhere). Turn t+1's
    prompt is `ids` as it stood after turn t plus the environment's new tokens: nothing sampled
    is ever re-tokenized."""

    example: Example
    ids: list[int]
    prompt_len: int
    messages: list[dict[str, Any]] = field(default_factory=list)  # prompt + model/env messages (chat)
    mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    turns: list[dict[str, Any]] = field(default_factory=list)
    max_tokens: int = 0
    truncated: bool = False
    done: bool = False
    reward: float = 0.0
    metrics: dict[str, float] = field(default_factory=dict)
    error: str | None = None

    def __post_init__(self) -> None:
        if not self.mask:
            self.mask = [0] * len(self.ids)
            self.logprobs = [0.0] * len(self.ids)

    def extend(self, ids: list[int], logprobs: list[float] | None = None) -> None:
        """Append sampled tokens (with their logprobs) or, without logprobs, environment tokens."""
        self.ids += ids
        self.mask += [1 if logprobs is not None else 0] * len(ids)
        self.logprobs += list(logprobs) if logprobs is not None else [0.0] * len(ids)

    @property
    def completion(self) -> str:
        """The text of the model's last turn."""
        return self.turns[-1]["text"] if self.turns else ""

    @property
    def completion_messages(self) -> list[dict[str, Any]]:
        n = len(self.example.prompt) if isinstance(self.example.prompt, list) else 0
        return self.messages[n:]

    def state(self) -> dict[str, Any]:
        """What reward functions and environment responses see of the whole rollout."""
        return {
            "messages": self.messages,
            "completion_messages": self.completion_messages,
            "turns": self.turns,
            "tool_calls": [c for t in self.turns for c in t.get("tool_calls", [])],
            "tool_results": [m for m in self.messages if m.get("role") == "tool"],
            "num_turns": len(self.turns),
            "truncated": self.truncated,
            "max_tokens": self.max_tokens,
        }


class RewardError(RuntimeError):
    """Scoring failed (a reward function raised or timed out); the message names the function."""


class Environment(Protocol):
    name: str
    chat: bool  # prompts go through the tokenizer's chat template; False: raw text completion
    max_turns: int

    def examples(self, step: int, count: int, seed: int) -> list[Example]:
        """The training stream: a function of (seed, step), so a resumed run sees the same data."""
        ...

    def eval_examples(self, count: int) -> list[Example]: ...

    def tools_for(self, example: Example) -> list[dict[str, Any]]:
        """OpenAI function schemas the chat template shows for this example ([] = none)."""
        ...

    async def respond(self, traj: Trajectory) -> list[dict[str, Any]] | None:
        """The environment's messages after the model's turn, or None: the rollout is done."""
        ...

    async def score(self, traj: Trajectory) -> tuple[float, dict[str, float]]:
        """(reward, named metrics). Raising marks this sample failed (reward 0), not the step."""
        ...


class SingleTurn:
    """Defaults for an environment whose rollout ends after the model's first turn."""

    max_turns = 1

    def tools_for(self, example: Example) -> list[dict[str, Any]]:
        return []

    async def respond(self, traj: Trajectory) -> list[dict[str, Any]] | None:
        return None
