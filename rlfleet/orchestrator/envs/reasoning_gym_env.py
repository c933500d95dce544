"""`type = "reasoning_gym"`: procedural tasks from the `reasoning-gym` package, scored by their own code.

Each `datasets` entry is a reasoning-gym dataset (`name`, `weight`, `config`); together they form one
reasoning-gym composite of `size` examples drawn with `seed`, so a step's prompts mix the datasets by
weight and every example keeps the dataset that scores it. Eval draws its own composite with
`seed + 1`: procedurally new examples (a task with few distinct problems, such as one-digit addition,
repeats some of training's). The answer is the completion's last `<answer>...</answer>` (reasoning-gym's
convention), its last number (`last_number`, for models that answer in a sentence) or the whole
completion (`plain`); the reward is the dataset's
`score_answer` (1.0 exact, partial credit where the dataset gives it), so pass@k counts exact answers.
"""

from __future__ import annotations

import asyncio
import dataclasses
import re
from functools import lru_cache
from typing import Any

from rlfleet.config.envs import ReasoningGymArgs
from rlfleet.orchestrator.envs.base import Example, RewardError, SingleTurn, Trajectory
from rlfleet.orchestrator.envs.data import stream_indices
from rlfleet.usercode import UserCodeError, describe, on_daemon_thread

NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def extract(completion: str, answer_format: str) -> str | None:
    """The answer the model gave: the last <answer> tag's text, the last number, or the whole completion."""
    if answer_format == "plain":
        return completion.strip()
    if answer_format == "last_number":
        numbers = NUMBER.findall(completion)
        return numbers[-1].replace(",", "").rstrip(".") if numbers else None
    from reasoning_gym.utils import extract_answer

    return extract_answer(completion)


def composite(args: ReasoningGymArgs, seed: int) -> Any:
    """The reasoning-gym composite of `args.datasets`; a bad name or config field names its entry."""
    import reasoning_gym
    from reasoning_gym.composite import DatasetSpec
    from reasoning_gym.factory import DATASETS

    for i, spec in enumerate(args.datasets):
        if spec.name not in DATASETS or spec.name == "composite":
            valid = sorted(n for n in DATASETS if n != "composite")
            raise UserCodeError(f"datasets.{i}.name: no reasoning-gym dataset {spec.name!r}; valid: {valid}")
        fields = {f.name for f in dataclasses.fields(DATASETS[spec.name][1])} - {"seed", "size"}
        if unknown := sorted(set(spec.config) - fields):
            raise UserCodeError(
                f"datasets.{i}.config: {spec.name} has no field {unknown}; fields: {sorted(fields)}"
            )
        try:  # the dataset's own checks (asserts), before the composite hides which entry failed
            reasoning_gym.create_dataset(spec.name, **spec.config, size=1, seed=seed)
        except Exception as e:
            raise UserCodeError(f"datasets.{i}.config: {spec.name}: {describe(e)}") from None
    specs = [DatasetSpec(name=d.name, weight=d.weight, config=dict(d.config)) for d in args.datasets]
    return reasoning_gym.create_dataset("composite", size=args.size, seed=seed, datasets=specs)


class ReasoningGymEnv(SingleTurn):
    chat = True

    def __init__(self, args: ReasoningGymArgs, name: str = "reasoning_gym"):
        self.args, self.name = args, name
        self.train = composite(args, args.seed)
        self.eval = composite(args, args.seed + 1)
        self.system_prompt = args.system_prompt
        if self.system_prompt is None and args.answer_format == "answer_tag":
            from reasoning_gym.utils import SYSTEM_PROMPTS

            self.system_prompt = SYSTEM_PROMPTS["default"]
        self._entry = lru_cache(maxsize=65536)(self._make_entry)

    def _make_entry(self, split: str, i: int) -> dict[str, Any]:
        return (self.train if split == "train" else self.eval)[i]

    def _example(self, split: str, i: int) -> Example:
        entry = self._entry(split, i)
        messages = [{"role": "user", "content": entry["question"]}]
        if self.system_prompt:
            messages.insert(0, {"role": "system", "content": self.system_prompt})
        info = {"split": split, "index": i, "dataset": entry["metadata"]["source_dataset"]}
        return Example(f"{self.name}-{split}-{i}", messages, entry["answer"], info)

    def examples(self, step: int, count: int, seed: int) -> list[Example]:
        return [self._example("train", i) for i in stream_indices(self.args.size, step, count, seed, True)]

    def eval_examples(self, count: int) -> list[Example]:
        return [self._example("eval", i) for i in range(min(count, self.args.size))]

    async def score(self, traj: Trajectory) -> tuple[float, dict[str, float]]:
        info = traj.example.info
        entry = self._entry(info["split"], info["index"])
        answer = extract(traj.completion, self.args.answer_format)
        data = self.train if info["split"] == "train" else self.eval
        try:
            call = on_daemon_thread(lambda: data.score_answer(answer, entry), {}, info["dataset"])
            reward = float(await asyncio.wait_for(call, self.args.reward_timeout_s))
        except Exception as e:  # the dataset's scorer raised or hung: this sample fails, not the step
            raise RewardError(f"reasoning-gym {info['dataset']}.score_answer {describe(e)}") from e
        return reward, {"answered": float(answer is not None)}
