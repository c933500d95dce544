"""Stacks of every process of a run, for a stall's directory (runs/stalls.py): `py-spy dump` of
each process under the ones rlfleet started (vLLM guards, API servers, engine cores; the trainer
and its ranks), and the controller's own threads from `sys._current_frames` (py-spy would need
to trace its own parent).

Each dump is bounded (`timeout_s`): a dump must not become the next thing that hangs. A frozen
process (SIGSTOP) cannot be paused for a consistent dump; py-spy then reads it without pausing
(`--nonblocking`), which for a process that does not run is just as consistent.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import threading
import traceback
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypedDict

import psutil


class RunProcess(TypedDict):
    party: str  # replica_0, trainer
    role: str  # guard, api_server, engine_core, trainer, rank, ...
    pid: int
    status: str  # psutil's: running, sleeping, disk-sleep, stopped, zombie; "gone" once it exited


def processes(roots: dict[str, int | None]) -> list[RunProcess]:
    """Each party's process (its guard, `rlfleet.guard`) and every descendant, from /proc."""
    out: list[RunProcess] = []
    for party, pid in roots.items():
        if pid is None:
            continue
        try:
            root = psutil.Process(pid)
            tree = [root, *root.children(recursive=True)]
        except psutil.Error:
            continue
        for p in tree:
            try:
                out.append({"party": party, "role": _role(p, root), "pid": p.pid, "status": p.status()})
            except psutil.Error:
                continue
    return out


def _role(p: psutil.Process, root: psutil.Process) -> str:
    if p.pid == root.pid:
        return "guard"
    name = p.name()
    if "EngineCore" in name:
        return "engine_core"
    parent = p.ppid() == root.pid
    if parent and "rlfleet.cli" in " ".join(p.cmdline()):
        return "trainer"
    if parent and "torch.distributed.run" in " ".join(p.cmdline()):
        return "torchrun"
    if parent:
        return "api_server"  # a replica's guard runs the server
    return re.sub(r"[^A-Za-z0-9_-]+", "-", name).strip("-") or "process"


def status(pid: int) -> str:
    try:
        return psutil.Process(pid).status()
    except psutil.Error:
        return "gone"


def py_spy() -> str | None:
    """The py-spy binary: beside this interpreter (a virtualenv's bin/), on PATH, else in the bin/
    of a `pip install --target` directory on sys.path (how a GPU machine without network gets it)."""
    here = Path(sys.executable).parent / "py-spy"
    if here.is_file():
        return str(here)
    if found := shutil.which("py-spy"):
        return found
    targets = (Path(entry) / "bin" / "py-spy" for entry in sys.path if entry)
    return next((str(p) for p in targets if p.is_file()), None)


def py_spy_dump(pid: int, timeout_s: float) -> str:
    """`py-spy dump --pid P`, then `--nonblocking` if that failed (a frozen process cannot be
    paused); what went wrong, when nothing worked."""
    exe = py_spy()
    if exe is None:
        return "py-spy is not installed (pip install py-spy)\n"
    errors = []
    for extra in ([], ["--nonblocking"]):
        try:
            done = subprocess.run(
                [exe, "dump", "--pid", str(pid), *extra], capture_output=True, text=True, timeout=timeout_s
            )
        except subprocess.TimeoutExpired:
            errors.append(f"py-spy dump {' '.join(extra)} timed out after {timeout_s:g} s")
            continue
        if done.returncode == 0:
            return done.stdout
        errors.append(f"py-spy dump {' '.join(extra)} exited {done.returncode}: {done.stderr.strip()[:500]}")
    return "\n".join(errors) + "\n"


def controller_threads() -> str:
    """This process's threads, named, innermost frame last (as `py-spy dump` lists them, reversed)."""
    names = {t.ident: t.name for t in threading.enumerate()}
    parts = []
    for ident, frame in sys._current_frames().items():
        stack = "".join(traceback.format_stack(frame))
        parts.append(f"Thread {ident} ({names.get(ident, '?')}):\n{stack}")
    return "\n".join(parts)


def dump_all(procs: list[RunProcess], timeout_s: float) -> dict[str, str]:
    """File stem -> dump, for every process (concurrently: each may take up to `timeout_s`) and
    the controller (`controller`)."""
    stems = [f"{p['party']}.{p['role']}.{p['pid']}" for p in procs]
    with ThreadPoolExecutor(max(len(procs), 1)) as ex:
        dumps = list(ex.map(lambda p: py_spy_dump(p["pid"], timeout_s), procs))
    return {"controller": controller_threads(), **dict(zip(stems, dumps, strict=True))}
