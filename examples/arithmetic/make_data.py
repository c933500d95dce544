"""Write the arithmetic task's data, made here (no download): `python examples/arithmetic/make_data.py`.

Problems are `a+b=` and `a-b=` with one-digit operands, a chat prompt, and the answer as text.
  train.jsonl  the RL prompt stream (question, answer, op)
  eval.jsonl   held-out draws of the same generator (another seed) for pass@k
  sft.jsonl    chat-format solutions for the `rlfleet sft` warm start (a small share of rows:
               the warm start teaches the format and some of the table; RL has to do the rest)
"""

from __future__ import annotations

import json
import random
from pathlib import Path

HERE = Path(__file__).parent


def problems(seed: int, count: int) -> list[dict]:
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        a, b, op = rng.randint(0, 9), rng.randint(0, 9), rng.choice("+-")
        if op == "-" and b > a:
            a, b = b, a  # answers stay non-negative
        out.append({"question": f"{a}{op}{b}=", "answer": str(a + b if op == "+" else a - b), "op": op})
    return out


def write(name: str, rows: list[dict]) -> None:
    (HERE / name).write_text("".join(json.dumps(r) + "\n" for r in rows))


if __name__ == "__main__":
    write("train.jsonl", problems(seed=0, count=2000))
    write("eval.jsonl", problems(seed=1, count=200))
    sft = problems(seed=2, count=256)
    write(
        "sft.jsonl",
        [
            {
                "messages": [
                    {"role": "user", "content": p["question"]},
                    {"role": "assistant", "content": p["answer"]},
                ]
            }
            for p in sft
        ],
    )
