"""Write examples/tiny/sft_repeat.jsonl: prompt/completion rows of the built-in `repeat` task.

The prompt is one letter 4-8 times, as the RL rollouts send it; the completion is that letter
`max_tokens` (16) times, the answer that scores 1.0. Run from the repo root:
`python examples/tiny/make_sft_repeat.py`.
"""

import json
from pathlib import Path

from rlfleet.orchestrator.envs import RepeatEnv

ROWS, MAX_TOKENS = 256, 16

prompts = RepeatEnv().prompts(step=0, count=ROWS, seed=0, split="sft")
lines = [json.dumps({"prompt": p.text, "completion": p.answer * MAX_TOKENS}) for p in prompts]
Path(__file__).with_name("sft_repeat.jsonl").write_text("\n".join(lines) + "\n")
