"""The one generate-and-score path: training rollouts and eval both come through `generate`.

Turn 1 of every example goes to vLLM as one request for all `n` samples; later turns (tool
results, environment replies) go as rounds of single-sample requests for the rollouts still
running, so every turn of a step shares the sampler's load balancing and replica healing.
Reward functions are contained: one that raises or times out scores its sample 0 and is
counted; only a step where every sample failed that way fails, with the first error.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rlfleet.chat import continuation_ids, parse_assistant, prompt_ids
from rlfleet.errors import DeterministicError
from rlfleet.orchestrator.envs.base import Environment, Example, RewardError, Trajectory
from rlfleet.orchestrator.envs.usercode import describe
from rlfleet.orchestrator.sampler import Sample, sample_with_healing

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

log = logging.getLogger("rlfleet.orchestrator")


@dataclass(frozen=True)
class SamplingParams:
    n: int
    max_tokens: int
    temperature: float
    timeout_s: float
    max_model_len: int


def generate(
    env: Environment,
    examples: list[Example],
    params: SamplingParams,
    tok: PreTrainedTokenizerBase,
    healthy_urls: Callable[[], list[str]],
) -> list[list[Trajectory]]:
    """`params.n` scored trajectories per example, grouped by example."""
    groups = []
    for ex in examples:
        ids = prompt_ids(tok, ex.prompt, env.tools_for(ex), env.chat)
        messages = list(ex.prompt) if isinstance(ex.prompt, list) else []
        groups.append(
            [
                Trajectory(ex, list(ids), len(ids), [dict(m) for m in messages], max_tokens=params.max_tokens)
                for _ in range(params.n)
            ]
        )
    first = []
    for g in groups:
        if _fits(g[0], params):
            first.append(g)
        else:  # the prompt alone leaves no room for max_tokens
            for t in g:
                t.truncated = t.done = True
    if first:  # one request per example carries all n samples
        samples = _sample(healthy_urls, [g[0].ids for g in first], params.n, params)
        for g, group_samples in zip(first, samples, strict=True):
            for t, s in zip(g, group_samples, strict=True):
                _add_turn(t, s, env)
    running = [t for g in groups for t in g if not t.done]
    while running:
        asyncio.run(_respond_all(env, running, tok, params))
        running = [t for t in running if not t.done]
        if running:
            samples = _sample(healthy_urls, [t.ids for t in running], 1, params)
            for t, (s,) in zip(running, samples, strict=True):
                _add_turn(t, s, env)
            running = [t for t in running if not t.done]
    trajs = [t for g in groups for t in g]
    asyncio.run(_score_all(env, trajs))
    if failed := [t for t in trajs if t.error]:
        log.warning(
            "env %r: %d of %d samples failed to score (reward 0); first: %s",
            env.name,
            len(failed),
            len(trajs),
            failed[0].error,
        )
    return groups


def raise_if_none_scored(trajs: list[Trajectory]) -> None:
    """A step (or an eval) where every sample failed to score fails, with the first error: a
    reward function that always raises is a bug to fix, not a signal to train on."""
    if trajs and all(t.error for t in trajs):
        raise DeterministicError(f"every sample failed to score; first error: {trajs[0].error}")


def _fits(t: Trajectory, params: SamplingParams) -> bool:
    return len(t.ids) + params.max_tokens <= params.max_model_len


def _sample(
    healthy_urls: Callable[[], list[str]], prompts: list[list[int]], n: int, params: SamplingParams
) -> list[list[Sample]]:
    return sample_with_healing(
        healthy_urls, prompts, n, params.max_tokens, params.temperature, params.timeout_s
    )


def _add_turn(t: Trajectory, s: Sample, env: Environment) -> None:
    start = len(t.ids)
    t.extend(s.completion_ids, s.logprobs)
    turn = {
        "text": s.text,
        "finish_reason": s.finish_reason,
        "start": start,
        "end": len(t.ids),
        "replica": s.replica,
        "resent": s.resent,
    }
    t.turns.append(turn)
    if env.chat:
        t.messages.append(parse_assistant(s.text))
    t.done = len(t.turns) >= env.max_turns


async def _respond_all(
    env: Environment, running: list[Trajectory], tok: PreTrainedTokenizerBase, params: SamplingParams
) -> None:
    replies = await asyncio.gather(*(env.respond(t) for t in running))
    for t, reply in zip(running, replies, strict=True):
        if not reply:
            t.done = True
            continue
        tail = tok.decode(t.ids[-1:]) if t.turns and t.turns[-1]["end"] > t.turns[-1]["start"] else ""
        t.messages += reply
        t.extend(continuation_ids(tok, reply, env.tools_for(t.example), tail))
        if not _fits(t, params):
            t.truncated = t.done = True


async def _score_all(env: Environment, trajs: list[Trajectory]) -> None:
    async def one(t: Trajectory) -> None:
        try:
            t.reward, t.metrics = await env.score(t)
        except Exception as e:
            t.reward, t.metrics, t.error = 0.0, {}, str(e) if isinstance(e, RewardError) else describe(e)

    await asyncio.gather(*(one(t) for t in trajs))
