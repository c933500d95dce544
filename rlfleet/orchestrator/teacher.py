"""A served teacher's logprob of every token the student sampled, fetched as each group finishes.

On-policy distillation (trainer/losses/distill.py) needs log pi_teacher(x_t | x_<t) at the
student's own sampled tokens. vLLM gives it as prompt logprobs: the whole trajectory goes to the
teacher as a prompt (token ids: nothing is re-tokenized), `prompt_logprobs: 0` returns the logprob
of each prompt token, and `max_tokens: 1` samples one token nobody reads. One request per group
(a batch of n prompts), sent by the rollout stream inside the group's own coroutine, so it overlaps
the sampling of every other group instead of being a pass at take time.

A teacher replica that fails a request is relaunched by its pool (`ensure`, as the sampler heals
the policy's) and the request is sent again, up to `attempts` failures; then the group fails and
the stream samples another in its place.
"""

from __future__ import annotations

import asyncio
import logging
from itertools import count

import httpx

from rlfleet.errors import DeterministicError, TransientError
from rlfleet.net import tls
from rlfleet.orchestrator.sampler import Replicas
from rlfleet.store.records import TrajectoryRecord

log = logging.getLogger("rlfleet.orchestrator")


def prompt_logprobs_body(name: str, prompts: list[list[int]]) -> dict:
    """A `/v1/completions` request for the logprob of each prompt token (token ids in)."""
    return {"model": name, "prompt": prompts, "max_tokens": 1, "temperature": 1.0, "prompt_logprobs": 0}


def parse_prompt_logprobs(choice: dict, ids: list[int]) -> list[float]:
    """Per token of `ids`, its logprob given the ones before; 0.0 for the first (it has no context)."""
    entries = choice.get("prompt_logprobs") or []
    if len(entries) != len(ids):
        raise TransientError(f"teacher returned {len(entries)} prompt logprobs for {len(ids)} tokens")
    return [0.0] + [e[str(t)]["logprob"] for e, t in zip(entries[1:], ids[1:], strict=True)]


class Teacher:
    """`score(records)` sets each record's `teacher_logprobs`: aligned with `input_ids`, the
    teacher's logprob on the sampled tokens (`loss_mask` 1) and 0.0 elsewhere, as `logprobs` is."""

    def __init__(self, replicas: Replicas, name: str, timeout_s: float, attempts: int = 3):
        self.replicas, self.name, self.timeout_s, self.attempts = replicas, name, timeout_s, attempts
        self._urls: list[str] = []
        self._next = count()
        self._heal_lock = asyncio.Lock()

    async def score(self, records: list[TrajectoryRecord]) -> None:
        ids = [r["input_ids"] for r in records]
        for r, lps in zip(records, await self.prompt_logprobs(ids), strict=True):
            r["teacher_logprobs"] = [lp if m else 0.0 for lp, m in zip(lps, r["loss_mask"], strict=True)]

    async def prompt_logprobs(self, prompts: list[list[int]]) -> list[list[float]]:
        failures = 0
        while True:
            if not self._urls:
                await self._heal(None)
            url = self._urls[next(self._next) % len(self._urls)]
            try:
                async with httpx.AsyncClient(
                    timeout=httpx.Timeout(30.0, read=self.timeout_s), verify=tls()
                ) as c:
                    resp = await c.post(
                        f"{url}/v1/completions", json=prompt_logprobs_body(self.name, prompts)
                    )
                if 400 <= resp.status_code < 500:  # our request is wrong: no retry fixes it
                    raise DeterministicError(
                        f"teacher {self.name} at {url}: HTTP {resp.status_code}: {resp.text[:300]}"
                    )
                resp.raise_for_status()
                choices = sorted(resp.json()["choices"], key=lambda c: c["index"])
                return [parse_prompt_logprobs(c, p) for c, p in zip(choices, prompts, strict=True)]
            except (httpx.HTTPError, TransientError) as exc:
                failures += 1
                if failures >= self.attempts:
                    raise TransientError(
                        f"teacher {self.name}: {failures} failed requests; last: {exc}"
                    ) from exc
                log.warning(
                    "teacher %s at %s failed (%s: %s); asking again", self.name, url, type(exc).__name__, exc
                )
                await self._heal(url)

    async def _heal(self, failed: str | None) -> None:
        """Healthy URLs from the pool, which relaunches a dead replica first (blocking)."""
        async with self._heal_lock:
            if failed is not None and failed not in self._urls and self._urls:
                return  # another request healed it meanwhile
            self._urls = await asyncio.to_thread(self.replicas.ensure)
            if not self._urls:
                raise TransientError(f"teacher {self.name}: no replica is available")
