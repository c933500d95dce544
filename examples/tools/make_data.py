"""`python examples/tools/make_data.py`: two-step word problems the calculator tools solve."""

import json
import random
from pathlib import Path

rng = random.Random(0)
rows = []
for _ in range(500):
    a, b, c = rng.randint(2, 99), rng.randint(2, 99), rng.randint(1, 999)
    rows.append({"prompt": f"What is {a}*{b}+{c}? Use the tools.", "answer": str(a * b + c), "a": a, "b": b, "c": c})
(Path(__file__).parent / "problems.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
