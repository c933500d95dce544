"""The checkpoint's host copy (rlfleet/trainer/host_state.py): host memory shaped like the trainer's
state, carved from few allocations, that torch's own state-dict copy fills."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed._state_dict_utils import _copy_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Shard, distribute_tensor

from rlfleet.trainer import host_state
from rlfleet.trainer.host_state import host_like


def _state() -> dict:
    return {
        "model": {"w": torch.randn(7, 5), "b": torch.randn(3, dtype=torch.bfloat16)},
        "optim": {
            "state": {
                "w": {"step": torch.tensor(4.0), "exp_avg": torch.randn(7, 5), "none": torch.empty(0, 2)}
            },
            "param_groups": [{"lr": 0.1, "params": ["w"], "betas": (0.9, 0.99)}],
        },
    }


def test_the_host_copy_has_the_states_shape_in_disjoint_memory_and_takes_torchs_copy(monkeypatch):
    monkeypatch.setattr(host_state, "CHUNK", 128)  # two tensors larger than a chunk, a small one beside them
    state = _state()
    host = host_like(state, pinned=False)
    assert host["optim"]["param_groups"] == state["optim"]["param_groups"]
    flat = [host["model"]["w"], host["model"]["b"], host["optim"]["state"]["w"]["exp_avg"]]
    want = [state["model"]["w"], state["model"]["b"], state["optim"]["state"]["w"]["exp_avg"]]
    for got, ref in zip(flat, want, strict=True):
        assert (got.shape, got.dtype, got.device.type) == (ref.shape, ref.dtype, "cpu")
    for i, t in enumerate(flat):  # no two views share a byte
        t.fill_(i + 1)
    assert [t.float().unique().tolist() for t in flat] == [[1.0], [2.0], [3.0]]

    copied = _copy_state_dict(state, host)
    for got, ref in zip(flat, want, strict=True):
        assert torch.equal(got, ref)
    assert copied["optim"]["state"]["w"]["step"].item() == 4.0
    assert copied["optim"]["state"]["w"]["none"].shape == (0, 2)


def test_a_tensor_larger_than_a_chunk_shares_its_power_of_two_allocation_with_smaller_ones(monkeypatch):
    """torch's pinned allocator rounds each allocation up to a power of two: a 600-byte tensor gets
    1,024 bytes, and the six small ones fill the rest instead of pinning chunks of their own."""
    monkeypatch.setattr(host_state, "CHUNK", 256)
    state = {"big": torch.randn(150), **{f"s{i}": torch.full((16,), float(i)) for i in range(6)}}
    host = host_like(state, pinned=False)
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in host.values()}
    assert list(storages.values()) == [1024]
    for i, t in enumerate(host.values()):  # no two views share a byte
        t.fill_(i + 1)
    assert [t.unique().tolist() for t in host.values()] == [[float(i + 1)] for i in range(7)]
    copied = _copy_state_dict(state, host)
    assert all(torch.equal(copied[k], state[k]) for k in state)


def test_a_sharded_states_host_copy_keeps_its_dtensors(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        mesh = init_device_mesh("cpu", (1,))
        original = torch.randn(6, 4)
        w = distribute_tensor(original.clone(), mesh, [Shard(0)])
        state = {
            "model": {"w": w},
            "optim": {"state": {"w": {"exp_avg": distribute_tensor(torch.randn(6, 4), mesh, [Shard(0)])}}},
        }
        host = host_like(state, pinned=False)
        got = host["model"]["w"]
        assert isinstance(got, DTensor) and got.placements == w.placements and got.shape == w.shape
        assert got._local_tensor.data_ptr() != w._local_tensor.data_ptr()
        assert torch.equal(w.full_tensor(), original)  # the state's own DTensor untouched
        _copy_state_dict(state, host)
        assert torch.equal(got.full_tensor(), w.full_tensor())
        assert torch.equal(
            host["optim"]["state"]["w"]["exp_avg"].to_local(),
            state["optim"]["state"]["w"]["exp_avg"].to_local(),
        )
    finally:
        dist.destroy_process_group()
