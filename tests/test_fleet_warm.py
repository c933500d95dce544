"""A fleet's warm trainer (rlfleet/fleet/warm.py, fleet/keeper.py): a run's controller hands it the
trainer job; it trains as the run's trainer and goes with the run; the fleet keeps a fresh one
waiting, on a GPU fleet from the moment a run takes the last one."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from rlfleet.config.loader import to_toml
from rlfleet.config.model import ModelConfig
from rlfleet.config.models import TrainerJobConfig
from rlfleet.fleet.keeper import WarmKeeper
from rlfleet.guard import die_with_parent
from rlfleet.procs import pid_alive, running, wait_until
from rlfleet.store import RunStore
from rlfleet.store.layout import TRAINER_UP
from tests.helpers import read_text


def _waiting(keeper: WarmKeeper) -> dict:
    """The warm trainer now waiting in the keeper's spool (pid, start time), once it says so."""
    return json.loads(wait_until(lambda: read_text(keeper.spool / "warm.json"), 120, what="a warm trainer"))


class Run:
    """A run's controller, as far as the warm trainer sees it: a process that claims the warm
    trainer with the run's trainer.toml (fleet/warm.py `claim`) and then lives until killed."""

    def __init__(self, keeper: WarmKeeper, model: Path, out: Path):
        job = TrainerJobConfig(output_dir=str(out), max_steps=3, model=ModelConfig(path=str(model)))
        (out.parent / "trainer.toml").write_text(to_toml(job))
        self.log, self.pidfile = out / "logs" / "trainer" / "rank_0.log", out / "run" / "trainer.pid"
        self.store = RunStore(str(out))
        self.controller = subprocess.Popen(
            [
                sys.executable,
                "-c",
                "import sys, time; from pathlib import Path; from rlfleet.fleet.warm import claim\n"
                "t = claim(*map(Path, sys.argv[1:5]), {})\n"
                "print(t.warm_pid if t else 0, flush=True); time.sleep(600)",
                str(keeper.spool),
                str(out.parent / "trainer.toml"),
                str(self.log),
                str(self.pidfile),
            ],
            stdout=subprocess.PIPE,
            text=True,
            preexec_fn=die_with_parent(signal.SIGKILL),  # a suite killed outright leaves none behind
        )
        self.trainer_pid = int(self.controller.stdout.readline())

    def training(self) -> None:
        """Wait until the taken trainer has loaded the run's model, in the run's own log."""
        wait_until(lambda: self.store.exists(TRAINER_UP), 120, what="the taken trainer to load its model")
        assert self.store.read_json(TRAINER_UP)["pid"] == self.trainer_pid
        assert "starting at step 0" in self.log.read_text()

    def kill(self) -> None:
        self.controller.kill()
        self.controller.wait()


@pytest.fixture
def run_dir(tmp_path):
    (tmp_path / "runs").mkdir()
    return tmp_path / "runs"


def test_a_warm_trainer_taken_by_a_run_goes_with_its_controller_and_a_fresh_one_waits(
    tiny_model, tmp_path, run_dir
):
    """A run's controller hands its trainer job to the fleet's warm trainer, which compiled the
    fleet's model while it waited: it trains in the run's log as the run's trainer, and when the
    controller is SIGKILLed it exits (as a trainer the run started would); the fleet (on a CPU box:
    not `early`) starts a fresh one then, which no run has touched."""
    keeper = WarmKeeper.trainer(tmp_path / "t", 0, [], str(tiny_model), "float32").start()
    try:
        warm = _waiting(keeper)
        keeper.release()  # what the fleet does once its replicas are up
        assert keeper.wait_ready(300)
        run = Run(keeper, tiny_model, run_dir / "a")
        assert run.trainer_pid == warm["pid"]
        # before any job it built the fleet's model and ran the warm-up once (compiled, on a GPU)
        assert f"precompiled {tiny_model} (float32)" in keeper.process.log_path.read_text()
        assert pid_alive(run.pidfile) == warm["pid"]  # the run's pidfile: a rerun's reap would find it
        run.training()
        keeper.keep()
        assert keeper.starts == 1  # not early: the next one waits for the run to end

        run.kill()
        wait_until(
            lambda: not running(warm["pid"], warm["started"]), 60, what="the trainer to go with its run"
        )
        wait_until(lambda: keeper.keep() or keeper.starts == 2, 30, what="a fresh warm trainer")
        fresh = _waiting(keeper)
        assert fresh["pid"] != warm["pid"] and keeper.process.alive()
        assert not (keeper.spool / "claimed.json").exists()
    finally:
        keeper.stop()
    assert not keeper.process.alive()


def test_an_early_fleet_has_the_next_warm_trainer_ready_while_a_run_trains_on_the_last(
    tiny_model, tmp_path, run_dir
):
    """`early` (a fleet with GPUs): the moment a run takes the warm trainer, the fleet starts the
    next beside it, which imports and compiles while the run trains; a second run then takes it
    at once, and never the first run's process. The taken trainer stays the run's (its fleet
    pidfile moved aside, not reaped); the fleet's stop takes every one it started."""
    keeper = WarmKeeper.trainer(tmp_path / "t", 0, [], str(tiny_model), "float32", early=True).start()
    runs: list[Run] = []
    try:
        first = _waiting(keeper)
        keeper.release()
        assert keeper.wait_ready(300)
        assert json.loads((keeper.spool / "ready").read_text()) == {"gpu_bytes": 0}  # a CPU trainer
        runs.append(Run(keeper, tiny_model, run_dir / "a"))
        assert runs[0].trainer_pid == first["pid"]
        wait_until(lambda: keeper.keep() or keeper.starts == 2, 30, what="the next warm trainer")
        nxt = _waiting(keeper)
        assert nxt["pid"] != first["pid"]
        assert keeper.wait_ready(300)  # compiled while the first run trains
        runs[0].training()
        assert running(first["pid"], first["started"]) and len(keeper.taken) == 1
        assert pid_alive(runs[0].pidfile) == first["pid"]

        runs.append(Run(keeper, tiny_model, run_dir / "b"))  # right after: it finds the next one ready
        assert runs[1].trainer_pid == nxt["pid"]
        runs[1].training()
        wait_until(lambda: keeper.keep() or keeper.starts == 3, 30, what="a third warm trainer")
        assert len(keeper.taken) == 2
        pids = [first["pid"], nxt["pid"], _waiting(keeper)["pid"]]
        moved = lambda: sorted((tmp_path / "t" / "run").glob("trainer_0.taken-*.pid"))  # noqa: E731
        assert len(moved()) == 2
        runs[0].kill()  # its trainer goes with it; the fleet forgets it, and its pidfile
        wait_until(lambda: keeper.keep() or len(keeper.taken) == 1, 60, what="the first run's trainer to go")
        assert len(moved()) == 1 and not running(first["pid"], first["started"])
    finally:
        keeper.stop()
        for run in runs:
            run.kill()
    assert not keeper.process.alive() and not any(t.alive() for t in keeper.taken)
    assert len(set(pids)) == 3
    assert not list((tmp_path / "t" / "run").glob("*.pid"))
