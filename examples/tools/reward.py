"""Rewards of the calculator task: the final answer, and (logged) whether a tool was used."""


def correct(completion: str, answer: str) -> float:
    return float(completion.strip() == answer)


def used_tool(state: dict) -> float:
    """Share of tool calls that ran without error (0 when the model called none)."""
    calls = state["tool_calls"]
    return sum(c["error"] is None for c in calls) / len(calls) if calls else 0.0
