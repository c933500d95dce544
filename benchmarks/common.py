"""Shared pieces of the loop-speed benchmarks: the tiny model, a vLLM pool, the RL config, the
machine description, the JSON file, the one rich table each script prints, and the runs a
harness starts (stopped with it)."""

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
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # for tests.helpers.free_port

from rlfleet.config.loader import load  # noqa: E402
from rlfleet.config.models import RLConfig  # noqa: E402
from rlfleet.procs import kill_group  # noqa: E402
from rlfleet.trainer.tiny import make_tiny_model  # noqa: E402
from tests.helpers import free_port  # noqa: E402


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
        with self._lock:
            self._stopped, live = True, self._live
        for proc in live:
            if proc.poll() is None:
                kill_group(proc.pid)


def tiny_model(tmp: Path, **shape: int) -> Path:
    return make_tiny_model(tmp / "model", seed=0, **shape)


def rl_config(model: Path, out: Path, *args: str) -> RLConfig:
    """The tiny CPU run's shape (examples/tiny/rl.toml) on a free port; `args` override it."""
    base = [
        "--model.path",
        str(model),
        "--output-dir",
        str(out),
        "--orchestrator.batch-size",
        "32",
        "--orchestrator.group-size",
        "8",
        "--orchestrator.max-tokens",
        "16",
        "--orchestrator.micro-batch-size",
        "64",
        "--trainer.lr",
        "5e-3",
        "--trainer.checkpoint-interval",
        "1000",
        "--inference.port",
        str(free_port()),
        "--inference.max-model-len",
        "256",
        "--wandb.mode",
        "disabled",
    ]
    return load(RLConfig, [*base, *args])


def start_fleet(
    fleet_toml: Path, args: list[str], env: dict[str, str], log: Path
) -> tuple[subprocess.Popen, float]:
    """`rlfleet fleet up @ fleet_toml ARGS` in the background, returned once it logs that it is up
    (its replicas serve): the process, which the caller stops, and the seconds that took."""
    import tomllib

    name = tomllib.loads(fleet_toml.read_text())["name"]
    t0 = time.time()
    argv = [sys.executable, "-m", "rlfleet.cli", "fleet", "up", "@", str(fleet_toml), *args]
    fleet = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT)
    while f"fleet {name} up" not in log.read_text():
        if fleet.poll() is not None:
            raise RuntimeError(f"fleet {name} exited ({fleet.returncode}):\n{log.read_text()[-3000:]}")
        time.sleep(0.5)
    return fleet, time.time() - t0


def median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


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


def write(out: str, results: dict[str, Any]) -> None:
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(
        json.dumps({"env": machine(), "results": results}, separators=(",", ":"), default=str)
    )


def table(title: str, columns: list[str], rows: list[list[Any]]) -> None:
    t = Table(title=title)
    for c in columns:
        t.add_column(c, justify="right" if c != columns[0] else "left")
    for r in rows:
        t.add_row(*(f"{v:.3f}" if isinstance(v, float) else str(v) for v in r))
    Console().print(t)


def run_rl(cfg: RLConfig) -> tuple[list[dict[str, Any]], float]:
    """Flow `rl` in this process (Prefect's API from PREFECT_API_URL, else a temporary local
    server); returns the per-step records and the flow's wall time."""
    from rlfleet.flows.rl import rl
    from rlfleet.store import RunStore
    from rlfleet.store.records import read_steps

    # as `rlfleet rl` does: the temporary server's telemetry heartbeat otherwise logs SQLite lock errors
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")  # a busy box
    t0 = time.perf_counter()
    state = rl(config=cfg, return_state=True)
    wall = time.perf_counter() - t0
    if not state.is_completed():
        raise RuntimeError(f"flow failed: {state}")
    return read_steps(RunStore(cfg.output_dir)), wall


class CpuSampler:
    """Busy CPUs over time from /proc/stat (all processes: vLLM, trainer, controller, Prefect,
    other tenants), sampled every `period` s in a thread; `busy_cpus(t0, t1)` averages a window."""

    def __init__(self, period: float = 0.5):
        import threading

        self.samples: list[tuple[float, int, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(period,), daemon=True)

    @staticmethod
    def _read() -> tuple[int, int]:
        vals = [int(x) for x in Path("/proc/stat").read_text().split("\n")[0].split()[1:]]
        idle = vals[3] + vals[4]  # idle + iowait
        return sum(vals) - idle, sum(vals)

    def _run(self, period: float) -> None:
        while not self._stop.is_set():
            self.samples.append((time.time(), *self._read()))
            self._stop.wait(period)

    def __enter__(self) -> CpuSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def busy_cpus(self, t0: float, t1: float) -> float:
        inside = [s for s in self.samples if t0 <= s[0] <= t1]
        if len(inside) < 2:
            return float("nan")
        (_, b0, a0), (_, b1, a1) = inside[0], inside[-1]
        return (b1 - b0) / max(a1 - a0, 1) * (os.cpu_count() or 1)
