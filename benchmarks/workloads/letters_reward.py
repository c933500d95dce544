"""benchmarks/slow_tools.py's reward: the letter's share of everything the model wrote, all turns.

The multi-turn form of the `repeat` env's per="completion" reward (length earns nothing); 0 when
the model wrote nothing.
"""

from __future__ import annotations

from typing import Any


def letter_share(completion_messages: list[dict[str, Any]], answer: str) -> float:
    text = "".join(m.get("content") or "" for m in completion_messages if m.get("role") == "assistant")
    return sum(c == answer for c in text) / len(text) if text else 0.0
