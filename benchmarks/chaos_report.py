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
    before_first_checkpoint: bool  # no complete checkpoint yet: the rerun resumes from the base model
    outcome: str | None  # a stop's: recovered, superseded, not_recovered


def fault_counts(faults: list[Fault]) -> dict[str, Any]:
    stops = [f for f in faults if f["signal"] == "SIGSTOP"]
    kills = [f for f in faults if f["signal"] == "SIGKILL"]
    return {
        "faults": len(faults),
        "sigkills": len(kills),
        "sigstops": len(stops),
        "faults_by_kind": dict(Counter(f["kind"] for f in faults)),
        "before_first_checkpoint": sum(bool(f.get("before_first_checkpoint")) for f in faults),
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
        + [["before the first checkpoint", doc["before_first_checkpoint"]]]
        + [["restarts", doc["restarts"]], ["steps", doc["steps"]]],
    )
    checks = doc["checks"]
    table("end-state checks", ["check", "ok", "detail"], [[c["name"], c["ok"], c["detail"]] for c in checks])


def combined(docs: list[dict[str, Any]]) -> dict[str, Any]:
    """The runs of one soak as one report: totals first, each run's own report under `runs`."""
    total = {k: sum(d[k] for d in docs) for k in ("duration_s", "faults", "sigkills", "sigstops", "restarts")}
    total |= {k: sum(d[k] for d in docs) for k in ("steps", "before_first_checkpoint", "stalls_written")}
    return {
        "seed": docs[0]["seed"],
        **total,
        "hangs": [h for d in docs for h in d["hangs"]],
        "checks_failed": [c for d in docs for c in d["checks"] if not c["ok"]],
        "passed": all(d["passed"] for d in docs),
        "runs": docs,
    }
