"""The chaos soak (issue 55): one long `rlfleet rl` run of the tiny CPU job meets random faults at
random moments (SIGKILL of any part, SIGSTOP for the stall watchdog, kills during a weight load, a
checkpoint write or a rerun's reap, two parts at once), is restarted by the same command whenever
its controller is gone, and must end as if nothing had happened (benchmarks/chaos_checks.py: every
step once, checkpoints loadable, no orphan, port or lock left). docs/faults.md ("Chaos soak") says
what each fault is and when it comes; `KINDS` and `PARTS` below weigh them. The seed is printed
first; `--seed` replays the schedule. A controller that makes no step for `--hang-s` is a failure
(recorded, killed, restarted), and so are ten controllers in a row that exit with a failure by
themselves (both in the report's `hangs`).

    nice -n 19 python benchmarks/chaos.py --duration-s 2160 --max-steps 200 --gap-s 10 40 \
        --orchestrator.batch-size 8 --out benchmarks/results/chaos_cpu_2core.json

Other `--section.key value` arguments go to the run's command: on a GPU host
`--deployment.num-inference-gpus 1 --deployment.num-train-gpus 1` puts the job on one GPU.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import itertools
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import psutil
from chaos_checks import TAG, Check, Fault, RunView, combined, fault_counts, leftovers, lineage, show
from common import ROOT, free_port, rlfleet_cmd, tiny_model, write

from rlfleet.config.loader import load
from rlfleet.config.models import RLConfig
from rlfleet.procs import pid_alive
from rlfleet.runs.lock import reap_earlier_life
from rlfleet.store import RunStore

KINDS = {"kill": 40, "stop": 15, "weight_load": 10, "checkpoint_write": 10, "reap": 8, "two": 12}
# SIGKILL targets, by weight
PARTS = dict(
    controller=10, trainer=20, trainer_guard=5, guard=10, api_server=20, engine_core=20, prefect_server=10
)
STOPPABLE = ("trainer", "api_server", "engine_core")  # what the watchdog relaunches
EARLY_S = 15.0  # a life's first seconds: start-up, a resume's discards, step 0 of a fresh run
MOMENT_WAIT_S = 120.0  # a moment that does not come in this long: the fault goes in anyway
POLL_S = 0.01
FRUITLESS = 10  # controllers in a row that exit with a failure: the soak's finding


class Soak:
    def __init__(self, args: argparse.Namespace, cmd: list[str], out: Path, env: dict[str, str], port: int):
        self.a, self.cmd, self.out, self.env, self.port = args, cmd, out, env, port
        self.rng = random.Random(args.seed)
        self.view = RunView(out, port, args.max_steps)
        self.t0 = time.monotonic()
        self.faults: list[Fault] = []  # one per signal sent at once (a reap's two kills are two)
        self.injected = 0
        self.exits: list[int] = []  # each controller life's exit code
        self.hangs: list[str] = []
        self.stopped: list[tuple[Fault, psutil.Process, int, float]] = []  # fault, process, stalls, since
        self.log = open(out.parent / "controller.log", "ab")  # noqa: SIM115 - closed in run()
        self.proc: subprocess.Popen | None = None
        self.last_step, self.last_step_at = -1, time.monotonic()
        self.ended_at: int | None = None  # the step `--finish-steps` ended the run at
        self.early_at: float | None = None  # a fault due in this life's first seconds

    # -- the run --------------------------------------------------------------------------------
    def start(self) -> None:
        """Start a controller life; with `--early` odds its next fault lands in the life's first
        `EARLY_S` seconds, whatever it has done (a resume's own start is a moment too)."""
        if self.rng.random() < self.a.early:
            self.early_at = self.now() + self.rng.uniform(0, EARLY_S)
        self.log.write(f"\n=== chaos: controller start {len(self.exits)} at {self.now():.1f} s\n".encode())
        self.log.flush()
        self.proc = subprocess.Popen(
            self.cmd,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            cwd=ROOT,
            env=self.env,
        )
        self.last_step_at = time.monotonic()

    def now(self) -> float:
        return time.monotonic() - self.t0

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def tick(self) -> bool:
        """Restart a gone controller, watch stops and hangs; False once the run has ended."""
        self.watch_stops()
        if self.alive():
            if (s := self.view.steps_done()) != self.last_step:
                self.last_step, self.last_step_at = s, time.monotonic()
            elif time.monotonic() - self.last_step_at > self.a.hang_s:
                self.hangs.append(f"no step for {self.a.hang_s:.0f} s at step {s} ({self.now():.0f} s)")
                print(f"chaos: HANG {self.hangs[-1]}; killing the controller", flush=True)
                self.proc.kill()
                self.proc.wait()
            return True
        rc = self.proc.wait()
        self.exits.append(rc)
        if rc == 0 and self.view.finished():
            return False
        if len(self.exits) > self.a.max_restarts:
            raise RuntimeError(f"{len(self.exits)} controller exits: giving up")
        # controllers that fail on their own, again and again, are a failure too (a port a dead
        # life left held made every rerun exit 2 in the CPU soak): recorded once per streak
        streak = len(list(itertools.takewhile(lambda rc: rc > 0, reversed(self.exits))))
        if streak == FRUITLESS:
            self.hangs.append(f"{streak} controllers in a row exited {rc} ({self.now():.0f} s)")
            print(f"chaos: {self.hangs[-1]}", flush=True)
        self.start()
        return True

    # -- faults ---------------------------------------------------------------------------------
    def pick(self, weights: dict[str, int]) -> str:
        names = list(weights)
        return self.rng.choices(names, [weights[n] for n in names])[0]

    def process(self, part: str) -> psutil.Process | None:
        if part != "controller":
            return self.view.part(part)
        return psutil.Process(self.proc.pid) if self.alive() else None

    def inject(self, controller_ok: bool = True) -> bool:
        """One fault of a random kind (`--kinds`: the next of that list); False if its part was not
        running (between a death and its relaunch): it is tried again. Without `controller_ok`
        (no step since the last fault) the controller is spared: its restart takes minutes on a
        loaded box, and kills of it alone kept the run restarting for half an hour."""
        before = len(self.faults)
        kinds = self.a.kinds
        kind = kinds[self.injected % len(kinds)] if kinds else self.pick(KINDS)
        parts = {p: w for p, w in PARTS.items() if controller_ok or p != "controller"}
        ours = (lambda ps: ps) if controller_ok else (lambda ps: [p for p in ps if p != "controller"])
        if kind == "stop":
            self.stop()
        elif kind == "weight_load":
            self.at_moment(kind, self.view.loading, ours(["api_server", "engine_core", "controller"]))
        elif kind == "checkpoint_write":
            self.at_moment(kind, self.view.checkpointing, ours(["trainer", "controller"]))
        elif kind == "reap":
            if controller_ok:
                self.reap()
        elif kind == "two":  # of the parts running now
            running = {p: w for p, w in parts.items() if self.process(p) is not None}
            if len(running) >= 2:
                first = self.pick(running)
                self.kill(kind, [first, self.pick({p: w for p, w in running.items() if p != first})])
        else:
            self.kill(kind, [self.pick(parts)])
        self.injected += len(self.faults) > before
        return len(self.faults) > before

    def record(
        self, kind: str, sig: str, parts: list[str], procs: list[psutil.Process], moment=None
    ) -> Fault:
        f: Fault = {
            "at_s": round(self.now(), 2),
            "kind": kind,
            "signal": sig,
            "parts": parts,
            "pids": [p.pid for p in procs],
            "moment": moment,
            "step": self.view.steps_done(),
            "before_first_checkpoint": not self.view.checkpoints(),
            "outcome": None,
        }
        self.faults.append(f)
        print(
            f"chaos: {f['at_s']:8.1f} s step {f['step']:4d} {kind} {sig} {'+'.join(parts)} {moment or ''}",
            flush=True,
        )
        return f

    def kill(self, kind: str, parts: list[str], moment: str | None = None) -> Fault | None:
        found = [(part, p) for part in parts if (p := self.process(part)) is not None]
        if not found:
            return None
        for _, p in found:
            with contextlib.suppress(psutil.Error):
                p.send_signal(signal.SIGKILL)
        return self.record(kind, "SIGKILL", [part for part, _ in found], [p for _, p in found], moment)

    def stop(self) -> None:
        """SIGSTOP a part past its start: one frozen while starting is bounded by its start-up
        timeout (`inference.startup_timeout_s`, the trainer's), not by the stall watchdog."""
        part = self.rng.choice(STOPPABLE)
        p = self.process(part)
        try:
            if p is None or not self.view.started(part, p) or p.status() == psutil.STATUS_STOPPED:
                return
        except psutil.Error:
            return
        stalls = len(self.view.stall_dirs())
        try:
            p.send_signal(signal.SIGSTOP)
        except psutil.Error:
            return
        f = self.record("stop", "SIGSTOP", [part], [p])
        self.stopped.append((f, p, stalls, time.monotonic()))

    def watch_stops(self) -> None:
        """A stop is recovered when its process is gone and the watchdog wrote a stall since; one
        whose process died otherwise (its controller's death took it) is superseded."""
        limit = 4 * self.a.stall_timeout_s + 120
        for entry in list(self.stopped):
            f, p, stalls, since = entry
            try:
                gone = p.status() == psutil.STATUS_ZOMBIE
            except psutil.Error:
                gone = True
            if gone:
                f["outcome"] = "recovered" if len(self.view.stall_dirs()) > stalls else "superseded"
            elif time.monotonic() - since > limit:
                f["outcome"] = "not_recovered"
                print(f"chaos: stop of {f['parts']} not recovered in {limit:.0f} s; killing it", flush=True)
                p.send_signal(signal.SIGKILL)
            else:
                continue
            self.stopped.remove(entry)

    def at_moment(self, kind: str, moment, parts: list[str]) -> None:
        """SIGKILL a part of `parts` once `moment()` is true (polled every 10 ms), or at the wait's end."""
        part = self.rng.choice(parts)
        deadline = time.monotonic() + MOMENT_WAIT_S
        while self.alive() and time.monotonic() < deadline:
            if moment():
                self.kill(kind, [part], kind)
                return
            time.sleep(POLL_S)
        if self.alive():
            self.kill(kind, [part], "missed")

    def reap(self) -> None:
        """Kill the controller, restart it, and kill the rerun as the first leftover of the dead
        life exits (the rerun's reap took it) or, with none, once the rerun holds the run's lock."""
        if self.kill("reap", ["controller"]) is None:
            return
        self.exits.append(self.proc.wait())
        left = self.view.leftovers()
        self.start()
        lock = self.out / "run/controller.pid"
        deadline = time.monotonic() + MOMENT_WAIT_S
        while self.alive() and time.monotonic() < deadline:
            if (left and any(not p.is_running() for p in left)) or (
                not left and pid_alive(lock) == self.proc.pid
            ):
                self.kill("reap", ["controller"], f"rerun reaping ({len(left)} leftovers)")
                return
            time.sleep(POLL_S)

    def run(self) -> None:
        """Each fault waits for its random gap and for a step since the last one, or
        `--max-wait-s`: faults faster than a restart (1-2 min here) would keep the run from ever
        stepping, and a loaded box from ever being faulted."""
        self.start()
        next_at, last = self.rng.uniform(0, self.a.gap_s[1]), time.time()  # the run's first seconds too
        try:
            while self.tick():
                injecting = self.now() < self.a.duration_s and len(self.faults) < self.a.max_faults
                stepped = self.view.stepped_since(last)
                ready = stepped or time.time() - last > self.a.max_wait_s or not self.faults
                early = self.early_at is not None and self.now() >= self.early_at
                if not injecting and self.a.finish_steps and self.ended_at is None:
                    self.end_within(self.a.finish_steps)
                if injecting and self.alive() and (early or (self.now() >= next_at and ready)):
                    self.early_at = None
                    # the controller is spared only right after its own kill with no step since:
                    # kills of it alone, each before a restart could step, kept the run at a standstill
                    done = self.inject(controller_ok=stepped or not self.killed_controller())
                    next_at = self.now() + (self.rng.uniform(*self.a.gap_s) if done else 0.5)
                    last = time.time() if done else last
                time.sleep(0.2)
        finally:
            for f, p, _, _ in self.stopped:  # never leave a frozen process behind
                f["outcome"] = f["outcome"] or "not_recovered"
                with contextlib.suppress(psutil.Error):
                    p.send_signal(signal.SIGKILL)
            if self.alive():
                self.proc.kill()
            self.log.close()

    def killed_controller(self) -> bool:
        """Whether the last fault killed the controller."""
        return bool(self.faults) and "controller" in self.faults[-1]["parts"]

    def end_within(self, steps: int) -> None:
        """End the run `steps` steps from here (`--finish-steps`): its controller is SIGKILLed once
        more (not a fault: the soak's own) and restarted with the nearer `--max-steps`, so that a
        soak of fixed length ends on time whatever pace the faults left the run."""
        done = self.view.steps_done()
        self.ended_at = min(self.a.max_steps, done + steps)
        if self.ended_at == self.a.max_steps:
            return
        self.a.max_steps = self.view.max_steps = self.ended_at
        self.cmd[self.cmd.index("--max-steps") + 1] = str(self.ended_at)
        print(f"chaos: faults over at step {done}: the run ends at step {self.ended_at}", flush=True)
        if self.alive():
            self.proc.kill()  # tick() restarts it with the new end

    def report(self, checks: list[Check]) -> dict[str, Any]:
        return {
            "seed": self.a.seed,
            "duration_s": round(self.now(), 1),
            "injecting_s": self.a.duration_s,
            "max_steps": self.a.max_steps,
            "ended_by_soak": self.ended_at is not None,
            "steps": self.view.steps_done(),
            **fault_counts(self.faults),
            "restarts": len(self.exits) - 1,
            "controller_exits": dict(Counter(str(rc) for rc in self.exits)),
            "hangs": self.hangs,
            "stalls_written": len(self.view.stall_dirs()),
            "checks": checks,
            "passed": all(c["ok"] for c in checks) and not self.hangs,
            "fault_log": self.faults,
        }


class Interrupted(Exception):
    """SIGTERM to the soak (a background job ignores SIGINT): stop, then check and report."""


def interrupted(signum: int, frame: object) -> None:
    raise Interrupted(f"signal {signum}")


def main() -> None:
    signal.signal(signal.SIGTERM, interrupted)
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed", type=int, default=None, help="the fault schedule's seed (printed; replays it)")
    ap.add_argument(
        "--duration-s", type=float, default=7200, help="inject faults this long, then let the run end"
    )
    ap.add_argument("--max-steps", type=int, default=3000)
    ap.add_argument(
        "--finish-steps",
        type=int,
        default=None,
        help="once faults are over, end the run this many steps later (default: at --max-steps)",
    )
    ap.add_argument("--max-faults", type=int, default=10**9)
    ap.add_argument(
        "--kinds",
        type=lambda v: v.split(","),
        default=None,
        help=f"faults in this order, cycled (of {list(KINDS)})",
    )
    ap.add_argument("--gap-s", type=float, nargs=2, default=(20.0, 80.0), help="random gap between faults")
    ap.add_argument(
        "--max-wait-s", type=float, default=60.0, help="a fault waits this long at most for a step"
    )
    ap.add_argument(
        "--early",
        type=float,
        default=0.25,
        help="odds that a controller life's next fault is in its first seconds",
    )
    ap.add_argument("--stall-timeout-s", type=float, default=20.0, help="the run's faults.stall_timeout_s")
    ap.add_argument("--hang-s", type=float, default=600.0, help="no step this long: a hang (a failure)")
    ap.add_argument("--max-restarts", type=int, default=10_000)
    ap.add_argument("--runs", type=int, default=1, help="runs one after the other, splitting --duration-s")
    ap.add_argument("--workdir", help="where the run, its model and logs go (default: a new temp dir)")
    ap.add_argument("--out", required=True)
    a, overrides = ap.parse_known_args()
    if a.kinds and (unknown := set(a.kinds) - set(KINDS)):
        ap.error(f"--kinds: unknown {sorted(unknown)}; known: {list(KINDS)}")
    a.seed = random.randrange(2**32) if a.seed is None else a.seed
    print(f"chaos: seed {a.seed}", flush=True)
    work = Path(a.workdir or tempfile.mkdtemp(prefix="rlfleet-chaos-"))
    work.mkdir(parents=True, exist_ok=True)
    model = tiny_model(work)
    docs = []
    for i in range(a.runs):  # one after the other, each with its own first steps to fault
        one = copy.copy(a)
        one.seed, one.duration_s = a.seed + i, a.duration_s / a.runs
        docs.append(soak_one(one, work / f"run{i}" if a.runs > 1 else work, model, overrides))
        show(docs[-1])
        doc = docs[0] if a.runs == 1 else combined(docs)
        write(a.out, doc)  # after each run: a soak cut short keeps the runs it finished
    sys.exit(0 if doc["passed"] else 1)


def soak_one(a: argparse.Namespace, base: Path, model: Path, overrides: list[str]) -> dict[str, Any]:
    """One run under faults from start to end, then its end-state checks."""
    base.mkdir(parents=True, exist_ok=True)
    out, port = base / "run", free_port()
    args = [
        "@", str(ROOT / "examples/tiny/rl.toml"),
        "--model.path", str(model),
        "--output-dir", str(out),
        "--max-steps", str(a.max_steps),
        "--inference.port", str(port),
        "--tasks.retries", "3",
        "--faults.stall-timeout-s", str(a.stall_timeout_s),
        "--wandb.mode", "disabled",
        *overrides,
    ]  # fmt: skip
    cfg = load(RLConfig, args)  # a bad override fails here
    cmd = rlfleet_cmd("rl", *args)
    tag = uuid.uuid4().hex
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}  # its own temporary server
    env |= {TAG: tag, "PREFECT_HOME": str(base / "prefect"), "PYTHONUNBUFFERED": "1"}
    print(f"chaos: run {out}, log {base / 'controller.log'}", flush=True)
    soak = Soak(a, cmd, out, env, port)
    error = None
    try:
        soak.run()
    except Exception as e:  # noqa: BLE001 - the report says how the soak ended
        error = repr(e)
    store = RunStore(out)
    ports = [port + i for i in range(cfg.inference.num_replicas)]
    checks = leftovers(out, tag, ports) + lineage(store, a.max_steps, cfg.orchestrator.max_staleness)
    doc = soak.report(checks) | {"command": cmd, "workdir": str(base), "error": error}
    doc["passed"] = doc["passed"] and error is None
    if error is not None:  # the soak killed its controller: what a rerun would reap goes now
        reap_earlier_life(str(out))
    return doc


if __name__ == "__main__":
    main()
