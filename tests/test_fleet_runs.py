"""Runs on a warm fleet, end to end (rlfleet/fleet/): each attaches from its own weights and trains
in the fleet's warm trainer, runs in its warm controller and goes with its caller, uses the fleet's
Prefect server, and an ablation's children run at once, one replica each."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import pytest
import torch

from rlfleet.config.inference import InferenceConfig
from rlfleet.config.loader import load, to_toml
from rlfleet.config.model import ModelConfig
from rlfleet.config.models import EvalJobConfig, RLConfig
from rlfleet.config.rollouts import EvalConfig
from rlfleet.fleet.api import FleetApi, check_api_port, use_fleet_api
from rlfleet.fleet.attach import fleet_hold
from rlfleet.fleet.keeper import warm
from rlfleet.fleet.rest import sleeping, wake
from rlfleet.fleet.serve import serve
from rlfleet.fleet.state import fleet_dir, read_state, write_state
from rlfleet.inference.server import healthy
from rlfleet.orchestrator.rollout import read_rollout
from rlfleet.procs import pid_alive, running, wait_until
from rlfleet.store import RunStore
from rlfleet.store.layout import TRAINER_UP
from rlfleet.store.records import read_steps
from tests.helpers import fleet_config, free_port, prompt_logprobs, read_text, rl_config


@pytest.fixture(autouse=True)
def fleets(tmp_path, monkeypatch):
    monkeypatch.setenv("RLFLEET_FLEET_DIR", str(tmp_path / "fleets"))
    return tmp_path / "fleets"


def _warm_pid() -> int:
    """The pid of the fleet's waiting trainer, once it says where it is."""
    warm = fleet_dir() / "t" / "trainer" / "0" / "warm.json"
    return wait_until(
        lambda: warm.is_file() and json.loads(warm.read_text())["pid"], 120, what="a warm trainer"
    )


def _trainer_pid(out) -> int:
    """The pid of the trainer that loaded the run's model (`run/trainer_up.json`)."""
    return RunStore(str(out)).read_json(TRAINER_UP)["pid"]


def _samples_from_base(tiny_model, out) -> float:
    """How far run `out`'s step-0 sampled logprobs are from the base model's, teacher-forced by HF."""
    from transformers import AutoModelForCausalLM

    from rlfleet.trainer.lm_head import token_logprobs

    hf = AutoModelForCausalLM.from_pretrained(tiny_model)
    first = read_rollout(RunStore(str(out)), 0)[0]
    ids = torch.tensor([first["input_ids"]])
    with torch.no_grad():
        ref = token_logprobs(hf(input_ids=ids).logits[:, :-1], ids[:, 1:])[0].tolist()
    sampled = [i for i, m in enumerate(first["loss_mask"]) if m]
    return max(abs(first["logprobs"][i] - ref[i - 1]) for i in sampled)


def _lock(name: str) -> dict:
    return json.loads((fleet_dir() / f"{name}.0.lock").read_text() or "{}")


def test_an_eval_on_a_gpu_fleet_leases_its_replicas_gpu_as_a_run_does(tiny_model, prefect_api):
    """An eval holding replica 1 of a two-GPU fleet holds GPU 1's slot on the fleet's Prefect API
    (not GPU 0's), for as long as it holds the replica, and gives both back."""
    from prefect.client.orchestration import get_client

    from rlfleet.tasks.eval import held_replica
    from rlfleet.workers.leases import ensure_gpu_limits

    fleet = fleet_config(tiny_model, 8400, max_model_len=128, num_replicas=2)
    job = fleet.job().model_copy(update={"gpu_ids": ["8", "9"]})
    write_state("g", ["http://127.0.0.1:8400", "http://127.0.0.1:8401"], job)  # this process stands in
    ensure_gpu_limits(["8", "9"])

    def active() -> dict[str, int]:
        with get_client(sync_client=True) as client:
            return {g: client.read_global_concurrency_limit_by_name(f"gpu-{g}").active_slots for g in "89"}

    with fleet_hold("g", "run outputs/a") as a:  # a run holds replica 0
        assert a == 0
        with held_replica("g", "eval of outputs/a", tp=1) as slot:
            assert slot == 1 and active() == {"8": 0, "9": 1}
    assert active() == {"8": 0, "9": 0}


@pytest.mark.e2e
def test_runs_attach_to_a_warm_fleet_each_from_its_own_weights(tiny_model, prefect_api, tmp_path):
    """Run A trains on the fleet and, finished, loads the base model back onto its replica (marked
    clean: run B skips that load). An eval then leaves run A's checkpoint there (unmarked), and run C,
    attaching next, samples its step 0 from the base model, not from those weights (its sampler's
    logprobs are the base model's, teacher-forced by HF). Each run's trainer is the warm one the
    fleet had waiting, and a fresh one waits after each. The replica is the one the fleet started,
    still serving after all; killed, the fleet relaunches it from the base model."""
    from transformers import AutoModelForCausalLM

    from rlfleet.fleet.attach import model_fingerprint
    from rlfleet.flows.eval import eval_flow
    from rlfleet.flows.rl import rl
    from rlfleet.trainer.files import checkpoint_model_path, latest_checkpoint
    from rlfleet.trainer.lm_head import token_logprobs

    fleet = fleet_config(tiny_model, free_port(), max_model_len=128)
    stop, ready = threading.Event(), threading.Event()
    thread = threading.Thread(target=serve, args=(fleet, stop, ready), daemon=True)
    thread.start()
    try:
        assert ready.wait(300), "the fleet's replica did not serve"
        state = read_state("t")
        assert state is not None and (fleet_dir() / "t.json").is_file()
        assert state["api_url"] == prefect_api  # a worker's API: the fleet's runs use it, none starts its own
        url, pidfile = state["urls"][0], fleet_dir() / "t" / "run" / "inference_0.pid"
        replica_pid = pid_alive(pidfile)
        prompt = [1, *range(40, 60)]
        base = prompt_logprobs(url, prompt)
        clean = model_fingerprint(str(tiny_model))
        assert _lock("t")["serves"] == clean  # started from the base model
        assert not sleeping(url) and wake([url]) < 5  # a CPU fleet stays awake: nothing to wake
        out = subprocess.run(
            [sys.executable, "-m", "rlfleet.cli", "fleet", "status"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout  # its own stdout: the fleet's threads here log too
        (status,) = json.loads(out)
        assert status["name"] == "t" and status["held_by"] == [None] and status["asleep"] == [False]

        warm_a = _warm_pid()
        a = rl(config=rl_config(tiny_model, tmp_path / "a", max_steps=2, fleet="t"), return_state=True)
        assert a.is_completed(), a
        assert _trainer_pid(tmp_path / "a") == warm_a, "run A started a trainer of its own"
        warm_b = wait_until(lambda: (p := _warm_pid()) != warm_a and p, 120, what="a fresh warm trainer")
        # finished, run A gave the replica back serving the base model, and said so in its lock
        assert max(abs(x - y) for x, y in zip(prompt_logprobs(url, prompt), base, strict=True)) < 1e-4
        assert _lock("t")["serves"] == clean

        out_b = tmp_path / "b"
        b = rl(config=rl_config(tiny_model, out_b, max_steps=1, fleet="t"), return_state=True)
        assert b.is_completed(), b
        assert _trainer_pid(out_b) == warm_b  # a fresh process: nothing of run A's trainer in it
        assert (off := _samples_from_base(tiny_model, out_b)) < 1e-3, f"run B's step 0: max off {off}"
        assert read_steps(RunStore(str(out_b)))[0]["policy_step"] == -1

        # an eval of run A's latest checkpoint on the fleet: those weights, loaded on its replica
        store_a = RunStore(str(tmp_path / "a"))
        ev = eval_flow(
            config=EvalJobConfig(
                output_dir=str(tmp_path / "a"),
                model=ModelConfig(path=str(tiny_model)),
                inference=InferenceConfig(max_model_len=128),
                eval=EvalConfig(num_examples=8),
                fleet="t",
            )
        )
        assert ev["step"] == latest_checkpoint(store_a)["step"] and ev["source"] == "eval"
        ckpt = AutoModelForCausalLM.from_pretrained(checkpoint_model_path(store_a, ev["step"]))
        ids = torch.tensor([prompt])
        with torch.no_grad():
            want = token_logprobs(ckpt(input_ids=ids).logits[:, :-1], ids[:, 1:])[0].tolist()
        assert max(abs(x - y) for x, y in zip(prompt_logprobs(url, prompt), want, strict=True)) < 1e-3
        assert "serves" not in _lock("t")  # it left other weights there: unmarked

        out_c = tmp_path / "c"
        c = rl(config=rl_config(tiny_model, out_c, max_steps=1, fleet="t"), return_state=True)
        assert c.is_completed(), c
        assert (off := _samples_from_base(tiny_model, out_c)) < 1e-3, (
            f"run C's step 0 sampled from the weights the eval left (max off {off})"
        )
        assert replica_pid is not None and pid_alive(pidfile) == replica_pid, (
            "the runs stopped the fleet's replica"
        )

        os.kill(replica_pid, signal.SIGKILL)  # its guard: the server dies with it
        wait_until(
            lambda: pid_alive(pidfile) not in (None, replica_pid) and healthy(url), 300, what="a relaunch"
        )
        again = prompt_logprobs(url, prompt)  # relaunched from the base model, not from a run's weights
        assert max(abs(x - y) for x, y in zip(again, base, strict=True)) < 1e-4
    finally:
        stop.set()
        thread.join(120)
    assert read_state("t") is None and not (fleet_dir() / "t.json").exists()


def test_a_run_on_a_fleet_starts_only_its_trainer_early(tiny_model, tmp_path, monkeypatch):
    """`rlfleet rl --fleet` starts the trainer before Prefect and the flow, as a cold run does,
    and no vLLM of its own: the fleet's replicas serve already."""
    from rlfleet.inference.pool import InferencePool
    from rlfleet.runs.early import early_start
    from rlfleet.trainer.launch import TrainerProcess

    events: list[str] = []
    monkeypatch.setattr(InferencePool, "start", lambda self: events.append("vllm"))
    monkeypatch.setattr(TrainerProcess, "ensure", lambda self: events.append("trainer"))
    monkeypatch.setattr(TrainerProcess, "stop", lambda self: None)
    write_state("t", ["http://127.0.0.1:8400"], fleet_config(tiny_model, 8400, max_model_len=128).job())
    with early_start(rl_config(tiny_model, tmp_path / "run", max_steps=1, fleet="t")):
        assert events == ["trainer"]
    events.clear()
    with early_start(rl_config(tiny_model, tmp_path / "cold", max_steps=1)):
        assert events == ["vllm", "trainer"]


def test_a_fleet_keeps_a_prefect_server_that_its_runs_use(tiny_model, tmp_path, monkeypatch):
    """Without a worker's API the fleet starts Prefect's server and starts it again when it dies;
    `rlfleet rl --fleet` points the run at it (no temporary server of its own), unless
    PREFECT_API_URL names another."""
    monkeypatch.setenv("PREFECT_API_URL", "")  # unset, and put back at teardown whatever use_fleet_api sets
    port = free_port()
    fleet = fleet_config(tiny_model, free_port(), max_model_len=128).model_copy(update={"api_port": port})
    api = FleetApi(fleet, tmp_path / "t").start()
    try:
        assert api.wait_ready() == f"http://127.0.0.1:{port}/api" and api.healthy()
        assert check_api_port(fleet) == [
            f"api_port: port {port} on 127.0.0.1 is in use (another Prefect server?)"
        ]
        assert (tmp_path / "t" / "prefect" / "prefect.db").is_file()  # its own home, not the user's
        # the fleet's GPUs as 1-slot limits on its API: runs attached to it lease them there
        assert api.create_gpu_limits(["3", "4"]) == ["gpu-3", "gpu-4"]
        limits = httpx.post(f"{api.url}/v2/concurrency_limits/filter", json={}).json()
        assert {(g["name"], g["limit"]) for g in limits} >= {("gpu-3", 1), ("gpu-4", 1)}

        first = api.server.pid
        os.kill(first, signal.SIGKILL)  # its guard: the server goes with it
        wait_until(lambda: not api.server.alive(), 30, what="the server to die")
        api.keep()
        assert api.restarts == 1 and api.server.pid != first and api.healthy()

        write_state("t", ["http://127.0.0.1:8400"], fleet.job(), api.url)
        use_fleet_api(rl_config(tiny_model, tmp_path / "cold", max_steps=1).fleet)
        assert not os.environ["PREFECT_API_URL"]  # a run on no fleet keeps its own
        use_fleet_api(rl_config(tiny_model, tmp_path / "run", max_steps=1, fleet="t").fleet)
        assert os.environ["PREFECT_API_URL"] == api.url
        monkeypatch.setenv("PREFECT_API_URL", "http://elsewhere:4200/api")
        use_fleet_api(rl_config(tiny_model, tmp_path / "run", max_steps=1, fleet="t").fleet)
        assert os.environ["PREFECT_API_URL"] == "http://elsewhere:4200/api"
    finally:
        api.stop()
    assert not api.server.alive() and not (tmp_path / "t" / "run" / "prefect_server.pid").exists()


@pytest.mark.e2e
def test_a_run_on_a_fleet_runs_in_its_warm_controller_and_goes_with_its_caller(
    tiny_model, prefect_api, tmp_path
):
    """`rlfleet rl --fleet` hands its command to the fleet's warm controller (imports and tokenizer
    paid before the command): the run's output reaches the caller's stdout, its exit code is the
    caller's, and that process, a run's controller now, exits with the run; a fresh one waits. A
    caller SIGKILLed mid-run takes its warm controller with it, and the replica it held is free."""
    fleet = fleet_config(tiny_model, free_port(), max_model_len=128)
    stop, ready = threading.Event(), threading.Event()
    thread = threading.Thread(target=serve, args=(fleet, stop, ready), daemon=True)
    thread.start()

    def command(name: str, steps: int) -> list[str]:
        path = tmp_path / f"{name}.toml"
        path.write_text(to_toml(rl_config(tiny_model, tmp_path / name, max_steps=steps, fleet="t")))
        return [sys.executable, "-m", "rlfleet.cli", "rl", "@", str(path)]

    try:
        assert ready.wait(300), "the fleet did not come up"
        assert warm("t", 1) == [{"trainer": True, "controller": True}]  # up: both wait, ready
        first = _controller()
        done = subprocess.run(command("a", 1), capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
        assert (
            json.loads(done.stdout[done.stdout.index("{") :])["wall_seconds"] > 0
        )  # the summary, printed there
        assert "step 0 (1/1)" in done.stdout + done.stderr  # the flow's log lines too
        # it ran the run, and goes with it (its exit, after the code it sent, takes a moment)
        wait_until(lambda: not running(first["pid"], first["started"]), 60, what="it to exit with its run")
        second = wait_until(
            lambda: (w := _controller())["pid"] != first["pid"] and w, 120, what="a fresh one"
        )
        assert read_steps(RunStore(str(tmp_path / "a")))[0]["step"] == 0

        caller = subprocess.Popen(command("b", 50), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        claimed = fleet_dir() / "t" / "controller" / "0" / "claimed.json"
        wait_until(lambda: read_text(claimed) and json.loads(read_text(claimed))["pid"] == caller.pid, 120)
        wait_until(
            lambda: _lock("t").get("run") == str(tmp_path / "b"), 120, what="run b to hold the replica"
        )
        caller.kill()
        caller.wait()
        wait_until(lambda: not running(second["pid"], second["started"]), 30, what="the controller to go")
        with fleet_hold("t", "outputs/next") as slot:  # given back by the kernel with the process
            assert slot == 0
    finally:
        stop.set()
        thread.join(120)


def _controller() -> dict:
    """The fleet's waiting warm controller (pid, start time), once it is ready for a run."""
    spool = fleet_dir() / "t" / "controller" / "0"
    return json.loads(
        wait_until(
            lambda: (spool / "ready").exists() and read_text(spool / "warm.json"),
            120,
            what="a warm controller",
        )
    )


@pytest.mark.e2e
def test_an_ablation_on_a_fleet_runs_its_children_at_once_one_replica_each(tiny_model, prefect_api, tmp_path):
    """Two grid points on a fleet of two replicas: each child is its own `rlfleet rl` process and
    holds a replica of its own, so they ran side by side (one after the other, the second would
    have found replica 0 free again), each trained in the warm trainer beside its replica."""
    from rlfleet.flows.ablation import ablation

    fleet = fleet_config(tiny_model, free_port(), max_model_len=128, num_replicas=2)
    stop, ready = threading.Event(), threading.Event()
    thread = threading.Thread(target=serve, args=(fleet, stop, ready), daemon=True)
    thread.start()
    try:
        assert ready.wait(300), "the fleet's replicas did not serve"
        urls = read_state("t")["urls"]
        warm = {
            json.loads(
                wait_until(lambda i=i: read_text(fleet_dir() / "t" / "trainer" / str(i) / "warm.json"), 120)
            )["pid"]
            for i in range(2)
        }
        base = rl_config(tiny_model, tmp_path / "abl", 1, fleet="t")
        rows = ablation(base=base, grid={"trainer.lr": [1e-3, 1e-2]})
        assert [r["state"] for r in rows] == ["Completed", "Completed"], rows
        held = [
            load(RLConfig, ["@", str(Path(r["output_dir"]) / "configs" / "rl.toml")]).inference.urls
            for r in rows
        ]
        assert sorted(held) == [[urls[0]], [urls[1]]]  # a replica each, at the same time
        assert {_trainer_pid(r["output_dir"]) for r in rows} == warm
    finally:
        stop.set()
        thread.join(120)
