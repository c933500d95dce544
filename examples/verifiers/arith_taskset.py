"""A verifiers (v1) taskset written the way a verifiers user writes one: rlfleet runs it unchanged.

    [[orchestrator.env]]
    type = "verifiers"
    args = { module = "examples/verifiers/arith_taskset.py", kwargs = { split = "train" } }

Tasks are the arithmetic problems of examples/arithmetic (made here, no download), a `calc_add`
tool the model may call, an exact-match reward and a turn-count metric.
"""

from __future__ import annotations

import random

import verifiers.v1 as vf


class ArithData(vf.TaskData):
    answer: str


class CalcToolset(vf.Toolset[vf.ToolsetConfig]):
    TOOL_PREFIX = "calc"  # the model sees `calc_add`

    @vf.tool
    def add(self, a: int, b: int) -> int:
        """Add two integers and return the sum."""
        return a + b


class ArithTaskConfig(vf.TaskConfig):
    tools: vf.ToolsetConfig = vf.ToolsetConfig()


class ArithTask(vf.Task[ArithData, vf.State, ArithTaskConfig]):
    @classmethod
    def toolsets(cls, config: ArithTaskConfig) -> list[vf.Toolset]:
        return [CalcToolset(config.tools)]

    @vf.reward(weight=1.0)
    async def exact_match(self, trace: vf.Trace) -> float:
        return float((trace.last_reply or "").strip() == self.data.answer)

    @vf.metric
    async def num_turns(self, trace: vf.Trace) -> float:
        return float(trace.num_turns)


class ArithConfig(vf.TasksetConfig):
    split: str = "train"
    num_tasks: int = 200
    task: ArithTaskConfig = ArithTaskConfig()


class ArithTaskset(vf.Taskset[ArithTask, ArithConfig]):
    def load(self):
        rng = random.Random(f"arith/{self.config.split}")
        for i in range(self.config.num_tasks):
            a, b = rng.randint(0, 9), rng.randint(0, 9)
            data = ArithData(id=f"{self.config.split}-{i}", prompt=f"{a}+{b}=", answer=str(a + b))
            yield ArithTask(data, self.config.task)


__all__ = ["ArithTaskset"]

if __name__ == "__main__":  # verifiers' own runtimes start a toolset as `python -m <module>`
    CalcToolset.run()
