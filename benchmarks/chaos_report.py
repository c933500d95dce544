"""What the chaos soak (benchmarks/chaos.py) did, counted for its JSON report and its tables: each
fault as it went in, and the counts by kind, part, moment and outcome."""

from __future__ import annotations

from collections import Counter
from typing import Any, TypedDict

from common import table


class Fault(TypedDict):
    at_s: float  # since the soak began
    kind: str
    signal: str
    parts: list[str]
    pids: list[int]
    moment: str | None  # what was true when it went in ("missed": the moment did not come)
    step: int  # steps done at the time
    outcome: str | None  # a stop's: recovered, superseded, not_recovered


def fault_counts(faults: list[Fault]) -> dict[str, Any]:
    stops = [f for f in faults if f["signal"] == "SIGSTOP"]
    kills = [f for f in faults if f["signal"] == "SIGKILL"]
    return {
        "faults": len(faults),
        "sigkills": len(kills),
        "sigstops": len(stops),
        "faults_by_kind": dict(Counter(f["kind"] for f in faults)),
        "kills_by_part": dict(Counter(p for f in kills for p in f["parts"])),
        "stops_by_part": dict(Counter(p for f in stops for p in f["parts"])),
        "moments": dict(Counter(f"{f['kind']}: {f['moment']}" for f in faults if f["moment"])),
        "sigstop_outcomes": dict(Counter(f["outcome"] for f in stops)),
    }


def show(doc: dict[str, Any]) -> None:
    """The report's two tables: what went in, and the end-state checks."""
    table(
        f"chaos soak, seed {doc['seed']}: {doc['duration_s']:.0f} s, {doc['faults']} faults, {doc['restarts']} restarts",
        ["what", "count"],
        [[f"SIGKILL {k}", v] for k, v in sorted(doc["kills_by_part"].items())]
        + [[f"SIGSTOP {k}", v] for k, v in sorted(doc["stops_by_part"].items())]
        + [[f"SIGSTOP {k}", v] for k, v in sorted(doc["sigstop_outcomes"].items())]
        + [[f"fault kind {k}", v] for k, v in sorted(doc["faults_by_kind"].items())]
        + [["restarts", doc["restarts"]], ["steps", doc["steps"]]],
    )
    checks = doc["checks"]
    table("end-state checks", ["check", "ok", "detail"], [[c["name"], c["ok"], c["detail"]] for c in checks])
