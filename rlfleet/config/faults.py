"""`[faults]`: the stall watchdog (rlfleet/runs/stalls.py).

A run is stalled when nothing has progressed for `stall_timeout_s`: no token sampled on any
replica, no trainer step, no weight load finished, nothing starting. Every wait in rlfleet has its
own liveness check; this catches the waits that have none (a process frozen, a collective that
never returns, an event loop blocked by user code) and says who waits for whom.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from rlfleet.config.base import Strict
from rlfleet.config.envs import env_name


class FaultsConfig(Strict):
    """What rlfleet does when a run stops making progress."""

    stall_timeout_s: float | None = Field(
        600.0,
        ge=0,
        description="Seconds without any progress (a sampled token, a trainer step, a weight load, a "
        "process start) after which the run is stalled: rlfleet writes stalls/<time>/ (py-spy dumps of "
        "every process of the run, summary.txt) and recovers per on_stall. 0 or unset: no watchdog. Keep "
        "it above the longest trainer step when max_async_level = 0 (nothing samples meanwhile).",
    )
    on_stall: Literal["relaunch", "fail"] = Field(
        "relaunch",
        description="relaunch: kill the stuck part (a replica, which the pool relaunches; the trainer, "
        "which the train task's retry relaunches); a stall with nothing to relaunch (user code blocking "
        "the controller), or a second stall with no progress since the first, fails the run. "
        "fail: fail the run at once with the diagnosis as its error.",
    )
    dump_timeout_s: float = Field(
        20.0,
        gt=0,
        description="Bound of one py-spy dump: a dump of a wedged process cannot hang the watchdog.",
    )

    @property
    def enabled(self) -> bool:
        return bool(self.stall_timeout_s)

    def check(self, envs: list[Any]) -> None:
        """The watchdog must not fire before user code's own timeouts (reward, tool) contain it:
        a reward function that hangs costs its timeout and a reward of 0, never a stall."""
        if not self.stall_timeout_s:
            return
        bounds = {}
        for e in envs:
            args = getattr(e, "args", None)
            calls_tools = bool(getattr(args, "tools", None) or getattr(args, "env_response", None))
            for k in ("reward_timeout_s", "tool_timeout_s"):
                v = getattr(args, k, None)
                if v is not None and (k == "reward_timeout_s" or calls_tools or e.type == "verifiers"):
                    bounds[f"{env_name(e)}.{k}"] = v
        if bounds and self.stall_timeout_s <= max(bounds.values()):
            field, v = max(bounds.items(), key=lambda kv: kv[1])
            raise ValueError(
                f"faults.stall_timeout_s ({self.stall_timeout_s:g}) must exceed the user code timeouts of the "
                f"envs (env {field} = {v:g}): a hung reward or tool is contained by its own timeout"
            )
