"""The scaling table (issue 55): benchmarks/long_tail.py's job (a) once per placement on 1, 2 and 4
GPUs of one host, rlfleet only, into one JSON, and a picture beside it.

Columns: trained tokens/s, efficiency (tokens/s / (the 1-GPU baseline's x GPUs)), the engine's busy
fraction (long_tail.py's: generated tokens/s over the engine's own peak at the same concurrency;
`--no-peak` leaves it out and saves a peak run per layout), the trainer's in-loop MFU and tokens/s
(median over the steps after the first, which compiles), and weight-sync seconds (the broadcast
phase, median). Every layout runs k = 1 except the one that sleeps vLLM while the trainer steps,
which needs k = 0 and gets its own k = 0 baseline.

    python benchmarks/scaling.py --out benchmarks/results/scaling_h200x4_05b.json --steps 10
    python benchmarks/scaling.py --out /tmp/s.json --only colocated-4 --dry-run   # the commands only
    python benchmarks/scaling.py --plot benchmarks/results/scaling_h200x4_05b.json  # the PNG beside it
    python benchmarks/scaling.py --merge benchmarks/results/scaling_h200x4_05b.json /tmp/lane*.json

`--batch-per-gpu 32` scales the step's prompts with the layout's GPUs (weak scaling, as a user
grows the batch with the GPUs); without it every layout samples the same 32 prompts a step.
`--max-async-level K` runs the k = 1 layouts at k = K (more steps in flight hide a step's tail).
`--merge` joins the JSONs of lanes run side by side on disjoint GPUs of one host (e.g. the 1-GPU
baselines on GPU 0 and 1 while a 2-GPU layout runs on 2 and 3) into one table.

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
from statistics import median
from typing import Any, NamedTuple

from common import bar, dump, pyplot, save_png

D = "--deployment."
K1 = "--orchestrator.max-async-level 1"
K0 = "--orchestrator.max-async-level 0"
COLOCATED = f"{D}placement colocated {D}num-inference-gpus 4 {D}num-train-gpus 4"


class Layout(NamedTuple):
    gpus: int
    overrides: str
    baseline: str  # the 1-GPU layout its efficiency is against


LAYOUTS: dict[str, Layout] = {
    "shared-1": Layout(1, f"{D}num-inference-gpus 1 {D}num-train-gpus 1 {K1}", "shared-1"),
    "shared-1-k0": Layout(1, f"{D}num-inference-gpus 1 {D}num-train-gpus 1 {K0}", "shared-1-k0"),
    "split-2": Layout(2, f"{D}num-inference-gpus 1 {D}num-train-gpus 1 {K1}", "shared-1"),
    "split-2-nccl": Layout(
        2, f"{D}num-inference-gpus 1 {D}num-train-gpus 1 --weights.transport nccl {K1}", "shared-1"
    ),
    "colocated-2": Layout(
        2,
        f"{D}placement colocated {D}num-inference-gpus 2 {D}num-train-gpus 2 --inference.num-replicas 2 {K1}",
        "shared-1",
    ),
    "dp2-fsdp2-4": Layout(
        4, f"{D}num-inference-gpus 2 {D}num-train-gpus 2 --inference.num-replicas 2 {K1}", "shared-1"
    ),
    "dp2-fsdp2-nccl-4": Layout(
        4,
        f"{D}num-inference-gpus 2 {D}num-train-gpus 2 --inference.num-replicas 2 --weights.transport nccl {K1}",
        "shared-1",
    ),
    "dp3-fsdp1-4": Layout(
        4, f"{D}num-inference-gpus 3 {D}num-train-gpus 1 --inference.num-replicas 3 {K1}", "shared-1"
    ),
    "dp3-fsdp1-nccl-4": Layout(
        4,
        f"{D}num-inference-gpus 3 {D}num-train-gpus 1 --inference.num-replicas 3 --weights.transport nccl {K1}",
        "shared-1",
    ),
    "tp2-fsdp2-4": Layout(
        4, f"{D}num-inference-gpus 2 {D}num-train-gpus 2 --inference.tensor-parallel-size 2 {K1}", "shared-1"
    ),
    "colocated-4": Layout(4, f"{COLOCATED} --inference.num-replicas 4 {K1}", "shared-1"),
    "colocated-tp2-4": Layout(
        4, f"{COLOCATED} --inference.num-replicas 2 --inference.tensor-parallel-size 2 {K1}", "shared-1"
    ),
    "colocated-sleep-4": Layout(
        4, f"{COLOCATED} --inference.num-replicas 4 --inference.sleep true {K0}", "shared-1-k0"
    ),
}
# job (a) as docs/benchmarks/long-generations.md runs it: EOS tuned to 1/500, lr 1e-7 (a speed run),
# 8 packed rows per micro-batch (the in-loop trainer's measured best at both shapes)
JOB = ["--eos-rate", "0.002", "--trainer.lr", "1e-7", "--orchestrator.micro-batch-size", "8"]


def overrides(name: str, k: int | None) -> str:
    """The layout's overrides, at async level k where it runs k = 1 (an asleep layout stays at 0)."""
    return (
        LAYOUTS[name].overrides.replace(K1, f"--orchestrator.max-async-level {k}")
        if k
        else LAYOUTS[name].overrides
    )


def command(name: str, a: argparse.Namespace, out: Path) -> list[str]:
    return [
        sys.executable, str(Path(__file__).parent / "long_tail.py"),
        "--device", "cuda", "--shape", a.shape, "--only", "rlfleet", "--steps", str(a.steps), *JOB,
        *(["--no-peak"] if a.no_peak else []),
        *(["--logs", str(Path(a.logs) / name)] if a.logs else []),
        *(["--orchestrator.batch-size", str(a.batch_per_gpu * LAYOUTS[name].gpus)] if a.batch_per_gpu else []),
        "--variants", f"{name}={overrides(name, a.max_async_level)}", "--out", str(out),
    ]  # fmt: skip


def row(name: str, result: dict[str, Any]) -> dict[str, Any]:
    """The table's columns from long_tail.py's result for the layout (its run is `result[name]`)."""
    run = result[name]
    steady = slice(1, None) if len(run["per_step"]["step"]) > 1 else slice(None)

    def mid(key: str) -> float | None:
        xs = [x for x in run["per_step"].get(key, [])[steady] if x is not None]
        return median(xs) if xs else None

    return {
        "tokens_per_s": run["gen_tokens_per_s"],
        "busy": run.get("busy"),
        "trainer_mfu": mid("mfu"),
        "trainer_tokens_per_s": mid("train_tokens_per_s"),
        "sync_s": mid("broadcast"),
        "median_step_s": run["median_step_s"],
    }


def with_efficiency(rows: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Each measured row's tokens/s over its baseline's x its GPUs (None without the baseline)."""
    for name, r in rows.items():
        base = rows.get(LAYOUTS[name].baseline, {}).get("tokens_per_s")
        r["efficiency"] = (
            r["tokens_per_s"] / (base * LAYOUTS[name].gpus) if base and "tokens_per_s" in r else None
        )
    return rows


def merge(out: Path, parts: list[Path]) -> Path:
    """One table from lanes' JSONs: their layouts and rows, efficiency recomputed across them.
    Lanes of different jobs (shape, steps, batch, async level) are refused: their rows do not compare."""
    doc: dict[str, Any] = {"layouts": {}, "rows": {}, "lanes": []}
    for part in parts:
        lane = json.loads(part.read_text())
        for key in ("shape", "steps", "batch_per_gpu", "max_async_level"):
            if (seen := doc.setdefault(key, lane.get(key))) != lane.get(key):
                raise SystemExit(f"--merge: {part} ran {key} {lane.get(key)}, the lanes before it {seen}")
        if lane.get("device"):
            doc.setdefault("device", lane["device"])
        doc["lanes"].append({"file": part.name, "visible_gpus": lane["visible_gpus"]})
        doc["layouts"] |= {n: e for n, e in lane["layouts"].items() if "skipped" not in e}
        doc["rows"] |= lane["rows"]
    with_efficiency(doc["rows"])
    dump(out, doc, indent=2)
    return plot(out)


def plot(path: Path) -> Path:
    """Bars of trained tokens/s per layout, efficiency written on each; the PNG beside the JSON."""
    doc = json.loads(path.read_text())
    rows = {n: r for n, r in doc["rows"].items() if "tokens_per_s" in r}
    fig, ax = pyplot().subplots(figsize=(max(6, 1.1 * len(rows)), 4))
    for i, (name, r) in enumerate(rows.items()):
        eff = "" if r.get("efficiency") is None else f"{100 * r['efficiency']:.0f}%"
        bar(ax, i, r["tokens_per_s"] / 1e3, eff, color=f"C{LAYOUTS[name].gpus}")
    ax.set_xticks(range(len(rows)), list(rows), rotation=30, ha="right")
    ax.set_ylabel("trained tokens/s (thousands)")
    bpg = doc.get("batch_per_gpu")
    batch = f"{bpg} prompts x GPUs (weak scaling)" if bpg else "32 prompts at any GPU count"
    k = f", k = {doc['max_async_level']}" if doc.get("max_async_level") else ""
    ax.set_title(
        f"job (a), {doc['shape']} shape, {doc.get('steps', '?')} steps{k}, {doc.get('device', '')}"
        f"\nbatch {batch}; on each bar: efficiency against 1 GPU",
        fontsize=10,
    )
    return save_png(fig, path.with_suffix(".png"))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", help="the JSON to write (with --plot: the JSON to draw)")
    ap.add_argument("--shape", default="05b")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--only", default="", help="comma-separated layout names (default: all that fit)")
    ap.add_argument("--no-peak", action="store_true", help="skip the engine's peak (no busy column)")
    ap.add_argument(
        "--batch-per-gpu",
        type=int,
        help="prompts a step per GPU of the layout (weak scaling; default: the job's 32 at every size)",
    )
    ap.add_argument(
        "--max-async-level",
        type=int,
        help="k for every layout that runs k = 1 (steps in flight beside the trainer; asleep stays at 0)",
    )
    ap.add_argument("--logs", help="keep each layout's logs in this directory, a folder per layout")
    ap.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    ap.add_argument("--plot", metavar="JSON", help="draw JSON's rows into a PNG beside it, run nothing")
    ap.add_argument("--merge", nargs="+", metavar="JSON", help="join these lanes' JSONs into --out")
    a = ap.parse_args()
    if a.plot:
        print(plot(Path(a.plot)))
        return
    if a.merge:
        if not a.out:
            ap.error("--merge needs --out")
        print(merge(Path(a.out), [Path(p) for p in a.merge]))
        return
    if not a.out:
        ap.error("--out is required")
    wanted = [n for n in a.only.split(",") if n] or list(LAYOUTS)
    if unknown := set(wanted) - LAYOUTS.keys():
        ap.error(f"--only: unknown {sorted(unknown)}; known: {sorted(LAYOUTS)}")
    from rlfleet.config.placement import visible_gpus

    have = len(visible_gpus())
    doc: dict[str, Any] = {
        "visible_gpus": have,
        "shape": a.shape,
        "steps": a.steps,
        "batch_per_gpu": a.batch_per_gpu,
        "max_async_level": a.max_async_level,
        "layouts": {},
        "rows": {},
    }
    with tempfile.TemporaryDirectory() as tmp:
        for name in wanted:
            entry: dict[str, Any] = {
                "gpus": LAYOUTS[name].gpus,
                "overrides": overrides(name, a.max_async_level),
            }
            doc["layouts"][name] = entry
            if LAYOUTS[name].gpus > have and not a.dry_run:
                entry["skipped"] = f"needs {LAYOUTS[name].gpus} GPUs, {have} visible"
                continue
            out = Path(tmp) / f"{name}.json"
            cmd = command(name, a, out)
            entry["command"] = shlex.join(cmd)
            if a.dry_run:
                print(entry["command"])
                continue
            done = subprocess.run(cmd, capture_output=True, text=True, check=False)
            entry["returncode"] = done.returncode
            if done.returncode == 0 and out.exists():
                result = json.loads(out.read_text())
                entry["result"] = result
                doc["device"] = result.get("env", {}).get("gpu", doc.get("device", ""))
                doc["rows"][name] = row(name, result["results"])
                with_efficiency(doc["rows"])
            else:  # a refusal names its fields on stderr
                entry["error"] = (done.stderr or done.stdout)[-2000:]
            dump(a.out, doc, indent=2)  # after each: a long run keeps what it has
    if a.dry_run:
        return
    dump(a.out, doc, indent=2)
    if doc["rows"]:
        print(plot(Path(a.out)))


if __name__ == "__main__":
    main()
