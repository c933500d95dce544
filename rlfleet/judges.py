"""`judge(name, messages)`: a reward function asks a `[[served]]` model and scores by its answer.

    from rlfleet.judges import judge, JudgeError

    async def judged(completion, answer):
        reply = await judge("grader", [{"role": "user", "content": f"Is {completion!r} {answer}? yes/no"}])
        return float(reply.strip().lower().startswith("yes"))

The run registers its served pools here when its rollout stream starts (runs/handles.py), so user
code needs no handle. A judge that fails (its replicas down past `attempts` relaunches, an HTTP
error, no such model) or times out raises `JudgeError`, a `RewardError`: the sample scores 0 and is
counted and named as a raising reward function is (orchestrator/generate.py), never the step.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from typing import Any

import httpx

from rlfleet.net import tls
from rlfleet.orchestrator.envs.base import RewardError
from rlfleet.orchestrator.sampler import Replicas

_SERVED: dict[str, Replicas] = {}  # name -> its pool, while a run's stream samples
NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


class JudgeError(RewardError):
    """The judge did not answer: the sample scores 0, named by this message."""


def serve(pools: dict[str, Replicas]) -> None:
    """The run's served models become callable by name (runs/handles.py, at the stream's start)."""
    _SERVED.update(pools)


def withdraw(names: list[str]) -> None:
    for name in names:
        _SERVED.pop(name, None)


def parse_score(text: str) -> float:
    """The first number in the judge's reply (a 0-10 grade, a probability, ...)."""
    m = NUMBER.search(text)
    if m is None:
        raise JudgeError(f"no number in the judge's reply {text[:80]!r}")
    return float(m.group())


async def judge(
    name: str,
    messages: list[dict[str, Any]],
    *,
    max_tokens: int = 256,
    temperature: float = 0.0,
    timeout_s: float = 60.0,
    parse: Callable[[str], Any] | None = None,
    attempts: int = 2,
) -> Any:
    """The served model `name`'s reply to `messages` (its chat template), or `parse(reply)`
    (`parse_score`: the first number). `timeout_s` bounds each request; a replica that refuses
    (dead) is relaunched by its pool and asked again, `attempts` requests in all."""
    pool = _SERVED.get(name)
    if pool is None:
        raise JudgeError(f"judge {name!r}: no served model of that name (served: {sorted(_SERVED)})")
    body = {"model": name, "messages": messages, "max_tokens": max_tokens, "temperature": temperature}
    last: BaseException | None = None
    for _ in range(attempts):
        urls = await asyncio.to_thread(pool.ensure)  # blocks while its pool relaunches a dead one
        if not urls:
            raise JudgeError(f"judge {name!r}: no replica is available")
        url = min(urls, key=lambda u: _in_flight.get(u, 0))
        _in_flight[url] = _in_flight.get(url, 0) + 1
        try:
            async with httpx.AsyncClient(timeout=timeout_s, verify=tls()) as client:
                resp = await client.post(f"{url}/v1/chat/completions", json=body)
        except httpx.TimeoutException as e:  # alive but slow: no retry, the sample scores 0
            raise JudgeError(f"judge {name!r} timed out after {timeout_s} s") from e
        except httpx.HTTPError as e:  # refused: its pool relaunches it on the next ensure
            last = e
            continue
        finally:
            _in_flight[url] -= 1
        if resp.status_code != 200:
            raise JudgeError(f"judge {name!r}: HTTP {resp.status_code}: {resp.text[:200]}")
        text = resp.json()["choices"][0]["message"]["content"] or ""
        return parse(text) if parse is not None else text
    raise JudgeError(f"judge {name!r} failed {attempts} times; last: {type(last).__name__}: {last}")


_in_flight: dict[str, int] = {}
