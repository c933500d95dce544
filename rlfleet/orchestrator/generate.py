"""The one generate-and-score path: training rollouts (the stream) and eval both run `rollout_group`.

Every trajectory is its own coroutine: its turns, its environment replies (tools, user
simulators) and its reward functions never wait for another sample's. A one-turn environment
sends a group's n samples as one request (vLLM shares the prompt's KV); a multi-turn one sends
each trajectory's turns on their own. Reward functions are contained: one that raises or times
out scores its sample 0 and is counted; only a step where every sample failed that way fails,
with the first error.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rlfleet.chat import continuation_ids, parse_assistant, prompt_ids
from rlfleet.errors import DeterministicError
from rlfleet.orchestrator.envs.base import Environment, Example, RewardError, Trajectory
from rlfleet.orchestrator.sampler import Replicas, Sample, Sampler
from rlfleet.progress import Progress
from rlfleet.usercode import describe

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

log = logging.getLogger("rlfleet.orchestrator")


@dataclass(frozen=True)
class SamplingParams:
    n: int
    max_tokens: int
    temperature: float
    stall_timeout_s: float
    max_model_len: int


async def rollout_group(
    env: Environment,
    example: Example,
    params: SamplingParams,
    tok: PreTrainedTokenizerBase,
    sampler: Sampler,
    first: list[Sample] | None = None,
) -> list[Trajectory]:
    """`params.n` scored trajectories of one example; `first`: the samples their first turns fill
    (orchestrator/partials.py watches them stream; restored ones go on from their tokens)."""
    ids = prompt_ids(tok, example.prompt, env.tools_for(example), env.chat)
    messages = list(example.prompt) if isinstance(example.prompt, list) else []
    group = [
        Trajectory(example, list(ids), len(ids), [dict(m) for m in messages], max_tokens=params.max_tokens)
        for _ in range(params.n)
    ]
    if not _fits(group[0], params):  # the prompt alone leaves no room for max_tokens
        for t in group:
            t.truncated = t.done = True
        await asyncio.gather(*(_score(env, t) for t in group))
    elif env.max_turns == 1:
        samples = await sampler.sample(group[0].ids, params.n, params.max_tokens, first)
        for t, s in zip(group, samples, strict=True):
            _add_turn(t, s, env, tok)
        await asyncio.gather(*(_score(env, t) for t in group))
    else:  # the first turns share their prompt: one request for all n, as a single-turn group
        turns = await sampler.sample(group[0].ids, params.n, params.max_tokens, first)
        await asyncio.gather(
            *(_trajectory(env, t, s, params, tok, sampler) for t, s in zip(group, turns, strict=True))
        )
    return group


async def _trajectory(
    env: Environment,
    t: Trajectory,
    s: Sample,
    params: SamplingParams,
    tok: PreTrainedTokenizerBase,
    sampler: Sampler,
) -> None:
    """One multi-turn rollout from its first model turn `s`: environment reply, model turn, ...
    until done; then its score."""
    while True:
        _add_turn(t, s, env, tok)
        if t.done:
            break
        reply = await env.respond(t)
        if not reply:
            t.done = True
            break
        tail = tok.decode(t.ids[-1:]) if t.turns[-1]["end"] > t.turns[-1]["start"] else ""
        t.messages += reply
        t.extend(continuation_ids(tok, reply, env.tools_for(t.example), tail))
        if not _fits(t, params):
            t.truncated = t.done = True
            break
        (s,) = await sampler.sample(t.ids, 1, params.max_tokens)
    await _score(env, t)


def generate(
    env: Environment,
    examples: list[Example],
    params: SamplingParams,
    tok: PreTrainedTokenizerBase,
    replicas: Replicas,
    progress: Progress | None = None,  # a run's (an eval between steps is progress to the watchdog)
) -> list[list[Trajectory]]:
    """`params.n` scored trajectories per example, grouped by example, all in flight at once."""

    async def run() -> list[list[Trajectory]]:
        sampler = Sampler(replicas, params.temperature, params.stall_timeout_s, progress=progress)
        try:
            return list(
                await asyncio.gather(*(rollout_group(env, ex, params, tok, sampler) for ex in examples))
            )
        finally:
            await sampler.aclose()

    groups = asyncio.run(run())
    if failed := [t for g in groups for t in g if t.error]:
        log.warning(
            "env %r: %d of %d samples failed to score (reward 0); first: %s",
            env.name,
            len(failed),
            sum(len(g) for g in groups),
            failed[0].error,
        )
    return groups


def raise_if_none_scored(errors: list[str | None]) -> None:
    """A step (or an eval) where every sample failed to score fails, with the first error: a
    reward function that always raises is a bug to fix, not a signal to train on."""
    if errors and all(errors):
        raise DeterministicError(f"every sample failed to score; first error: {errors[0]}")


def _fits(t: Trajectory, params: SamplingParams) -> bool:
    return len(t.ids) + params.max_tokens <= params.max_model_len


def _add_turn(t: Trajectory, s: Sample, env: Environment, tok: PreTrainedTokenizerBase) -> None:
    start = len(t.ids)
    t.extend(s.completion_ids, s.logprobs)
    text = tok.decode(s.completion_ids, skip_special_tokens=True)  # vLLM sends ids, never text
    turn = {
        "text": text,
        "finish_reason": s.finish_reason,
        "start": start,
        "end": len(t.ids),
        "replica": s.replica,
        "resent": s.resent,
        "resumed": s.resumed,
        "versions": runs(s.versions),
    }
    t.turns.append(turn)
    if env.chat:
        t.messages.append(parse_assistant(text))
    t.done = len(t.turns) >= env.max_turns


def runs(versions: list[int]) -> list[list[int]]:
    """Per-token versions as [[version, count], ...] (a turn spans one or two versions)."""
    out: list[list[int]] = []
    for v in versions:
        if out and out[-1][0] == v:
            out[-1][1] += 1
        else:
            out.append([v, 1])
    return out


async def _score(env: Environment, t: Trajectory) -> None:
    try:
        t.reward, t.metrics = await env.score(t)
    except Exception as e:
        t.reward, t.metrics, t.error = 0.0, {}, str(e) if isinstance(e, RewardError) else describe(e)
