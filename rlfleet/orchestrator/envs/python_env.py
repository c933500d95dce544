"""`type = "python"`: a dataset, reward functions, and optionally tools and an environment reply.

Reward functions take any of these by name (TRL / verifiers style) and may be sync or async:
  completion (str, the model's last turn), completion_messages, messages, prompt, answer, info
  (the row's other columns), state (turns, tool_calls, tool_results, truncated, ...), and every
  dataset column by its own name.
They return a float, or a dict of named scores whose `score` (else first) entry is the reward and
the rest are logged metrics. The sample's reward is the weighted sum over functions.
"""

from __future__ import annotations

from typing import Any

from rlfleet.config.envs import PythonArgs
from rlfleet.orchestrator.envs.base import Example, RewardError, Trajectory
from rlfleet.orchestrator.envs.data import load_rows, stream_indices
from rlfleet.orchestrator.envs.tools import python_tools, run_tool_calls
from rlfleet.usercode import UserFn, describe, field

INJECTED = {"completion", "completion_messages", "messages", "prompt", "answer", "info", "state"}


class PythonEnv:
    def __init__(self, args: PythonArgs, name: str = "python", eval_split: bool = False):
        self.args, self.name = args, name
        self.chat, self.max_turns = args.chat, args.max_turns
        with field("dataset"):
            self.rows = load_rows(args.dataset, args.split)
        self.columns = list(self.rows.column_names)
        self.rewards = []
        for i, r in enumerate(args.rewards):
            with field(f"rewards.{i}.fn"):
                self.rewards.append((UserFn(r.fn), r.weight))
        with field("tools"):
            self.tool_schemas, self._tool_calls = python_tools(args.tools, args.tool_timeout_s)
        self.env_response = None
        if args.env_response:
            with field("env_response"):
                self.env_response = UserFn(args.env_response)

    def problems(self) -> list[str]:
        """What preflight reports, with the field each comes from (relative to `args`)."""
        out = []
        for key, col in (
            ("prompt_column", self.args.prompt_column),
            ("answer_column", self.args.answer_column),
        ):
            if col is not None and col not in self.columns:
                out.append(f"{key}: no column {col!r} in {self.args.dataset}; columns: {self.columns}")
        if len(self.rows) == 0:
            out.append(f"dataset: {self.args.dataset} has no rows")
        elif not out:
            prompt = self.rows[0][self.args.prompt_column]
            if not (isinstance(prompt, str) or _is_messages(prompt)):
                out.append(
                    f"prompt_column: {self.args.prompt_column!r} holds {type(prompt).__name__}; "
                    "a prompt is a string or a list of {role, content} messages"
                )
            elif not self.chat and not isinstance(prompt, str):
                out.append("chat: chat messages need chat = true")
        available = INJECTED | set(self.columns)
        for i, (fn, _) in enumerate(self.rewards):
            if missing := fn.missing(available):
                out.append(
                    f"rewards.{i}.fn: {fn.ref} needs {missing}, which is neither a column nor one of {sorted(INJECTED)}"
                )
        if self.env_response and (missing := self.env_response.missing(available)):
            out.append(f"env_response: {self.env_response.ref} needs {missing}")
        return out

    def _example(self, i: int) -> Example:
        row = self.rows[i]
        a = self.args
        prompt = row[a.prompt_column]
        if self.chat:
            messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
            if a.system_prompt and messages[0].get("role") != "system":
                messages.insert(0, {"role": "system", "content": a.system_prompt})
            prompt = messages
        info = {k: v for k, v in row.items() if k not in (a.prompt_column, a.answer_column)}
        return Example(f"{self.name}-{i}", prompt, row[a.answer_column] if a.answer_column else None, info)

    def examples(self, step: int, count: int, seed: int) -> list[Example]:
        return [
            self._example(i) for i in stream_indices(len(self.rows), step, count, seed, self.args.shuffle)
        ]

    def eval_examples(self, count: int) -> list[Example]:
        return [self._example(i) for i in range(min(count, len(self.rows)))]

    def tools_for(self, example: Example) -> list[dict[str, Any]]:
        return self.tool_schemas

    def _available(self, traj: Trajectory) -> dict[str, Any]:
        ex = traj.example
        return {
            **ex.info,
            "prompt": ex.prompt,
            "answer": ex.answer,
            "info": ex.info,
            "completion": traj.completion,
            "completion_messages": traj.completion_messages,
            "messages": traj.messages,
            "state": traj.state(),
        }

    async def respond(self, traj: Trajectory) -> list[dict[str, Any]] | None:
        last = traj.messages[-1]
        if last.get("tool_calls") and self._tool_calls:
            messages, records = await run_tool_calls(last, self._tool_calls)
            traj.turns[-1]["tool_calls"] = records
            return messages
        if self.env_response is None:
            return None
        try:
            reply = await self.env_response(self.args.tool_timeout_s, **self._available(traj))
        except Exception as e:  # a broken environment ends this rollout, not the step
            traj.turns[-1]["env_error"] = f"{self.env_response.ref}: {describe(e)}"
            return None
        if reply is None:
            return None
        if isinstance(reply, str):
            return [{"role": "user", "content": reply}]
        return [reply] if isinstance(reply, dict) else list(reply)

    async def score(self, traj: Trajectory) -> tuple[float, dict[str, float]]:
        available = self._available(traj)
        total, metrics = 0.0, {}
        for fn, weight in self.rewards:
            try:
                out = await fn(self.args.reward_timeout_s, **available)
            except Exception as e:
                raise RewardError(f"reward {fn.ref} {describe(e)}") from e
            value, extra = _split_score(out, fn.ref)
            total += weight * value
            metrics[fn.name] = value
            metrics.update({f"{fn.name}/{k}": v for k, v in extra.items()})
        return total, metrics


def _split_score(out: Any, ref: str) -> tuple[float, dict[str, float]]:
    if isinstance(out, dict):
        if not out:
            raise RewardError(f"reward {ref} returned an empty dict")
        key = "score" if "score" in out else next(iter(out))
        return float(out[key]), {k: float(v) for k, v in out.items() if k != key}
    try:
        return float(out), {}
    except (TypeError, ValueError):
        raise RewardError(f"reward {ref} returned {type(out).__name__}, not a number or a dict") from None


def _is_messages(value: Any) -> bool:
    return (
        isinstance(value, list)
        and bool(value)
        and all(isinstance(m, dict) and "role" in m and "content" in m for m in value)
    )
