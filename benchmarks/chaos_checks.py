"""What the chaos soak (benchmarks/chaos.py) reads and reports besides its schedule: the running
run (`RunView`: from its directory, its pidfiles and /proc, its parts' processes, its steps and the
moments a fault is timed to), its end state, and the report of what went in.

The end state is read from the run store and /proc alone. A run that met random faults must look
like one that met none: every step in the final model's lineage exactly once with its own published
rollout and batch, every checkpoint loadable, and no process, port or lock of the run left behind.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path
from typing import Any, TypedDict

import httpx
import psutil
from common import table
from faults import victim

from rlfleet.procs import pid_alive
from rlfleet.store import RunDir, RunStore, layout
from rlfleet.trainer.checkpoint import optimizer_steps
from rlfleet.weights.tickets import served_step

# ---------------------------------------------------------------- the running run


class RunView:
    def __init__(self, out: Path, port: int, max_steps: int):
        self.out, self.port, self.max_steps = out, port, max_steps
        self.store = RunStore(out)

    def names(self, kind: str, prefix: str) -> list[str]:
        """Entries of `<out>/<kind>/` starting with `prefix`: cheap enough to poll every 10 ms."""
        try:
            return [n for n in os.listdir(self.out / kind) if n.startswith(prefix)]
        except OSError:
            return []

    def steps_done(self) -> int:
        return len(self.names(layout.STEPS, "step_"))

    def stepped_since(self, t: float) -> bool:
        """A step record was written after wall time `t` (a new step, or one a rerun redid)."""
        steps = [
            s for n in self.names(layout.STEPS, "step_") if (s := layout.step_of(n, ".json")) is not None
        ]
        try:
            return bool(steps) and (self.out / layout.step_json(layout.STEPS, max(steps))).stat().st_mtime > t
        except OSError:
            return False

    def finished(self) -> bool:
        """The last step is trained and the summary written (whether every step has its record
        is for the end checks to say)."""
        last = self.out / layout.step_json(layout.METRICS, self.max_steps - 1)
        return last.exists() and self.store.exists(layout.SUMMARY)

    def part(self, part: str) -> psutil.Process | None:
        """The process of a part other than the controller (Prefect's server, the trainer or its
        guard, replica 0's guard, API server or engine core), None while it is not running."""
        try:
            if part == "prefect_server":
                pid = pid_alive(self.out / "run/prefect_server.pid")
                return None if pid is None else psutil.Process(pid)
            return victim(self.out, part)
        except (LookupError, psutil.Error):
            return None

    def started(self, part: str, p: psutil.Process) -> bool:
        """The trainer has its model (`TRAINER_UP` since it began); a replica answers /health."""
        if part == "trainer":
            up = self.out / layout.TRAINER_UP
            try:
                return up.exists() and json.loads(up.read_text())["at"] >= p.create_time()
            except (OSError, ValueError, KeyError):
                return False
        try:
            return httpx.get(f"http://127.0.0.1:{self.port}/health", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def loading(self) -> bool:
        """The newest published weights are not served yet: the broadcast is loading them."""
        steps = [s for n in self.names(layout.WEIGHTS, "step_") if (s := layout.step_of(n)) is not None]
        if (
            not steps
            or not (self.out / layout.step_dir(layout.WEIGHTS, max(steps)) / layout.MANIFEST).exists()
        ):
            return False
        try:
            served = served_step(self.store)
        except (OSError, ValueError):  # being rewritten
            return False
        return served is not None and max(steps) > served

    def checkpoints(self) -> list[int]:
        """Complete checkpoints: none yet, and a rerun resumes from the base model."""
        return self.store.complete_steps(layout.CHECKPOINTS)

    def checkpointing(self) -> bool:
        return bool(self.names(layout.CHECKPOINTS, ".tmp-step_"))

    def stall_dirs(self) -> list[Path]:
        return sorted((self.out / layout.STALLS).glob("*/summary.txt"))

    def leftovers(self) -> list[psutil.Process]:
        """What the run's pidfiles name alive (a dead controller's leftovers, for its rerun to reap)."""
        found = []
        for pidfile in (self.out / "run").glob("*.pid"):
            try:
                if (pid := pid_alive(pidfile)) is not None:
                    found.append(psutil.Process(pid))
            except psutil.Error:
                pass
        return found


# ---------------------------------------------------------------- the end state

TAG = "RLFLEET_CHAOS_RUN"  # in the controller's environment: every process of the run inherits it


class Check(TypedDict):
    name: str
    ok: bool
    detail: str


def check(name: str, problems: list[str], ok_detail: str = "") -> Check:
    return {"name": name, "ok": not problems, "detail": "; ".join(problems[:10]) or ok_detail}


def tagged(tag: str) -> list[psutil.Process]:
    """Every process on this box whose environment carries `TAG=tag`: the run's, wherever they
    were reparented (vLLM's parts, the trainer, Prefect's temporary server)."""
    needle = f"{TAG}={tag}".encode()
    found = []
    for pid in psutil.pids():
        if pid == os.getpid():
            continue
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:
            continue
        if needle in env.split(b"\0"):
            try:
                p = psutil.Process(pid)
                if p.status() != psutil.STATUS_ZOMBIE:
                    found.append(p)
            except psutil.Error:
                pass
    return found


def describe(p: psutil.Process) -> str:
    try:
        return f"{p.pid} (parent {p.ppid()}, {p.status()}): {' '.join(p.cmdline())[:120]}"
    except psutil.Error:
        return f"{p.pid} (gone)"


def lineage(store: RunStore, max_steps: int, max_staleness: int) -> list[Check]:
    """Every step 0..max_steps-1 once: its own rollout and batch (no extra step dirs, no sample in
    two steps), its metrics and step record; each checkpoint's optimizer has taken step+1 steps."""
    want = list(range(max_steps))
    problems = []
    for kind in (layout.ROLLOUTS, layout.BATCHES):
        if (got := store.complete_steps(kind)) != want:
            problems.append(f"{kind}: {_missing_extra(got, want)}")
        if extra := sorted(set(store.step_dirs(kind)) - set(want)):
            problems.append(f"{kind}: step dirs past the run {extra}")
    for kind in (layout.METRICS, layout.STEPS):
        if (got := store.json_steps(kind)) != want:
            problems.append(f"{kind}: {_missing_extra(got, want)}")
    seen: dict[str, int] = {}
    for s in store.complete_steps(layout.ROLLOUTS):
        m = store.manifest(layout.step_dir(layout.ROLLOUTS, s), verify=True)
        if m["step"] != s or not (s - 1 - max_staleness <= m["policy_step"] <= s - 1):
            problems.append(f"rollouts/step_{s}: step {m['step']}, policy_step {m['policy_step']}")
        for uid in m["group_uids"]:
            if uid in seen:
                problems.append(f"group {uid} in steps {seen[uid]} and {s}")
            seen[uid] = s
    for s in store.complete_steps(layout.BATCHES):
        m = store.manifest(layout.step_dir(layout.BATCHES, s), verify=True)
        if m["step"] != s:
            problems.append(f"batches/step_{s}: says step {m['step']}")
    checks = [check("every step once, its own rollout and batch", problems, f"{max_steps} steps")]

    problems, loaded = [], []
    ckpts = store.complete_steps(layout.CHECKPOINTS)
    if max_steps - 1 not in ckpts:
        problems.append(f"no final checkpoint (have {ckpts})")
    for c in ckpts:
        rel = layout.step_dir(layout.CHECKPOINTS, c)
        try:
            store.manifest(rel, verify=True)
            taken = optimizer_steps(store, rel)
            if taken != {c + 1}:
                problems.append(f"checkpoint {c}: optimizer steps {sorted(taken)}, not {c + 1}")
            _load_model(store.local_path(rel, layout.CHECKPOINT_MODEL))
            loaded.append(c)
        except Exception as e:  # noqa: BLE001 - a checkpoint that fails to load is the finding
            problems.append(f"checkpoint {c}: {type(e).__name__}: {e}")
    checks.append(check("every checkpoint loadable, its lineage once", problems, f"checkpoints {loaded}"))
    return checks


def _load_model(path: Path) -> None:
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging

    logging.disable_progress_bar()
    AutoModelForCausalLM.from_pretrained(str(path))


def _missing_extra(got: list[int], want: list[int]) -> str:
    return f"missing {sorted(set(want) - set(got))[:10]}, extra {sorted(set(got) - set(want))[:10]}"


def leftovers(out: Path, tag: str, ports: list[int], grace_s: float = 10.0) -> list[Check]:
    """No process of the run (waited on `grace_s`: exits follow the controller's as fast as signals
    travel), no listening socket on its ports, no pidfile naming a live process, no controller lock."""
    procs = tagged(tag)
    _, alive = psutil.wait_procs(procs, timeout=grace_s)
    checks = [check("no orphaned process", [describe(p) for p in alive], f"{len(procs)} exited at the end")]
    held = []
    for c in psutil.net_connections(kind="inet"):
        if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port in ports:
            held.append(f"port {c.laddr.port} held by pid {c.pid}")
    checks.append(check("no port left", held, f"ports {ports} free"))
    run = RunDir(out)
    locks = [f"{p.name} names live pid {pid}" for p in run.pidfiles() if (pid := pid_alive(p)) is not None]
    if run.pidfile("controller").exists():
        locks.append("run/controller.pid left")
    checks.append(check("no lock left", locks, "no live pidfile, no controller lock"))
    return checks


# ---------------------------------------------------------------- the report


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
