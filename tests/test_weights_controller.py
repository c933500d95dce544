"""The controller's side of the weight seam (`weights/controller.py`): each transport's rules on a
real run store, without vLLM or a trainer process."""

from __future__ import annotations

import os

import pytest

from rlfleet.config.loader import ConfigError, load
from rlfleet.config.models import RLConfig
from rlfleet.config.weights import TRANSPORTS, AutoConfig, NcclConfig, placed, transport_config
from rlfleet.procs import this_process
from rlfleet.runs.configs import preflight
from rlfleet.store import RunStore, step_dir
from rlfleet.weights.controller import Sender, make_controller
from rlfleet.weights.tickets import REGROUP, REGROUPED, ticket_rel

DEAD = {"pid": os.getpid(), "started": 0.0}  # this pid, another start time: a process that exited


def publish_weights(store: RunStore, step: int) -> None:
    rel = step_dir("weights", step)
    src = store.staging_dir(rel)
    (src / "model.safetensors").write_bytes(b"w" * 16)
    store.publish_dir(src, rel, {"step": step})


def nccl_ticket(step: int, sender: dict) -> dict:
    return {"transport": "nccl", "step": step, "group": {"id": f"g{step}", **sender}}


class FakeTrainer:
    def __init__(self, error: Exception | None = None):
        self.error = error

    def failure(self, store: RunStore, step: int) -> Exception | None:
        return self.error


def test_every_transport_in_the_registry_has_its_three_parts():
    assert set(TRANSPORTS) == {"filesystem", "cuda_ipc", "nccl"}
    for name, entry in TRANSPORTS.items():
        assert make_controller(name).name == name
        for side in ("publisher", "receiver"):
            assert callable(entry.part(side)), (name, side)
    with pytest.raises(ValueError, match="unknown weights transport 'rdma'"):
        make_controller("rdma")
    with pytest.raises(ValueError, match="unknown weights transport 'rdma'"):
        transport_config("rdma")


def test_filesystem_ticket_is_the_newest_complete_weights_at_or_before_the_step(tmp_path):
    store = RunStore(tmp_path)
    fs = make_controller("filesystem")
    publish_weights(store, 1)
    publish_weights(store, 3)
    (tmp_path / "weights" / "step_4").mkdir()  # an upload cut before its manifest
    (tmp_path / "weights" / "step_4" / "model.safetensors").write_bytes(b"half")
    ticket = fs.ticket(store, 4)
    assert ticket == {"transport": "filesystem", "step": 3, "path": str(tmp_path / "weights" / "step_3")}
    assert fs.ticket(store, 2)["step"] == 1
    with pytest.raises(FileNotFoundError, match="no complete weights for step <= 0"):
        fs.ticket(store, 0)
    # a relaunched replica starts from these files: nothing to load after it, nothing to skip
    assert fs.files(ticket) == ticket["path"]
    assert fs.resync(store, ticket, timeout_s=1) is None
    assert not fs.skip(ticket, served=3)


def test_cuda_ipc_ticket_is_the_trainers_and_a_relaunch_maps_it_again(tmp_path):
    store = RunStore(tmp_path)
    ipc = make_controller("cuda_ipc")
    with pytest.raises(FileNotFoundError, match="no cuda_ipc weights ticket for step 2"):
        ipc.ticket(store, 2)
    ticket = {"transport": "cuda_ipc", "step": 2, "slot": 0, "gpu": "GPU-x", "handles": [], "layout": []}
    store.write_json(ticket_rel(2), ticket)
    assert ipc.ticket(store, 2) == ticket
    assert ipc.resync(store, ticket, timeout_s=1) == ticket
    assert ipc.files(ticket) is None and not ipc.skip(ticket, served=2)


def test_nccl_ticket_waits_for_a_running_sender_after_the_relaunch_callback(tmp_path):
    store = RunStore(tmp_path)
    nccl = make_controller("nccl")
    asked: list[int] = []

    def running(trainer: FakeTrainer):
        def ensure() -> FakeTrainer:
            asked.append(1)
            return trainer

        return ensure

    store.write_json(ticket_rel(5), nccl_ticket(5, this_process()))
    assert nccl.ticket(store, 5, Sender(running(FakeTrainer()), timeout_s=5))["step"] == 5
    assert asked == [1]  # the broadcast's trainer check ran (it relaunches a dead one)

    store.write_json(ticket_rel(5), nccl_ticket(5, DEAD))
    died = RuntimeError("trainer exited with code 9")
    with pytest.raises(RuntimeError, match="code 9"):
        nccl.ticket(store, 5, Sender(running(FakeTrainer(died)), timeout_s=60))
    with pytest.raises(TimeoutError, match="no running trainer wrote the step 5 nccl ticket"):
        nccl.ticket(store, 5, Sender(running(FakeTrainer()), timeout_s=0))
    assert nccl.ticket(store, 5)["group"]["pid"] == DEAD["pid"]  # no sender: the ticket as written


def test_filesystem_and_cuda_ipc_never_touch_the_trainer(tmp_path):
    store = RunStore(tmp_path)
    publish_weights(store, 0)
    store.write_json(ticket_rel(0), {"transport": "cuda_ipc", "step": 0})

    def must_not_run() -> FakeTrainer:
        raise AssertionError("only a transport whose trainer sends the weights checks the trainer")

    for name in ("filesystem", "cuda_ipc"):
        assert make_controller(name).ticket(store, 0, Sender(must_not_run, timeout_s=0))["step"] == 0


class AnsweringStore(RunStore):
    """A run store whose trainer answers a regroup request as it is written (the newest step: 7)."""

    def write_json(self, rel: str, obj) -> None:
        super().write_json(rel, obj)
        if rel == REGROUP:
            super().write_json(
                REGROUPED, {**nccl_ticket(7, this_process()), "group": {"id": obj["id"], **this_process()}}
            )


def test_nccl_relaunch_regroups_and_the_step_it_brought_is_not_broadcast_again(tmp_path):
    store = AnsweringStore(tmp_path)
    nccl = make_controller("nccl")
    held = nccl_ticket(6, this_process())
    answer = nccl.resync(store, held, timeout_s=5)
    assert answer is not None and answer["step"] == 7
    assert answer["group"]["id"] == store.read_json(REGROUP)["id"]
    # the trainer sent step 7 once, in the new group: its broadcast must not ask again
    assert nccl.skip(nccl_ticket(7, this_process()), served=answer["step"])
    assert nccl.skip(nccl_ticket(6, this_process()), served=7)
    assert not nccl.skip(nccl_ticket(8, this_process()), served=7)
    assert nccl.files(answer) is None


def test_nccl_regroup_times_out_when_no_trainer_answers(tmp_path):
    with pytest.raises(TimeoutError, match="regroup request"):
        make_controller("nccl").resync(RunStore(tmp_path), nccl_ticket(1, this_process()), timeout_s=0)


@pytest.fixture
def model_dir(tmp_path):
    d = tmp_path / "model"
    d.mkdir()
    for name in ("config.json", "tokenizer_config.json", "model.safetensors"):
        (d / name).write_text("{}")
    return d


def test_preflight_refuses_cuda_ipc_on_separate_gpus_naming_the_field(model_dir, tmp_path, monkeypatch):
    one_each = ["--deployment.num-inference-gpus", "1", "--deployment.num-train-gpus", "1"]
    argv = ["--model.path", str(model_dir), "--output-dir", str(tmp_path / "out"), *one_each]
    ipc = load(RLConfig, [*argv, "--weights.transport", "cuda_ipc"])
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    with pytest.raises(ConfigError, match=r"weights\.transport: cuda_ipc .* they got \['0'\] and \['1'\]"):
        preflight(ipc, ports=False)
    for transport in ("filesystem", "nccl"):  # separate GPUs suit them
        p = preflight(load(RLConfig, [*argv, "--weights.transport", transport]), ports=False)
        assert (p.inference_gpus, p.trainer_gpus, p.transport) == (["0"], ["1"], transport)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")  # one GPU: both share it
    p = preflight(ipc, ports=False)
    assert (p.inference_gpus, p.trainer_gpus) == (["0"], ["0"])


def test_auto_is_cuda_ipc_on_one_shared_gpu_and_filesystem_elsewhere():
    auto, pinned = AutoConfig(timeout_s=5), NcclConfig()
    assert placed(auto, ["0"], ["0"]).transport == "cuda_ipc"
    assert placed(auto, ["0"], ["1"]).transport == "filesystem"
    assert placed(auto, [], []).transport == "filesystem"  # CPU
    assert placed(auto, ["0", "1"], ["0", "1"]).transport == "cuda_ipc"  # colocated on two GPUs
    assert placed(auto, ["0", "1"], ["1", "2"]).transport == "filesystem"  # GPU 0 has no trainer rank
    assert placed(auto, ["0"], ["0"]).timeout_s == 5  # the settings go with it
    assert placed(pinned, ["0"], ["0"]) is pinned
