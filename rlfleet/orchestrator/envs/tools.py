"""Tools: schemas from a function's type hints and docstring, calls from the model, contained.

A tool that raises, times out or is unknown answers the model with an error message (that is
what the model must learn from); it never fails the rollout.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

from rlfleet.usercode import UserCodeError, UserFn, describe

ToolCall = Callable[[dict[str, Any]], Awaitable[Any]]  # arguments -> result


def tool_schema(fn: UserFn) -> dict[str, Any]:
    """The OpenAI function schema `transformers` derives from type hints and a Google docstring."""
    from transformers.utils import get_json_schema

    try:
        return get_json_schema(fn.fn)
    except Exception as e:  # the docstring or hints do not describe every argument
        raise UserCodeError(f"{fn.ref!r}: no tool schema from its hints and docstring: {e}") from None


def python_tools(refs: list[str], timeout_s: float) -> tuple[list[dict[str, Any]], dict[str, ToolCall]]:
    """Schemas and callables of `file.py:fn` tools."""
    schemas, calls = [], {}
    for ref in refs:
        fn = UserFn(ref)
        schemas.append(tool_schema(fn))

        async def call(arguments: dict[str, Any], fn: UserFn = fn) -> Any:
            return await fn(timeout_s, **arguments)

        calls[fn.name] = call
    return schemas, calls


async def run_tool_calls(
    message: dict[str, Any], tools: dict[str, ToolCall]
) -> tuple[list[dict], list[dict]]:
    """(tool messages, call records) for an assistant message's `tool_calls`."""
    out, records = [], []
    for c in message.get("tool_calls", []):
        name, arguments = c["function"]["name"], c["function"]["arguments"]
        error = None
        if name not in tools:
            error = f"unknown tool {name!r}; tools: {sorted(tools)}"
        elif not isinstance(arguments, dict):
            error = "arguments must be a JSON object"
        else:
            try:
                result = await tools[name](arguments)
            except Exception as e:
                error = describe(e)
        content = f"error: {error}" if error else (result if isinstance(result, str) else json.dumps(result))
        out.append({"role": "tool", "tool_call_id": c["id"], "name": name, "content": content})
        records.append({"name": name, "arguments": arguments, "result": content, "error": error})
    return out, records
