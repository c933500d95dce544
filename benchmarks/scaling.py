"""The issue's scaling rows: benchmarks/long_tail.py's job (a) once per placement on 1, 2 and 4 GPUs
of one host, rlfleet only, into one JSON. Not yet run on GPUs (docs/gpus.md, "Placements").

    python benchmarks/scaling.py --out benchmarks/results/scaling_h100x4_05b.json --steps 10
    python benchmarks/scaling.py --out /tmp/s.json --only colocated-4 --dry-run   # the commands only

A layout that needs more GPUs than are visible is skipped; one that config/placement.py refuses
(e.g. TP that does not split the shape's heads) is recorded with the refusal, not run.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

from rlfleet.config.placement import visible_gpus

D = "--deployment."
LAYOUTS: dict[str, tuple[int, str]] = {  # name -> (GPUs, rlfleet overrides)
    "shared-1": (1, f"{D}num-inference-gpus 1 {D}num-train-gpus 1"),
    "split-2": (2, f"{D}num-inference-gpus 1 {D}num-train-gpus 1"),
    "colocated-2": (
        2,
        f"{D}placement colocated {D}num-inference-gpus 2 {D}num-train-gpus 2 --inference.num-replicas 2",
    ),
    "dp2-fsdp2-4": (4, f"{D}num-inference-gpus 2 {D}num-train-gpus 2 --inference.num-replicas 2"),
    "dp2-fsdp2-nccl-4": (
        4,
        f"{D}num-inference-gpus 2 {D}num-train-gpus 2 --inference.num-replicas 2 --weights.transport nccl",
    ),
    "dp3-fsdp1-4": (4, f"{D}num-inference-gpus 3 {D}num-train-gpus 1 --inference.num-replicas 3"),
    "tp2-fsdp2-4": (4, f"{D}num-inference-gpus 2 {D}num-train-gpus 2 --inference.tensor-parallel-size 2"),
    "colocated-4": (
        4,
        f"{D}placement colocated {D}num-inference-gpus 4 {D}num-train-gpus 4 --inference.num-replicas 4",
    ),
    "colocated-tp2-4": (
        4,
        f"{D}placement colocated {D}num-inference-gpus 4 {D}num-train-gpus 4 --inference.num-replicas 2 "
        "--inference.tensor-parallel-size 2",
    ),
}


def command(name: str, overrides: str, a: argparse.Namespace, out: Path) -> list[str]:
    return [
        sys.executable, str(Path(__file__).parent / "long_tail.py"),
        "--device", "cuda", "--shape", a.shape, "--only", "rlfleet", "--steps", str(a.steps),
        "--variants", f"{name}={overrides}", "--out", str(out),
    ]  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--shape", default="05b")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--only", default="", help="comma-separated layout names (default: all that fit)")
    ap.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    a = ap.parse_args()
    have = len(visible_gpus())
    wanted = [n for n in a.only.split(",") if n] or list(LAYOUTS)
    results: dict[str, dict] = {"visible_gpus": have, "shape": a.shape, "steps": a.steps, "layouts": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for name in wanted:
            gpus, overrides = LAYOUTS[name]
            row: dict = {"gpus": gpus, "overrides": overrides}
            results["layouts"][name] = row
            if gpus > have and not a.dry_run:
                row["skipped"] = f"needs {gpus} GPUs, {have} visible"
                continue
            out = Path(tmp) / f"{name}.json"
            cmd = command(name, overrides, a, out)
            row["command"] = shlex.join(cmd)
            if a.dry_run:
                print(row["command"])
                continue
            done = subprocess.run(cmd, capture_output=True, text=True, check=False)
            row["returncode"] = done.returncode
            if done.returncode == 0 and out.exists():
                row["result"] = json.loads(out.read_text())
            else:  # a refusal names its fields on stderr
                row["error"] = (done.stderr or done.stdout)[-2000:]
            Path(a.out).write_text(json.dumps(results, indent=2))  # after each: a long run keeps what it has
    Path(a.out).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
