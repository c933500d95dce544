"""What each fault costs a running job: seen after, recovered after, tokens kept or sampled again,
and whether every step ran once (issue 42's table; docs/faults.md).

Each fault gets its own `rlfleet rl` run (the CLI, as a user starts it: real vLLM, the real
trainer, Prefect's ephemeral API), killed with SIGKILL once step 1 is trained and samples of the
next step are streaming with tokens. On a CPU box: the tiny model with long samples (up to 400
tokens; its EOS is one token in 128). On GPUs (`--device cuda`): benchmarks/long_tail.py's job (a),
the 0.5B shape with samples up to 4,096 tokens, async (k = 1), each run on its own `--gpus-per-run`
GPUs with its own ports and Prefect home, side by side while GPUs are free.

- `api_server`, `engine_core`, `guard`: a part of vLLM replica 0 (the guard is the process rlfleet
  starts; the API server its child; the engine core the server's child).
- `trainer`: the trainer process (the guard's child), mid-step: once the next step's batches are
  published and before its metrics (between steps a trainer's own watch relaunches it).
- `trainer_rank`: the last rank of a trainer on several GPUs (torchrun's last worker), mid-step as
  `trainer`: torchrun tears the group down and the trainer is relaunched from its checkpoint.
- `controller`: `rlfleet rl` itself, then the same command again (a rerun resumes).

seen: kill -> the controller's log line naming it (the pool's "is dead", the train task's
"trainer exited"); for the controller, the rerun's start. recovered: kill -> the next step's
metrics. Tokens in flight are read from the run's log of samples in flight (buffer/partials/)
just after the kill; kept = tokens a trained sample continued from (`turns[0].resumed`); sampled
again = a trained sample's tokens it did not continue from; dropped = a sample never trained (its
group dropped as stale).

    python benchmarks/faults.py --out benchmarks/results/faults_cpu_2core.json
    python benchmarks/faults.py --device cuda --faults api_server,trainer,controller \
        --out benchmarks/results/faults_h100_05b_cuda_ipc.json                      # one GPU a run
    python benchmarks/faults.py --device cuda --gpus-per-run 2 --weights.transport nccl \
        --faults api_server,trainer,controller --out benchmarks/results/faults_h100x2_05b_nccl.json

Other `--section.key value` arguments override every run's job.
"""

from __future__ import annotations

import argparse
import os
import queue
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import psutil
from common import ROOT, Runs, exit_on_sigterm, free_port, rl_config, rlfleet_cmd, table, tiny_model, write

from rlfleet.config.loader import load, to_toml
from rlfleet.config.models import RLConfig
from rlfleet.config.placement import visible_gpus
from rlfleet.orchestrator.partials import read_partials
from rlfleet.orchestrator.rollout import read_rollout
from rlfleet.procs import pid_alive
from rlfleet.store import RunStore, layout

FAULTS = ("api_server", "engine_core", "guard", "trainer", "trainer_rank", "controller")
RUNS = Runs()  # every run this harness started, ended with it
SEEN = {"api_server": "is dead", "engine_core": "is dead", "guard": "is dead"} | dict.fromkeys(
    ("trainer", "trainer_rank"), "trainer exited"
)
MID_STEP = ("trainer", "trainer_rank")  # killed while a step trains, not between steps
# what every run of a fault needs beyond its job: a checkpoint each step (a relaunched trainer
# resumes from the last), retries for the tasks a kill fails
FAULT_ARGS = ["--trainer.checkpoint-interval", "1", "--tasks.retries", "2"]


def steps_for(kills: int) -> int:
    """Kill i comes once step 1 + 2i is trained; each kill then has a step to recover in and one after."""
    return 2 * kills + 2


def cpu_job(tmp: Path, overrides: list[str]) -> Callable[[Path, int], RLConfig]:
    """The tiny model's job with samples up to 400 tokens, as a run's config by its output dir."""
    args = [
        "--orchestrator.batch-size", "4",
        "--orchestrator.group-size", "4",
        "--orchestrator.max-tokens", "400",
        "--orchestrator.micro-batch-size", "16",
        "--inference.max-model-len", "512",
    ]  # fmt: skip
    model = tiny_model(tmp)
    return lambda out, steps: rl_config(model, out, *args, *FAULT_ARGS, "--max-steps", str(steps), *overrides)


def cuda_job(tmp: Path, overrides: list[str]) -> Callable[[Path, int], RLConfig]:
    """long_tail.py's job (a) at the 0.5B shape, async (k = 1), with ports of its own per run."""
    from long_tail import DEFAULTS, prepare_model, write_job
    from vs_trl import SHAPES

    d = DEFAULTS["cuda"]
    shape = SHAPES["05b"] | {"dtype": "bfloat16"}
    model, _ = prepare_model(tmp, shape, d["max_model_len"], d["max_tokens"], None)
    task = [{"type": "repeat", "args": {"per": "completion"}}]
    job = write_job(SimpleNamespace(device="cuda"), d, model, task, tmp / "job.toml")
    args = ["@", str(job), "--orchestrator.max-async-level", "1", *FAULT_ARGS, *overrides]

    def config(out: Path, steps: int) -> RLConfig:
        ports = ["--inference.port", str(free_port()), "--weights.nccl-port", str(free_port())]
        return load(RLConfig, [*args, "--output-dir", str(out), "--max-steps", str(steps), *ports])

    return config


def victim(out: Path, fault: str) -> psutil.Process:
    """The process of `fault` (a part of the trainer or of vLLM replica 0) in the run at `out`;
    LookupError while it is not running (between a death and its relaunch)."""

    def only(procs: list[psutil.Process], what: str) -> psutil.Process:
        if len(procs) != 1:
            raise LookupError(f"{what}: {len(procs)} processes")
        return procs[0]

    def leader(pidfile: str) -> psutil.Process:
        pid = pid_alive(out / "run" / pidfile)
        if pid is None:  # psutil.Process(None) would be this very process
            raise LookupError(f"run/{pidfile} names no live process")
        return psutil.Process(pid)

    try:
        if fault in ("trainer", "trainer_guard", "trainer_rank"):
            guard = leader("trainer.pid")
            if fault == "trainer_guard":
                return guard
            trainer = only(guard.children(), "trainer")
            if fault == "trainer_rank":  # torchrun's workers, started in rank order
                ranks = sorted(trainer.children(), key=lambda p: (p.create_time(), p.pid))
                if len(ranks) < 2:
                    raise LookupError(f"trainer_rank: {len(ranks)} rank(s) under the trainer")
                return ranks[-1]
            return trainer
        guard = leader("inference_0.pid")
        if fault == "guard":
            return guard
        server = only(guard.children(), "api_server")
        if fault == "api_server":
            return server
        return only([c for c in server.children() if "EngineCore" in c.name()], "engine_core")
    except psutil.Error as e:
        raise LookupError(f"{fault}: {e}") from e


def in_flight(store: RunStore) -> dict[str, list[int]]:
    """Sample id -> the tokens it has streamed (as flushed to the log), of the groups not finished."""
    done = {layout.group_uid(p) for p in store.fs.glob(store.path(layout.buffered_group("*")))}
    for s in store.complete_steps(layout.ROLLOUTS):
        done |= set(store.manifest(layout.step_dir(layout.ROLLOUTS, s))["group_uids"])
    return {
        f"{p.group}/{i}": list(s.completion_ids)
        for p in read_partials(store).values()
        if p.group not in done
        for i, s in enumerate(p.samples)
    }


def continues(record: dict, ids: list[int]) -> bool:
    start = record["prompt_len"]
    return bool(ids) and record["input_ids"][start : start + len(ids)] == ids


def streaming_after(step: int, store: RunStore, out: Path) -> bool:
    return (out / layout.step_json("metrics", step)).exists() and any(
        len(ids) >= 16 for ids in in_flight(store).values()
    )


def training(step: int, store: RunStore, out: Path) -> bool:
    """The trainer is inside `step`: its batches are published, its metrics not yet written."""
    return (
        step in store.complete_steps(layout.BATCHES)
        and not (out / layout.step_json("metrics", step)).exists()
    )


def wait(pred, proc: subprocess.Popen, timeout_s: float = 900) -> None:
    deadline = time.monotonic() + timeout_s
    while not pred():
        if proc.poll() is not None:
            raise RuntimeError(f"the run exited ({proc.returncode}) before the kill")
        if time.monotonic() > deadline:
            raise TimeoutError("no kill point")
        time.sleep(0.02)


def first_step_after(out: Path, t: float, after: int, steps: int) -> tuple[int, float] | None:
    """The first step past `after` whose metrics came after time `t` (a replayed step is not one)."""
    done = [
        (s, m)
        for s in range(after + 1, steps)
        if (p := out / layout.step_json("metrics", s)).exists() and (m := p.stat().st_mtime) > t
    ]
    return min(done, key=lambda x: x[1]) if done else None


def one(
    spec: str, config: Callable[[Path, int], RLConfig], tmp: Path, gpus: list[str]
) -> list[dict[str, Any]]:
    """One run killed in turn by each fault of `spec` ("api_server+trainer+controller"): a row each."""
    faults, name = spec.split("+"), spec.replace("+", "_")
    steps = steps_for(len(faults))
    out = tmp / name
    cfg_file = tmp / f"{name}.toml"
    cfg_file.write_text(to_toml(config(out, steps)))
    cmd = rlfleet_cmd("rl", "@", str(cfg_file))
    # side by side runs: each its own GPUs and Prefect home (its own temporary API server and database)
    env = dict(os.environ, PREFECT_HOME=str(tmp / f"{name}_prefect"), PYTHONUNBUFFERED="1")
    if gpus:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(gpus)
    log_path = tmp / f"{name}.log"
    store = RunStore(out)
    kills: list[dict[str, Any]] = []
    with open(log_path, "w") as log:

        def start() -> subprocess.Popen:
            return RUNS.start(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, env=env)

        proc = start()
        for i, fault in enumerate(faults):
            wait(lambda step=1 + 2 * i: streaming_after(step, store, out), proc)
            if fault in MID_STEP:
                wait(lambda step=2 + 2 * i: training(step, store, out), proc)
            part = proc if fault == "controller" else victim(out, fault)
            logged = log_path.stat().st_size  # this kill's mark is looked for after here
            os.kill(part.pid, signal.SIGKILL)
            killed = time.time()
            tokens_at_kill = in_flight(store)
            seen = None
            if fault == "controller":
                proc.wait()
                proc = start()
                seen = time.time()
            else:
                while seen is None and proc.poll() is None:
                    with open(log_path, errors="replace") as f:
                        f.seek(logged)
                        if SEEN[fault] in f.read():
                            seen = time.time()
                    time.sleep(0.05)
            kills.append(
                {"fault": fault, "after": 1 + 2 * i, "killed": killed, "seen": seen, "tokens": tokens_at_kill}
            )
        rc = proc.wait()
    trained: dict[str, dict] = {}
    steps_of: dict[str, list[int]] = {}
    for s in range(steps):
        for r in read_rollout(store, s):
            trained[r["sample_id"]] = r
            steps_of.setdefault(r["sample_id"], []).append(s)
    once = all(len(v) == 1 for v in steps_of.values()) and all(
        (out / layout.step_json("metrics", s)).exists() for s in range(steps)
    )
    stream = last_stream(store)  # the last life's stream counts: what its resume dropped or continued
    rows = []
    for k in kills:
        # kept: the trained sample starts with the tokens it had streamed (continued on another
        # request after a replica died, `resent`; or by the rerun, `resumed`), else sampled again
        at_kill = k["tokens"]
        kept = sum(
            len(ids) for sid, ids in at_kill.items() if sid in trained and continues(trained[sid], ids)
        )
        streamed = sum(map(len, at_kill.values()))
        # a sample never trained left with its group: dropped as stale or held aside
        dropped = sum(len(ids) for sid, ids in at_kill.items() if sid not in trained)
        next_step = first_step_after(out, k["killed"], k["after"], steps)
        rows.append({
            "fault": k["fault"],
            "run": name,
            "gpus": gpus,
            "steps": steps,
            "exit_code": rc,
            "seen_after_s": None if k["seen"] is None else round(k["seen"] - k["killed"], 2),
            "recovered_after_s": None if next_step is None else round(next_step[1] - k["killed"], 2),
            "next_step": None if next_step is None else next_step[0],
            "samples_in_flight": len(at_kill),
            "tokens_in_flight": streamed,
            "tokens_kept": kept,
            "tokens_sampled_again": streamed - kept - dropped,
            "tokens_dropped": dropped,
            "every_step_once": once,
            "stream": stream,
            "log": str(log_path),
        })  # fmt: skip
    return rows


def last_stream(store: RunStore) -> dict[str, int] | None:
    """The stream's counts in the last published rollout (its life's: a rerun starts them again)."""
    steps = store.complete_steps(layout.ROLLOUTS)
    return store.manifest(layout.step_dir(layout.ROLLOUTS, max(steps))).get("stream") if steps else None


def gpu_groups(per_run: int) -> list[list[str]]:
    """The visible GPUs cut into disjoint groups of `per_run`; [[]] on a CPU box (one run at a time)."""
    gpus = visible_gpus()
    if not per_run:
        return [[]]
    if len(gpus) < per_run:
        raise SystemExit(f"--gpus-per-run {per_run}: only {len(gpus)} GPU(s) visible")
    return [gpus[i : i + per_run] for i in range(0, len(gpus) - per_run + 1, per_run)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--gpus-per-run", type=int, default=1, help="GPUs each run gets (--device cuda)")
    ap.add_argument(
        "--faults",
        default=",".join(f for f in FAULTS if f != "trainer_rank"),
        help='one run each; "a+b+c": one run killed by each in turn',
    )
    ap.add_argument("--keep", help="copy every run's log into this directory")
    ap.add_argument("--out", required=True)
    a, overrides = ap.parse_known_args()
    exit_on_sigterm()
    specs = a.faults.split(",")
    if unknown := {f for spec in specs for f in spec.split("+")} - set(FAULTS):
        ap.error(f"--faults: unknown {sorted(unknown)}; known: {list(FAULTS)}")
    tmp = Path(tempfile.mkdtemp(prefix="rlfleet-faults-"))
    config = (cuda_job if a.device == "cuda" else cpu_job)(tmp, overrides)
    config(tmp / "check", 1)  # a bad override fails here, before any run
    free: queue.Queue[list[str]] = queue.Queue()
    for g in gpu_groups(a.gpus_per_run if a.device == "cuda" else 0):
        free.put(g)
    rows: dict[str, list[dict[str, Any]]] = {}
    doc: dict[str, Any] = {"device": a.device, "overrides": overrides, "faults": []}

    def run(spec: str) -> None:
        gpus, log = free.get(), tmp / f"{spec.replace('+', '_')}.log"
        try:
            rows[spec] = one(spec, config, tmp, gpus)
        except Exception as e:  # noqa: BLE001 -- one run's failure is its row; the others go on
            rows[spec] = [{"fault": spec, "gpus": gpus, "error": repr(e), "log": str(log)}]
        finally:
            free.put(gpus)
            doc["faults"] = [r for s in specs for r in rows.get(s, [])]
            write(a.out, doc)
            if a.keep and log.exists():
                Path(a.keep).mkdir(parents=True, exist_ok=True)
                (Path(a.keep) / log.name).write_bytes(log.read_bytes())

    pool = ThreadPoolExecutor(max_workers=free.qsize())
    try:
        list(pool.map(run, specs))
    finally:  # cut (SIGTERM, ^C): end the runs, then each worker writes its row and keeps its log
        RUNS.stop()
        pool.shutdown()
    cols = [
        "fault",
        "seen_after_s",
        "recovered_after_s",
        "tokens_in_flight",
        "tokens_kept",
        "tokens_dropped",
        "every_step_once",
    ]
    title = f"SIGKILL mid-generation ({'0.5B long-tail job, GPU' if a.device == 'cuda' else 'tiny model, vLLM-CPU'})"
    table(title, cols, [[r.get(c) for c in cols] for r in doc["faults"]])


if __name__ == "__main__":
    main()
