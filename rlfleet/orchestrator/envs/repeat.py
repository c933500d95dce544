"""`repeat`, the built-in toy task and the embedded default.

The prompt is one letter written k times ("cccccc", a raw completion prompt); the reward is the
fraction of the completion's first `max_tokens` characters that are that letter, over max_tokens
(`per = "completion"`: over the completion's own characters, so length earns nothing). It is learnable
in minutes on a CPU because the optimal policy is a bigram ("after c, write c") that the
embedding and LM head represent directly, every token of the completion is graded (a dense
reward), and each correct character fed back as input makes the next one likelier. Scores run 0..1.
"""

from __future__ import annotations

import random

from rlfleet.config.envs import RepeatArgs
from rlfleet.orchestrator.envs.base import Example, SingleTurn, Trajectory


class RepeatEnv(SingleTurn):
    chat = False  # a completion task: the prompt's last token is already the letter to repeat

    def __init__(self, args: RepeatArgs | None = None, name: str = "repeat"):
        self.args = args or RepeatArgs()
        self.name = name

    def _examples(self, step: int, count: int, seed: int, split: str) -> list[Example]:
        # The cursor is the step: the same (seed, step, split) always yields the same prompts.
        a = self.args
        rng = random.Random(f"{seed}/{split}/{step}")
        out = []
        for i in range(count):
            letter = rng.choice(a.alphabet)
            out.append(Example(f"{split}-{step}-{i}", letter * rng.randint(a.min_len, a.max_len), letter))
        return out

    def examples(self, step: int, count: int, seed: int) -> list[Example]:
        return self._examples(step, count, seed, "train")

    def eval_examples(self, count: int) -> list[Example]:
        return self._examples(0, count, 0, "eval")  # never overlaps the training stream

    async def score(self, traj: Trajectory) -> tuple[float, dict[str, float]]:
        return reward(traj.example.answer, traj.completion, traj.max_tokens, per=self.args.per), {}


def reward(letter: str, completion: str, max_tokens: int, per: str = "max_tokens") -> float:
    """`letter`s in the completion's first `max_tokens` characters over `max_tokens`; with
    `per="completion"`, the fraction of the completion's characters that are `letter` (0 if empty)."""
    if per == "completion":
        return sum(c == letter for c in completion) / len(completion) if completion else 0.0
    return sum(c == letter for c in completion[:max_tokens]) / max_tokens
