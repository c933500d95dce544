"""A fresh clone's `make run`: seconds from the clone to step 0's end (54's goal: <= 60 s), and
each Makefile line's share of them.

Each repetition clones this checkout at `--ref` into an empty directory and runs `make run` there
as a new user would: a new venv, uv's install, its bytecode, the tiny model, the tiny RL job. uv's
own cache and vLLM's compile cache stay as the machine has them (say which in the notes); the box's
speed moves the figure a lot from day to day, so compare refs in one call (`--ref A --ref B`, run
alternately).

    python benchmarks/fresh_clone.py --reps 2 --out benchmarks/results/fresh_clone_cpu_2core.json
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import tempfile
import time
from itertools import pairwise
from pathlib import Path

from common import ROOT, median, table, write

# What `make run` prints at the start of each part, in order (a part may read either way, old and
# new Makefiles); the last is the flow's step-0 line, after which the rest of the job runs.
MARKS = {
    "venv": ("python3 -m venv",),
    "uv": ("test -x .venv/bin/uv",),
    "install": (".venv/bin/uv pip install",),
    "uninstall": (".venv/bin/uv pip uninstall",),
    "compile": ("compileall -q rlfleet", "scripts/compile_bytecode.py"),
    "model": (".venv/bin/rlfleet model tiny",),
    "run": (".venv/bin/rlfleet rl @",),
    "after_step0": ("step 0 (1/",),
}


def one(ref: str, tmp: Path, log: Path) -> dict:
    dest = tmp / "clone"
    shutil.rmtree(dest, ignore_errors=True)
    t0 = time.time()
    subprocess.run(["git", "clone", "-q", str(ROOT), str(dest)], check=True)
    subprocess.run(["git", "-C", str(dest), "checkout", "-q", ref], check=True)
    seen: dict[str, float] = {"clone": 0.0}
    with open(log, "a") as out:
        out.write(f"=== {ref} at {time.ctime(t0)}, load {os.getloadavg()[0]:.2f}\n")
        proc = subprocess.Popen(
            ["make", "run"], cwd=dest, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        for line in proc.stdout:
            t = time.time() - t0
            out.write(f"{t:7.2f} {line}")
            for name, marks in MARKS.items():
                if name not in seen and any(m in line for m in marks):
                    seen[name] = t
        rc = proc.wait()
    seen["end"] = time.time() - t0
    if rc or "after_step0" not in seen:
        raise SystemExit(f"make run in a clone of {ref} exited {rc}; see {log}")
    names = list(seen)
    parts = {a: round(seen[b] - seen[a], 2) for a, b in pairwise(names)}
    return {
        "ref": ref,
        "first_step_s": round(seen["after_step0"], 2),
        "make_run_s": round(seen["end"], 2),
        "parts_s": parts,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ref", action="append", help="commits to clone, alternately (default HEAD)")
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--log", type=Path, default=Path("/tmp/fresh_clone.log"))
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    refs = [
        subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "--short", r], capture_output=True, text=True, check=True
        ).stdout.strip()
        for r in a.ref or ["HEAD"]
    ]
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(a.reps):
            for ref in refs:
                runs.append(one(ref, Path(tmp), a.log) | {"rep": rep})
                print(runs[-1], flush=True)
    rows = [[r, median([x["first_step_s"] for x in runs if x["ref"] == r])] for r in refs]
    table("fresh clone, make run", ["ref", "first step s (median)"], rows)
    write(a.out, {"config": {"refs": refs, "reps": a.reps}, "runs": runs})


if __name__ == "__main__":
    main()
