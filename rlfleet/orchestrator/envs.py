"""Built-in environments: deterministic prompt streams and rule-based rewards.

`repeat`: the prompt is one letter written k times ("cccccc", a raw completion prompt); the reward
is the fraction of the completion's first `max_tokens` characters that are that letter. A
random-init model scores ~1/vocab (0.01-0.02). It is learnable in minutes on a CPU because the
optimal policy is a bigram ("after c, write c") that the embedding and LM head represent
directly, every token of the completion is graded (a dense reward), and each correct character
fed back as input makes the next one likelier. Scores run 0..1.
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
    chat: bool  # wrap prompts in the tokenizer's chat template, or send them as raw text

    def prompts(self, step: int, count: int, seed: int, split: str = "train") -> list[Prompt]: ...

    def reward(self, prompt: Prompt, completion: str, max_tokens: int) -> float: ...


class RepeatEnv:
    name = "repeat"
    chat = False  # a completion task: the prompt's last token is already the letter to repeat

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
