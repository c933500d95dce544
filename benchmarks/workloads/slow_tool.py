"""A slow environment reply, like running the model's code: benchmarks/slow_tools.py's `env_response`.

rlfleet's `python` env calls `reply` after every model turn that has no tool call (README, "Your
own task"); it waits uniform(MIN_S, MAX_S) s without blocking the event loop, then answers with a
short user message, or (with probability STOP) None: the rollout is done. The wait and the stop
are drawn from the conversation so far (a hash of its JSON), so the same conversation waits as
long and ends the same way in every run, and `draw` recomputes both from a rollout record.
With SLOW_TOOL_LOG set, each call appends a JSON line (key, delay, start, end, stop) to that file.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import random
import time
from typing import Any

MIN_S, MAX_S, STOP = 0.05, 2.0, 0.25


def draw(messages: list[dict[str, Any]]) -> tuple[str, float, bool]:
    """(key, seconds to wait, whether to stop) for a reply to this conversation."""
    key = hashlib.sha256(json.dumps(messages, sort_keys=True, default=str).encode()).hexdigest()[:16]
    rng = random.Random(key)
    return key, rng.uniform(MIN_S, MAX_S), rng.random() < STOP


async def reply(messages: list[dict[str, Any]], answer: str) -> str | None:
    key, wait, stop = draw(messages)
    start = time.time()
    await asyncio.sleep(wait)
    if path := os.environ.get("SLOW_TOOL_LOG"):
        line = {"key": key, "delay": wait, "start": start, "end": time.time(), "stop": stop}
        with open(path, "a") as f:
            f.write(json.dumps(line) + "\n")
    return None if stop else f"exit 0, stdout: {answer * 3}. Again."
