"""The chaos soak's end state (benchmarks/chaos.py), read from the run store and /proc alone.

A run that met random faults must look like one that met none: every step in the final model's
lineage exactly once with its own published rollout and batch, every checkpoint loadable, and no
process, port or lock of the run left behind.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TypedDict

import psutil

from rlfleet.procs import pid_alive
from rlfleet.store import RunDir, RunStore, layout
from rlfleet.trainer.checkpoint import optimizer_steps

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
