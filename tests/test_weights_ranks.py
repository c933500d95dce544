"""The weight transports from a trainer of several ranks, as far as a CPU box shows them: which rank
sends (nccl: rank 0; the others only join the gather) and which buffers a vLLM worker maps
(cuda_ipc: the trainer rank's on its own GPU, by UUID). The GPU paths themselves need a GPU."""

from __future__ import annotations

import pytest
import torch

from rlfleet.config.model import ModelConfig
from rlfleet.config.models import TrainerJobConfig
from rlfleet.store import RunStore
from rlfleet.trainer.parallel import Parallel
from rlfleet.weights import nccl
from rlfleet.weights.cuda_ipc import device_handles
from rlfleet.weights.publisher import Follower
from rlfleet.weights.tickets import ticket_rel


def test_a_vllm_worker_maps_the_buffers_of_the_trainer_rank_on_its_gpu():
    ticket = {
        "transport": "cuda_ipc",
        "devices": [{"gpu": "GPU-a", "handles": ["a0", "a1"]}, {"gpu": "GPU-b", "handles": ["b0", "b1"]}],
    }
    assert device_handles(ticket, "GPU-b") == ["b0", "b1"]
    assert device_handles(ticket, "GPU-a") == ["a0", "a1"]
    with pytest.raises(RuntimeError, match=r"no trainer rank holds weights on this vLLM worker's GPU GPU-c"):
        device_handles(ticket, "GPU-c")


def test_only_trainer_rank_0_sends_over_nccl_the_others_join_the_gather(tmp_path):
    cfg = TrainerJobConfig(
        model=ModelConfig(path="m"), output_dir=str(tmp_path), weights={"transport": "nccl"}
    )
    store = RunStore(str(tmp_path))
    assert isinstance(nccl.publisher(cfg, store, Parallel(rank=0, world=2)), nccl.NcclPublisher)
    follower = nccl.publisher(cfg, store, Parallel(rank=1, world=2))
    assert isinstance(follower, Follower)
    model = torch.nn.Linear(2, 2)
    follower.publish(0, model)  # the gather (here one process: the state dict as it is)
    follower.serve(0)
    follower.poll()
    assert not store.exists(ticket_rel(0))  # rank 0 writes the ticket and sends


def test_gather_on_one_process_is_its_own_value():
    assert Parallel().gather({"gpu": "x"}) == [{"gpu": "x"}]
