#!/usr/bin/env bash
# The bring-your-own-task workflow on the 2-core CPU box: data -> SFT warm start -> eval -> RL -> eval.
#   bash examples/arithmetic/run.sh        (from the repository root, after `make install`)
set -euo pipefail
RLFLEET=${RLFLEET:-.venv/bin/rlfleet}
PY=${PY:-.venv/bin/python}
OUT=${OUT:-outputs/arith}
E=examples/arithmetic

$PY $E/make_data.py
[ -f models/tiny/config.json ] || $RLFLEET model tiny --out models/tiny
$RLFLEET eval @ $E/eval.toml --model.path models/tiny --checkpoint base --output-dir $OUT/base
$RLFLEET sft @ $E/sft.toml --output-dir $OUT/sft
SFT_WEIGHTS=$OUT/sft/weights/step_99
$RLFLEET eval @ $E/eval.toml --model.path $SFT_WEIGHTS --checkpoint base --output-dir $OUT/sft
$RLFLEET rl @ $E/rl.toml @ $E/eval.toml --model.path $SFT_WEIGHTS --output-dir $OUT/rl

$PY - "$OUT" <<'PY'
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
rows = [("random init", out / "base/evals/base.json"), ("after SFT", out / "sft/evals/base.json")]
rows += [(f"RL step {p.stem[5:]}", p) for p in sorted((out / "rl/evals").glob("step_*.json"), key=lambda p: int(p.stem[5:]))]
print(f"{'policy':<14} pass@1  mean reward")
for name, path in rows:
    r = json.loads(path.read_text())
    print(f"{name:<14} {r['pass_rate']:.3f}   {r['mean_reward']:.3f}")
PY
