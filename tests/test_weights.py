"""The weight-sync seam without vLLM: layouts, the served acknowledgement, the nccl code over gloo."""

from __future__ import annotations

import multiprocessing as mp
import subprocess
import sys
import threading
import time

import psutil
import pytest
import torch

from rlfleet.store import RunStore
from rlfleet.trainer.parallel import Parallel
from rlfleet.weights import tensors
from rlfleet.weights.nccl import NcclPublisher, SenderDied, open_group, receive
from rlfleet.weights.tickets import served_step, ticket, wait_served, write_served
from tests.conftest import free_port


def _state() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {
        "a": torch.randn(3, 5, generator=g),
        "b": torch.randn(13, generator=g),
        "c": torch.randn(2, 2, generator=g),
    }


def test_layout_round_trips_across_buckets_and_casts():
    sd = _state()
    layout = tensors.make_layout(sd, torch.bfloat16, bucket_bytes=2 * 16)  # 16 bf16 elements per bucket
    assert [b for _, b, _, _ in layout] == [0, 1, 2]  # a (15), b (13), c (4): 13 + 4 > 16
    buckets = [torch.empty(n, dtype=torch.bfloat16) for n in tensors.bucket_sizes(layout)]
    tensors.fill(buckets, layout, sd)
    got = dict(tensors.views(buckets, layout))
    for name, t in sd.items():
        assert got[name].dtype == torch.bfloat16 and got[name].shape == t.shape
        torch.testing.assert_close(got[name].float(), t, atol=1e-2, rtol=1e-2)


def test_wait_served_blocks_until_the_controller_acknowledges(tmp_path):
    store = RunStore(str(tmp_path))
    with pytest.raises(TimeoutError, match="vLLM still holds weights None after 0 s; step 0"):
        wait_served(store, 0, timeout_s=0.05)
    write_served(store, 3)
    threading.Timer(0.2, write_served, (store, 4)).start()
    t0 = time.monotonic()
    wait_served(store, 4, timeout_s=5)
    assert time.monotonic() - t0 >= 0.15 and served_step(store) == 4


def test_missing_ticket_names_the_step(tmp_path):
    with pytest.raises(FileNotFoundError, match="no nccl weights ticket for step 7"):
        ticket(RunStore(str(tmp_path)), 7, "nccl")


def _receiver(port: int, out_dir: str, steps: int, q) -> None:
    """A second process: joins each ticket's group as rank 1 and returns what it received."""
    store = RunStore(out_dir)
    groups: dict[str, object] = {}
    got = []
    for step in range(steps):
        while not store.exists(f"sync/step_{step}.json"):
            time.sleep(0.01)
        t = ticket(store, step, "nccl")
        g = t["group"]
        if g["id"] not in groups:  # a new sender (a relaunched trainer) means a new group
            groups[g["id"]] = open_group(g["host"], g["port"], 1, g["world"], torch.device("cpu"), 30)
        buckets = receive(t, groups[g["id"]], torch.device("cpu"))
        got.append({name: v.clone() for name, v in tensors.views(buckets, t["layout"])})
    q.put((got, len(groups)))


def test_nccl_publisher_over_gloo_between_two_processes(tmp_path):
    """The trainer side sends two steps, then a second sender (new group id) a third; the receiver
    process gets each step's tensors exactly and rebuilds its group once."""
    port = free_port()
    store = RunStore(str(tmp_path))
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    proc = ctx.Process(target=_receiver, args=(port, str(tmp_path), 3, q))
    proc.start()
    model = torch.nn.Linear(4, 3)
    model.config = None  # a bare module: no tied embeddings to drop
    sent = []
    try:
        pub = NcclPublisher(store, Parallel(), "float32", port, receivers=1, timeout_s=30)
        for step in range(3):
            if step == 2:
                pub.close()
                pub = NcclPublisher(store, Parallel(), "float32", port, receivers=1, timeout_s=30)
            with torch.no_grad():
                model.weight.add_(1.0)
            sent.append({k: v.clone() for k, v in model.state_dict().items()})
            pub.publish(step, model)
            pub.serve(step)
        got, groups = q.get(timeout=60)
    finally:
        proc.join(timeout=30)
        if proc.is_alive():
            proc.kill()
    assert groups == 2
    for s, g in zip(sent, got, strict=True):
        assert s.keys() == g.keys()
        for k in s:
            assert torch.equal(s[k], g[k])


def _silent_sender(port: int) -> None:
    """Rank 0 of a group that never sends."""
    group = open_group("127.0.0.1", port, 0, 2, torch.device("cpu"), 60)
    time.sleep(120)
    del group


def test_receiver_gives_up_on_a_sender_that_exits_mid_broadcast():
    """A receiver blocked in the broadcast aborts the group and raises SenderDied once the ticket's
    sender process is gone, instead of waiting out the collective's timeout (60 s here). The
    ticket names a process that exits after 1.5 s (and stays a zombie until reaped) while the
    group's rank 0 stays alive and silent, so only rlfleet's check can end the wait."""
    port = free_port()
    holder = mp.get_context("spawn").Process(target=_silent_sender, args=(port,))
    holder.start()
    named = None
    try:
        cpu = torch.device("cpu")
        group = open_group("127.0.0.1", port, 1, 2, cpu, 60)
        named = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(1.5)"])
        t = {
            "group": {"pid": named.pid, "started": psutil.Process(named.pid).create_time()},
            "dtype": "float32",
            "layout": tensors.make_layout(_state(), torch.float32),
        }
        t0 = time.monotonic()
        with pytest.raises(SenderDied, match=f"pid {named.pid}"):
            receive(t, group, cpu)
        assert 1.0 < time.monotonic() - t0 < 15
    finally:
        if named is not None:
            named.kill()
            named.wait()
        holder.kill()
        holder.join()
