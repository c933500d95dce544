"""Built-in environments: deterministic prompt streams and rule-based rewards.

`repeat`: the prompt is one letter written k times ("cccccc"); the reward is the fraction of the
completion's `max_tokens` characters that are that letter. A random-init model scores ~1/vocab.
It is learnable in minutes on a CPU because the optimal policy is a bigram ("after c, write c"),
which the embedding and LM head can represent directly, and because each sampled correct
character is fed back as input and reinforces the next one. Scores run 0..1.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class Prompt:
    uid: str
    text: str
    answer: str


class Environment(Protocol):
    name: str

    def prompts(self, step: int, count: int, seed: int, split: str = "train") -> list[Prompt]: ...

    def reward(self, prompt: Prompt, completion: str, max_tokens: int) -> float: ...


class RepeatEnv:
    name = "repeat"

    def __init__(self, alphabet: str = "abcdefgh", min_len: int = 4, max_len: int = 8):
        self.alphabet, self.min_len, self.max_len = alphabet, min_len, max_len

    def prompts(self, step: int, count: int, seed: int, split: str = "train") -> list[Prompt]:
        # The cursor is the step: the same (seed, step, split) always yields the same prompts,
        # so a resumed run sees exactly the data it would have seen.
        rng = random.Random(f"{seed}/{split}/{step}")
        out = []
        for i in range(count):
            letter = rng.choice(self.alphabet)
            text = letter * rng.randint(self.min_len, self.max_len)
            out.append(Prompt(uid=f"{split}-{step}-{i}", text=text, answer=letter))
        return out

    def reward(self, prompt: Prompt, completion: str, max_tokens: int) -> float:
        return sum(c == prompt.answer for c in completion[:max_tokens]) / max_tokens


ENVIRONMENTS: dict[str, type] = {"repeat": RepeatEnv}


def get_env(name: str) -> Environment:
    try:
        return ENVIRONMENTS[name]()
    except KeyError:
        raise ValueError(f"unknown environment {name!r}; known: {sorted(ENVIRONMENTS)}") from None
