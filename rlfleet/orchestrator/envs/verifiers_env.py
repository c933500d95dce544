"""`type = "verifiers"`: an unchanged verifiers (v1) taskset, rolled out by rlfleet's own loop.

As in prime-rl, the orchestrator loads the taskset itself (`vf.load_taskset`) and lists its tasks.
The turns are rlfleet's token-in/token-out loop against its vLLM replicas (the role of verifiers'
plain `null` harness), so token ids and logprobs come from vLLM and are never re-tokenized. The
taskset's toolsets run in-process as MCP servers (no subprocess, no sandbox), and a finished
rollout is committed turn by turn into a `vf.Trace` and scored by the task's own rewards,
metrics and judges (`Task.score`).

Not supported: other harnesses and runtimes (bash, docker, sandboxes), `Env` subclasses with
their own control flow (user simulators), signals that need a runtime (skipped, as verifiers
does offline), and streaming (infinite) tasksets.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from rlfleet.config.envs import VerifiersArgs
from rlfleet.orchestrator.envs.base import Example, RewardError, Trajectory
from rlfleet.orchestrator.envs.data import stream_indices
from rlfleet.usercode import UserCodeError, describe


def _import_vf() -> Any:
    try:
        import verifiers.v1 as vf
    except ImportError as e:
        raise UserCodeError(f"module: verifiers is not installed ({e}); `pip install verifiers`") from None
    return vf


def _taskset_id(module: str) -> str:
    """A `file.py` becomes an importable module name (its directory joins sys.path)."""
    if module.endswith(".py"):
        path = Path(module).resolve()
        if not path.is_file():
            raise UserCodeError(f"module: no file {path}")
        if str(path.parent) not in sys.path:
            sys.path.insert(0, str(path.parent))
        return path.stem
    return module


class VerifiersEnv:
    chat = True

    def __init__(self, args: VerifiersArgs, name: str):
        self.vf = vf = _import_vf()
        self.args, self.name, self.max_turns = args, name, args.max_turns
        ident = _taskset_id(args.module)
        try:
            cfg = vf.taskset_config_type(ident).model_validate({"id": ident, **args.kwargs})
            self.taskset = vf.load_taskset(cfg)
        except Exception as e:
            raise UserCodeError(
                f"module: cannot load taskset {args.module!r}: {type(e).__name__}: {e}"
            ) from None
        if not getattr(self.taskset, "bounded", True):
            raise UserCodeError(f"module: {args.module!r} is an endless taskset; rlfleet needs a finite one")
        self.tasks = list(self.taskset)
        if not self.tasks:
            raise UserCodeError(f"module: taskset {args.module!r} has no tasks")
        self._tools: dict[str, tuple[list[dict], dict[str, Any]]] = {}  # per task key

    # -- examples -------------------------------------------------------------------------
    def _example(self, i: int) -> Example:
        data = self.tasks[i].data
        messages = [{"role": "system", "content": data.system_prompt}] if data.system_prompt else []
        if isinstance(data.prompt, str):
            messages.append({"role": "user", "content": data.prompt})
        elif data.prompt:
            messages += [_wire(m) for m in data.prompt]
        own = data.model_dump(mode="json", exclude=set(self.vf.TaskData.model_fields))  # the taskset's fields
        info = {"task_index": i, "id": data.id, **own}
        return Example(f"{self.name}-{i}", messages, own.get("answer"), info)

    def examples(self, step: int, count: int, seed: int) -> list[Example]:
        return self._with_tools(
            [self._example(i) for i in stream_indices(len(self.tasks), step, count, seed, True)]
        )

    def eval_examples(self, count: int) -> list[Example]:
        return self._with_tools([self._example(i) for i in range(min(count, len(self.tasks)))])

    def _with_tools(self, examples: list[Example]) -> list[Example]:
        """Set up the examples' toolsets now, outside the rollout's event loop."""

        async def setup() -> None:
            for ex in examples:
                await self._task_tools(self.tasks[ex.info["task_index"]])

        asyncio.run(setup())
        return examples

    def tools_for(self, example: Example) -> list[dict[str, Any]]:
        return self._tools[self.tasks[example.info["task_index"]].key][0]

    async def _task_tools(self, task: Any) -> tuple[list[dict], dict[str, Any]]:
        """OpenAI schemas and in-process MCP servers of a task's toolsets (set up once per task)."""
        if task.key in self._tools:
            return self._tools[task.key]
        from mcp.server.mcpserver import MCPServer

        schemas, servers = [], {}
        for ts in type(task).toolsets(task.config):
            await ts.setup()
            await ts.setup_task(task)
            srv = MCPServer(ts.server_name)
            ts.register(srv)
            for t in await srv.list_tools():
                full = f"{ts.server_name}_{t.name}" if ts.server_name else t.name
                fn = {"name": full, "description": t.description or "", "parameters": t.input_schema}
                schemas.append({"type": "function", "function": fn})
                servers[full] = (srv, t.name)
        self._tools[task.key] = (schemas, servers)
        return schemas, servers

    # -- turns and scores -----------------------------------------------------------------
    async def respond(self, traj: Trajectory) -> list[dict[str, Any]] | None:
        calls = traj.messages[-1].get("tool_calls")
        if not calls:
            return None
        _, servers = await self._task_tools(self.tasks[traj.example.info["task_index"]])
        out, records = [], []
        for c in calls:
            name, arguments = c["function"]["name"], c["function"]["arguments"]
            try:
                if name not in servers:
                    raise KeyError(f"unknown tool {name!r}; tools: {sorted(servers)}")
                srv, raw = servers[name]
                res = await asyncio.wait_for(srv.call_tool(raw, arguments), self.args.tool_timeout_s)
                content, error = "\n".join(getattr(b, "text", str(b)) for b in res.content), None
            except Exception as e:
                content, error = f"error: {describe(e)}", describe(e)
            out.append({"role": "tool", "tool_call_id": c["id"], "name": name, "content": content})
            records.append({"name": name, "arguments": arguments, "result": content, "error": error})
        traj.turns[-1]["tool_calls"] = records
        return out

    async def score(self, traj: Trajectory) -> tuple[float, dict[str, float]]:
        task = self.tasks[traj.example.info["task_index"]]
        schemas, _ = await self._task_tools(task)
        trace = self._trace(task, traj, schemas)
        try:
            await asyncio.wait_for(task.score(trace), self.args.reward_timeout_s)
        except Exception as e:
            raise RewardError(f"taskset {self.args.module} scoring {describe(e)}") from e
        metrics = {k: float(r.score) for k, r in trace.rewards.items()}
        metrics.update({k: float(v) for k, v in (trace.metrics or {}).items()})
        return float(trace.reward or 0.0), metrics

    def _trace(self, task: Any, traj: Trajectory, schemas: list[dict]) -> Any:
        """The rollout as verifiers' own trace: each model turn committed with its token ids."""
        from verifiers.v1.dialects import parse_message
        from verifiers.v1.graph import prepare_turn
        from verifiers.v1.trace import TraceTask

        vf = self.vf
        trace = vf.Trace(
            task=TraceTask(type=type(task).__name__, data=task.data, key=task.key, hash=task.hash),
            agent=vf.AgentInfo(config=vf.AgentConfig(model="policy", runtime=vf.SubprocessConfig())),
        )
        tools = [vf.Tool(**s["function"]) for s in schemas]
        messages = [parse_message(_openai(m)) for m in traj.messages]
        turn = 0
        for i, m in enumerate(messages):
            if not isinstance(m, vf.AssistantMessage):
                continue
            t = traj.turns[turn]
            tokens = vf.TurnTokens(
                prompt_ids=traj.ids[: t["start"]],
                completion_ids=traj.ids[t["start"] : t["end"]],
                completion_logprobs=traj.logprobs[t["start"] : t["end"]],
            )
            finish = (
                "tool_calls" if m.tool_calls else ("length" if t["finish_reason"] == "length" else "stop")
            )
            response = vf.Response(
                id=f"turn{turn}", created=0, model="policy", message=m, finish_reason=finish, tokens=tokens
            )
            prepare_turn(trace, messages[:i], tools).commit(response)
            turn += 1
        trace.ok = trace.is_completed = True
        return trace


def _wire(message: Any) -> dict[str, Any]:
    return message if isinstance(message, dict) else message.model_dump(mode="json", exclude_none=True)


def _openai(m: dict[str, Any]) -> dict[str, Any]:
    """A message in OpenAI wire form (tool call arguments as a JSON string)."""
    if not m.get("tool_calls"):
        return m
    calls = [
        {**c, "function": {**c["function"], "arguments": json.dumps(c["function"]["arguments"])}}
        for c in m["tool_calls"]
    ]
    return {**m, "tool_calls": calls}
