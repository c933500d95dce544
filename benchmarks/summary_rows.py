"""The pieces of a headline row of the benchmarks table (benchmarks/summarize.py): the row, the
result files it reads, and how their machines, dates and ratios are written."""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"


@dataclass
class Row:
    headline: str
    value: str
    peer: str
    ratio: str
    date: str
    machine: str
    command: str
    page: str  # the page under docs/ that tells more, with its anchor


def load(rel: str) -> dict[str, Any]:
    return json.loads((RESULTS / rel).read_text())


def machine(env: dict[str, Any] | None, fallback: str = "") -> str:
    if not env:
        return fallback
    if isinstance(env.get("machine"), str) and " " in env["machine"]:  # a described machine
        return env["machine"]
    gpu = (env.get("gpu") or "").replace("NVIDIA ", "").replace(" 80GB HBM3", "")
    cpus = env.get("cpus")
    if gpu:
        return f"1x {gpu}" + (f", {cpus} CPUs" if cpus else "")
    return f"{cpus}-core CPU" if cpus else fallback


def date(doc: dict[str, Any], fallback: str = "") -> str:
    d = doc.get("date") or (doc.get("env") or {}).get("date") or fallback
    return d.split(" ")[0]


def ratio(x: float) -> str:
    return f"**{x:.2f}x**"


def command(argv: Any) -> str:
    """A recorded command line, its output path elided (it named the GPU host's disk)."""
    if isinstance(argv, str):
        return argv
    args = list(argv)
    if "--out" in args:
        args[args.index("--out") + 1] = "..."
    return shlex.join(["python", *args] if args[0].endswith(".py") else args)
