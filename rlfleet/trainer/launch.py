"""Run the long-lived trainer as a child process and wait on its steps while watching it live."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from rlfleet.config.models import TrainerJobConfig
from rlfleet.procs import ManagedProcess, python_module_cmd, wait_until
from rlfleet.store import RunStore


class TrainerProcess:
    def __init__(self, cfg: TrainerJobConfig, config_path: Path):
        self.cfg = cfg
        self.config_path = config_path
        self.process: ManagedProcess | None = None
        self.launches = 0

    def ensure(self) -> None:
        """Start the trainer if it is not running; a fresh one resumes from the latest checkpoint."""
        if self.process is not None and self.process.alive():
            return
        out = Path(self.cfg.output_dir)
        env = {"CUDA_VISIBLE_DEVICES": ",".join(self.cfg.gpu_ids)} if self.cfg.gpu_ids else {}
        self.launches += 1
        self.process = ManagedProcess(
            name="trainer",
            cmd=python_module_cmd("rlfleet.cli", ["trainer", "@", str(self.config_path)]),
            log_path=out / "logs" / "trainer" / "rank_0.log",
            pidfile=out / "run" / "trainer.pid",
            env={**env, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"},
        ).start()

    def wait_step(self, store: RunStore, step: int, timeout_s: float) -> dict[str, Any]:
        """Block until `metrics/step_N.json` exists; raise RuntimeError if the process exits first."""
        rel = f"metrics/step_{step}.json"
        start = time.monotonic()
        wait_until(
            lambda: store.exists(rel),
            timeout_s,
            interval_s=0.05,
            what=f"trainer step {step}",
            abort=self._death_reason,
        )
        metrics = store.read_json(rel)
        metrics["wait_seconds"] = time.monotonic() - start
        return metrics

    def _death_reason(self) -> str | None:
        p = self.process
        if p is None or p.alive():
            return None
        return f"trainer exited with code {p.returncode()}; log tail:\n{p.log_tail()}"

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()
            self.process = None


_TRAINERS: dict[str, TrainerProcess] = {}


def get_trainer(cfg: TrainerJobConfig, config_path: Path) -> TrainerProcess:
    t = _TRAINERS.get(cfg.output_dir)
    if t is None or t.cfg != cfg:
        if t is not None:
            t.stop()
        t = _TRAINERS[cfg.output_dir] = TrainerProcess(cfg, config_path)
    return t


def stop_trainer(output_dir: str) -> None:
    t = _TRAINERS.pop(output_dir, None)
    if t is not None:
        t.stop()
