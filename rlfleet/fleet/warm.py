"""A fleet's warm trainer: a process that has paid a trainer's imports (torch, transformers, rlfleet's
trainer: ~5-10 s on 2 cores, the trainer's whole start on a GPU host once vLLM is warm) and waits, on
the fleet's trainer device, for one run's trainer job.

Once the fleet's replicas are up (the fleet writes `go`) it builds the fleet's base model as a
trainer with default settings would, runs the warm-up once and drops it (`precompile`), then writes
`ready`: the kernels load and the layers compile before any run, so a run's own build finds them in
dynamo's and inductor's caches (a fresh H200 host: 31 s of an attached run's step 0 otherwise). A
run with other settings compiles what differs, as a cold one does. Not before the replicas are up:
memory a trainer frees on their GPU while vLLM profiles it fails vLLM's start ("Error in memory
profiling").

A run on the fleet hands it its `trainer.toml` (`claim`). From then on the process is that run's
trainer: its own process group (the run stops it, a rerun's reap kills it by the run's pidfile),
the run's trainer log, and it exits with the job, or when the run's controller dies (as a trainer
the run started does, by PR_SET_PDEATHSIG). The fleet then starts a fresh one: no model, optimizer
or compiled graph passes from one run to the next (the precompiled graphs are the base model's,
traced before any run, and hold no weights).

On a GPU fleet the fleet starts the next warm process as soon as a run takes this one
(fleet/keeper.py), and it compiles beside the run on the same GPU: `ready` holds the GPU memory
this one's compile took, and the run's trainer sizes its micro-batches leaving that much free.

Files in `<fleet dir>/<name>/trainer/<slot>/`: `warm.json` (the waiting process: pid and start
time), `go` and `ready` (above), and `job.json` (a run's hand-off). The process takes the job by
renaming it to a name of its own, reads it, then renames it `claimed.json`: from then on it needs
nothing in the directory, which is the next warm process's."""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TypedDict

from rlfleet.fleet.attach import held_slot
from rlfleet.fleet.keeper import CLAIMED, GO, POLL_S, READY, WARM, Ready, spool
from rlfleet.fleet.state import fleet_dir, read_state, write_json_atomic
from rlfleet.procs import (
    ManagedProcess,
    kill_group,
    log_lines,
    redirect_output,
    running,
    this_process,
    wait_until,
    write_pidfile,
)

log = logging.getLogger("rlfleet.fleet")
JOB = "job.json"
CLAIM_TIMEOUT_S = 60.0  # a warm process still importing takes the job when its imports are done
CONTEXT_BYTES = 1 << 30  # a process's CUDA context and libraries, outside torch's allocator


class Job(TypedDict):
    config: str  # the run's trainer.toml
    log: str  # the run's trainer log
    exit_file: str  # where the process leaves its exit code for the run
    env: dict[str, str]
    controller: int  # the run's controller: the trainer goes when it goes
    controller_started: float


def serve_one(spool: Path, model: str | None = None, dtype: str = "float32") -> int:
    """The warm process: say where it is, pay the imports and the fleet model's compile, take one
    job, run it, exit with it."""
    write_json_atomic(spool / WARM, this_process())
    from rlfleet.config.loader import load
    from rlfleet.config.models import TrainerJobConfig
    from rlfleet.trainer.budget import leave_free
    from rlfleet.trainer.rl import run_trainer  # the imports a trainer pays, paid now

    while not (spool / GO).exists():  # the replicas sharing its GPU are up
        time.sleep(POLL_S)
    ready: Ready = {"gpu_bytes": None}
    if model is not None:
        try:
            seconds, ready["gpu_bytes"] = precompile(model, dtype)
            print(f"precompiled {model} ({dtype}) in {seconds:.1f} s", flush=True)
        except Exception as e:  # noqa: BLE001 - the run's trainer then compiles, as a cold one does
            print(f"precompile of {model} failed, the run's trainer compiles: {e!r}", flush=True)
    write_json_atomic(spool / READY, ready)
    job = _take(spool)
    os.setsid()  # out of the fleet's process group: the run's trainer now
    redirect_output(job["log"])  # the run's trainer log, as a trainer the run started writes
    os.environ.update(job["env"])
    threading.Thread(
        target=_die_with_controller, args=(job,), name="rlfleet-controller-watch", daemon=True
    ).start()
    log_lines()
    if ready["gpu_bytes"]:  # the fleet's next warm trainer compiles beside this run, on its GPU
        leave_free(ready["gpu_bytes"])
        log.info("leaving %.1f GiB of the GPU to the fleet's next warm trainer", ready["gpu_bytes"] / 2**30)
    code = 1
    try:  # what `rlfleet trainer @ trainer.toml` runs
        run_trainer(load(TrainerJobConfig, ["@", job["config"]]))
        code = 0
    finally:
        Path(job["exit_file"]).write_text(str(code))
    return code


def _take(spool: Path) -> Job:
    """Wait for a run's job and take it: once, atomically, and done with `spool` on return."""
    mine = spool / f"job.{os.getpid()}.json"
    while True:
        try:
            os.rename(spool / JOB, mine)
            break
        except FileNotFoundError:
            time.sleep(POLL_S)
    job: Job = json.loads(mine.read_text())
    os.rename(mine, spool / CLAIMED)
    return job


def precompile(model: str, dtype: str) -> tuple[float, int]:
    """Build `model` as a trainer with default settings does on this device, run its warm-up (one
    forward and backward: kernels, FSDP, compiled layers and LM head) and, on a GPU, make its
    checkpoint host copy once (pinned memory, which torch keeps for the run's trainer: a run on a
    fleet made it for 6.5 s before its step 0), then drop model, optimizer and process group.
    Returns the seconds and the GPU memory it took at its peak, this process's CUDA context
    counted (`CONTEXT_BYTES`), 0 on a CPU."""
    import gc

    import torch

    from rlfleet.config.model import ModelConfig
    from rlfleet.config.models import TrainerJobConfig
    from rlfleet.trainer.checkpoint import HostCopy, dcp_state
    from rlfleet.trainer.loop import build
    from rlfleet.trainer.parallel import teardown
    from rlfleet.trainer.train import init_optimizer_state, warm_up

    start = time.perf_counter()
    par, policy, optimizer = build(TrainerJobConfig(model=ModelConfig(path=model, dtype=dtype)), model)
    gpu = par.device.type == "cuda"
    try:
        warm_up(policy, par)
        if gpu and par.enabled:  # torch keeps the pinned chunks it frees for the run's checkpoint copy
            init_optimizer_state(optimizer)
            HostCopy(pinned=True).allocate(dcp_state(policy, optimizer))
        peak = torch.cuda.max_memory_reserved(par.device) + CONTEXT_BYTES if gpu else 0
    finally:
        del policy, optimizer
        teardown(par)
        gc.collect()
        if gpu:
            torch.cuda.empty_cache()
    return time.perf_counter() - start, peak


def _die_with_controller(job: Job) -> None:
    while running(job["controller"], job["controller_started"]):
        time.sleep(0.5)
    os.kill(os.getpid(), signal.SIGTERM)


@dataclass
class WarmTrainer(ManagedProcess):
    """A claimed warm trainer, as the run's `TrainerProcess` handles its own: not the run's child,
    so its liveness is by pid and start time, and its exit code is the one it left in `exit_file`."""

    warm_pid: int = 0
    started: float = 0.0
    exit_file: Path = Path()

    def start(self) -> WarmTrainer:
        raise TypeError("a warm trainer is claimed, not started")

    @property
    def pid(self) -> int | None:
        return self.warm_pid

    def alive(self) -> bool:
        return running(self.warm_pid, self.started)

    def returncode(self) -> int | None:
        if self.alive():
            return None
        try:
            return int(self.exit_file.read_text())
        except (OSError, ValueError):
            return -int(signal.SIGKILL)  # killed before it could say

    def stop(self, grace_s: float = 10.0) -> None:
        if self.alive():
            kill_group(self.warm_pid, grace_s)
            wait_until(lambda: not self.alive(), grace_s + 5, POLL_S, what="the warm trainer to exit")
        self.pidfile.unlink(missing_ok=True)


def claim(
    spool: Path, config: Path, log_path: Path, pidfile: Path, env: dict[str, str]
) -> WarmTrainer | None:
    """Hand the run's trainer job to the fleet's warm trainer; None when there is none to take it
    (none up, or it died first): the run starts its own."""
    try:
        warm = json.loads((spool / WARM).read_text())
    except (OSError, ValueError):
        return None
    if (spool / CLAIMED).exists() or not running(warm["pid"], warm["started"]):
        return None  # another run's trainer now, or gone: the fleet starts a fresh one after it
    exit_file = pidfile.with_suffix(".exit")
    exit_file.unlink(missing_ok=True)
    me = this_process()
    log_path.parent.mkdir(parents=True, exist_ok=True)
    job: Job = {
        "config": str(config),
        "log": str(log_path),
        "exit_file": str(exit_file),
        "env": env,
        "controller": int(me["pid"]),
        "controller_started": me["started"],
    }
    write_json_atomic(spool / JOB, job)
    try:
        wait_until(
            lambda: not (spool / JOB).exists(),
            CLAIM_TIMEOUT_S,
            POLL_S,
            what="the fleet's warm trainer to take the job",
            abort=lambda: None if running(warm["pid"], warm["started"]) else "it exited",
        )
    except (TimeoutError, RuntimeError):
        try:
            (spool / JOB).unlink()
            return None  # not taken: ours to start
        except FileNotFoundError:
            pass  # taken just now
    write_pidfile(pidfile, warm["pid"])
    return WarmTrainer(
        name="trainer",
        cmd=[],
        log_path=log_path,
        pidfile=pidfile,
        warm_pid=warm["pid"],
        started=warm["started"],
        exit_file=exit_file,
    )


def claim_from_fleet(
    fleet: str,
    output_dir: str,
    gpu_ids: list[str],
    config: Path,
    log_path: Path,
    pidfile: Path,
    env: dict[str, str],
) -> WarmTrainer | None:
    """`claim` the warm trainer beside the fleet replica this process holds for the run in
    `output_dir`, where it waits on the trainer's device."""
    state, slot = read_state(fleet), held_slot(fleet, output_dir)
    if state is None or not state.get("trainer") or slot is None:
        return None
    device = state["trainer_gpu_ids"][slot : slot + 1]
    if device != gpu_ids:
        log.info(
            "fleet %s's warm trainer %d is on %s, this run's trainer on %s: starting its own",
            fleet,
            slot,
            ",".join(device) or "the CPU",
            ",".join(gpu_ids) or "the CPU",
        )
        return None
    taken = claim(spool(fleet_dir() / fleet, "trainer", slot), config, log_path, pidfile, env)
    if taken is not None:
        log.info("trainer: fleet %s's warm trainer (pid %d) took the job", fleet, taken.warm_pid)
    return taken


if __name__ == "__main__":
    sys.exit(serve_one(Path(sys.argv[1]), *sys.argv[2:4]))
