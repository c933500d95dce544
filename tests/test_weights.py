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
from rlfleet.weights import tensors, tickets
from rlfleet.weights.nccl import NcclPublisher, SenderDied, open_group, receive
from rlfleet.weights.tickets import served_step, trainer_ticket, wait_served, write_served
from tests.helpers import free_port


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


def test_wait_served_blocks_until_the_controller_acknowledges(tmp_path, monkeypatch):
    """The waiter sees step 3 acknowledged and keeps waiting; it returns only after step 4's
    acknowledgement is written, having read it. The order of events says so, not a duration."""
    store = RunStore(str(tmp_path))
    with pytest.raises(TimeoutError, match="vLLM still holds weights None after 0 s; step 0"):
        wait_served(store, 0, timeout_s=0.05)
    write_served(store, 3)
    events: list[tuple] = []
    saw_older = threading.Event()

    def observed(s: RunStore) -> int | None:  # what the waiter reads, in the order it reads it
        held = served_step(s)
        events.append(("read", held))
        if held == 3:
            saw_older.set()
        return held

    monkeypatch.setattr(tickets, "served_step", observed)

    def wait() -> None:
        wait_served(store, 4, timeout_s=60)  # a safety net: the test writes step 4 long before
        events.append(("returned",))

    waiter = threading.Thread(target=wait)
    waiter.start()
    assert saw_older.wait(60), "the waiter never read the acknowledgement of step 3"
    assert waiter.is_alive() and ("returned",) not in events  # step 3 does not release it
    events.append(("wrote", 4))
    write_served(store, 4)
    waiter.join(timeout=60)
    assert not waiter.is_alive()
    wrote = events.index(("wrote", 4))
    assert set(events[:wrote]) == {("read", 3)}  # before step 4: only step 3 read, never a return
    assert events[-2:] == [("read", 4), ("returned",)]  # it returned on reading step 4
    assert served_step(store) == 4


def test_missing_ticket_names_the_step(tmp_path):
    with pytest.raises(FileNotFoundError, match="no nccl weights ticket for step 7"):
        trainer_ticket(RunStore(str(tmp_path)), 7, "nccl")


def by_value(named) -> dict:
    """Tensors as numpy arrays, which a Queue pickles by value: a tensor goes by file descriptor,
    which the parent can open only while this process lives (it may exit first)."""
    return {name: v.clone().numpy() for name, v in named}


def as_tensors(arrays: dict) -> dict[str, torch.Tensor]:
    return {name: torch.from_numpy(a) for name, a in arrays.items()}


def _receiver(port: int, out_dir: str, steps: int, q) -> None:
    """A second process: joins each ticket's group as rank 1 and returns what it received."""
    store = RunStore(out_dir)
    groups: dict[str, object] = {}
    got = []
    for step in range(steps):
        while not store.exists(f"sync/step_{step}.json"):
            time.sleep(0.01)
        t = trainer_ticket(store, step, "nccl")
        g = t["group"]
        if g["id"] not in groups:  # a new sender (a relaunched trainer) means a new group
            groups[g["id"]] = open_group(g["host"], g["port"], 1, g["world"], torch.device("cpu"), 30)
        buckets = receive(t, groups[g["id"]], torch.device("cpu"))
        got.append(by_value(tensors.views(buckets, t["layout"])))
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
        got = [as_tensors(g) for g in got]
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


def test_receiver_gives_up_on_a_sender_that_exits_mid_broadcast(monkeypatch):
    """A receiver blocked in the broadcast aborts the group and raises SenderDied once the ticket's
    sender process is gone, instead of waiting out the collective's timeout (60 s here). The
    ticket names a process that exits (and stays a zombie until reaped) only after the receiver
    has found it alive from inside the broadcast, while the group's rank 0 stays alive and
    silent, so only rlfleet's check can end the wait: the events come in that order."""
    from rlfleet.weights import nccl

    port = free_port()
    holder = mp.get_context("spawn").Process(target=_silent_sender, args=(port,))
    holder.start()
    named = None
    events: list[tuple] = []
    checked_alive = threading.Event()

    def observed(ticket: dict) -> bool:  # the receiver's check of its sender, as it makes it
        alive = nccl_sender_running(ticket)
        events.append(("sender running", alive))
        if alive:
            checked_alive.set()
        return alive

    nccl_sender_running = nccl.sender_running
    monkeypatch.setattr(nccl, "sender_running", observed)

    def end_sender() -> None:  # once the receiver waits in the broadcast, the sender exits
        if checked_alive.wait(60):
            events.append(("sender exits",))
            named.stdin.close()

    try:
        cpu = torch.device("cpu")
        group = open_group("127.0.0.1", port, 1, 2, cpu, 60)
        named = subprocess.Popen(
            [sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE
        )
        t = {
            "group": {"pid": named.pid, "started": psutil.Process(named.pid).create_time()},
            "dtype": "float32",
            "layout": tensors.make_layout(_state(), torch.float32),
        }
        ender = threading.Thread(target=end_sender)
        ender.start()
        with pytest.raises(SenderDied, match=f"pid {named.pid}"):
            receive(t, group, cpu)
        events.append(("raised",))
        ender.join(timeout=60)
        assert holder.is_alive()  # rank 0 never sent nor left: the collective itself had not ended
        exits = events.index(("sender exits",))
        assert ("sender running", True) in events[:exits] and ("sender running", False) not in events[:exits]
        assert events[-2:] == [("sender running", False), ("raised",)]
    finally:
        if named is not None:
            named.kill()
            named.wait()
        holder.kill()
        holder.join()


def _receive_regrouped(out_dir: str, not_id: str, q) -> None:
    """A relaunched replica's worker: joins the group of the trainer's next regroup answer."""
    from rlfleet.weights.tickets import REGROUPED

    store = RunStore(out_dir)
    while not store.exists(REGROUPED) or store.read_json(REGROUPED)["group"]["id"] == not_id:
        time.sleep(0.01)
    t = store.read_json(REGROUPED)
    g = t["group"]
    group = open_group(g["host"], g["port"], 1, g["world"], torch.device("cpu"), 30)
    buckets = receive(t, group, torch.device("cpu"))
    q.put((t["step"], by_value(tensors.views(buckets, t["layout"]))))


def test_nccl_regroup_brings_a_relaunched_receiver_to_the_newest_weights(tmp_path):
    """A send nobody will receive (its receiver died) is abandoned for a new group once the
    controller asks (`regroup`); a new receiver joins it and gets exactly the newest weights. A
    trainer idle between steps answers from `poll`. The step's ticket names the new group."""
    from rlfleet.weights.controller import regroup

    store = RunStore(str(tmp_path))
    ctx = mp.get_context("spawn")
    model = torch.nn.Linear(4, 3)
    model.config = None
    pub = NcclPublisher(store, Parallel(), "float32", free_port(), receivers=1, timeout_s=60)

    def regroup_with(not_id: str, trainer_side) -> tuple[dict, int, dict]:
        q, done = ctx.Queue(), threading.Event()
        proc = ctx.Process(target=_receive_regrouped, args=(str(tmp_path), not_id, q))
        proc.start()
        worker = threading.Thread(target=trainer_side, args=(done,))
        worker.start()
        try:
            answer = regroup(store, timeout_s=30)
            step, got = q.get(timeout=60)
            got = as_tensors(got)
        finally:
            done.set()
            worker.join(timeout=30)
            proc.join(timeout=30)
            if proc.is_alive():
                proc.kill()
        assert not worker.is_alive()
        return answer, step, got

    first_q = ctx.Queue()  # a replica's worker that takes step 0, then dies
    old = ctx.Process(target=_receiver, args=(pub.port, str(tmp_path), 1, first_q))
    old.start()
    pub.publish(0, model)
    pub.serve(0)
    first_q.get(timeout=60)
    old.join(timeout=30)
    with torch.no_grad():
        model.weight.add_(1.0)
    sent = {k: v.clone() for k, v in model.state_dict().items()}
    pub.publish(1, model)
    # its send to the dead member fails or hangs; either way the regroup request moves it on
    first, step, got = regroup_with("", lambda done: pub.serve(1))
    assert step == 1 and first["step"] == 1 and first["group"]["id"].startswith("regroup-")
    assert trainer_ticket(store, 1, "nccl")["group"] == first["group"]
    assert all(torch.equal(sent[k], got[k]) for k in sent)

    def idle(done: threading.Event) -> None:  # the trainer waiting for its next batch
        while not done.is_set():
            pub.poll()
            time.sleep(0.01)

    write_served(store, 1)
    second, step, got = regroup_with(first["group"]["id"], idle)
    assert step == 1 and second["group"]["id"] != first["group"]["id"]
    assert trainer_ticket(store, 1, "nccl")["group"] == second["group"]
    assert all(torch.equal(sent[k], got[k]) for k in sent)
    pub.close()
