"""The nccl transport: trainer rank 0 broadcasts the weights to every vLLM worker.

The group is the trainer (rank 0) plus each replica's workers (rank 1 + replica x tp + tp rank),
built from a TCPStore the trainer hosts on `weights.nccl_port`; it is private to weight sync, apart
from the trainer's and vLLM's own groups. Its id is the trainer process's, so a relaunched trainer
builds a new group and each worker joins the new one on the first ticket that names it. The
backend follows the device: NCCL on GPUs, gloo on CPUs (how the CPU tests run this code).

Order inside a trainer step: `publish` writes the ticket before the step's metrics (the
controller's "step done"), `serve` sends after them, blocking until the controller has asked every
replica to receive; a send never waits on anything the controller does after that. A relaunched
trainer replaying steps the replicas already hold (`run/weights_served.json`) sends nothing for them.

A trainer that dies mid-send must not leave a worker in the collective until the timeout (prime-rl
#1667): the ticket names the sending process, a receiver polls its work and aborts the group once
that process is gone, and the controller relaunches the trainer and waits for a ticket whose
sender runs (`tasks/rl.py`). Every member is on one node (`config/weights.py`), so "gone" is a
local process check.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from rlfleet.procs import running, this_process
from rlfleet.store import RunStore
from rlfleet.trainer.parallel import Parallel
from rlfleet.trainer.train import DTYPES
from rlfleet.weights import tensors
from rlfleet.weights.tickets import served_step, ticket, ticket_rel


class SenderDied(RuntimeError):
    """The trainer process that was sending the weights exited; its relaunch sends them again."""


@dataclass
class Group:
    pg: dist.ProcessGroup
    store: dist.TCPStore  # on rank 0 the rendezvous server: it lives as long as the group


def open_group(host: str, port: int, rank: int, world: int, device: torch.device, timeout_s: float) -> Group:
    """A process group of its own (not the default one), rank 0 hosting the rendezvous store."""
    timeout = timedelta(seconds=timeout_s)
    store = dist.TCPStore(host, port, world, is_master=rank == 0, timeout=timeout, wait_for_workers=False)
    if device.type == "cuda":
        torch.cuda.set_device(device)
        opts = dist.ProcessGroupNCCL.Options()
        opts._timeout = timeout
        pg = dist.ProcessGroupNCCL(store, rank, world, opts)
    else:
        pg = dist.ProcessGroupGloo(store, rank, world, timeout)
    return Group(pg, store)


def sender_running(ticket: dict[str, Any]) -> bool:
    g = ticket["group"]
    return running(g["pid"], g["started"])


def live_ticket(
    store: RunStore, step: int, failure: Callable[[], Exception | None], timeout_s: float, poll_s: float = 0.2
) -> dict[str, Any]:
    """Step N's ticket, once its sender runs: a relaunched trainer replays up to step N and writes
    it again. `failure()` names a trainer that died meanwhile (raised)."""
    deadline = time.monotonic() + timeout_s
    while not sender_running(t := ticket(store, step, "nccl")):
        if (error := failure()) is not None:
            raise error
        if time.monotonic() > deadline:
            raise TimeoutError(f"no running trainer wrote the step {step} nccl ticket in {timeout_s:.0f} s")
        time.sleep(poll_s)
    return t


def broadcast(group: Group, buckets: list[torch.Tensor], sender: dict[str, Any] | None = None) -> None:
    """Rank 0 sends `buckets`, the others receive into theirs. A receiver given the `sender`
    ticket polls its work and aborts the group if the sending process is gone (SenderDied)."""
    opts = dist.BroadcastOptions()
    opts.rootRank = 0
    if sender is None:
        for b in buckets:
            group.pg.broadcast([b], opts).wait()
    else:
        works = [group.pg.broadcast([b], opts) for b in buckets]
        pause = 1e-4
        while not all(w.is_completed() for w in works):
            if not sender_running(sender):
                group.pg.abort()
                raise SenderDied(
                    f"the trainer (pid {sender['group']['pid']}) exited during the weight broadcast"
                )
            time.sleep(pause)
            pause = min(pause * 2, 0.005)
        for w in works:
            w.wait()  # raises what the backend saw
    if buckets and buckets[0].is_cuda:
        torch.cuda.synchronize(buckets[0].device)


class NcclPublisher:
    def __init__(
        self, store: RunStore, par: Parallel, dtype: str, port: int, receivers: int, timeout_s: float
    ):
        self.store, self.par, self.dtype = store, par, DTYPES[dtype]
        self.port, self.world, self.timeout_s = port, 1 + receivers, timeout_s
        self.group_id = f"{os.getpid()}-{time.time_ns()}"
        self.sender = this_process()
        self.group: Group | None = None
        self.layout: list | None = None
        self.buckets: list[torch.Tensor] = []

    def publish(self, step: int, model: torch.nn.Module) -> None:
        sd = tensors.full_state_dict(model, self.par.enabled)
        if self.layout is None:
            self.layout = tensors.make_layout(sd, self.dtype)
            sizes = tensors.bucket_sizes(self.layout)
            self.buckets = [torch.empty(n, dtype=self.dtype, device=self.par.device) for n in sizes]
        tensors.fill(self.buckets, self.layout, sd)
        ticket: dict[str, Any] = {
            "transport": "nccl",
            "step": step,
            "group": {
                "id": self.group_id,
                "host": "127.0.0.1",
                "port": self.port,
                "world": self.world,
                **self.sender,
            },
            "timeout_s": self.timeout_s,
            "dtype": str(self.dtype).removeprefix("torch."),
            "layout": self.layout,
        }
        self.store.write_json(ticket_rel(step), ticket)

    def serve(self, step: int) -> None:
        if (held := served_step(self.store)) is not None and held >= step:
            return  # a replayed step: the replicas are past it and nobody will receive it
        if self.group is None:
            self.group = open_group("127.0.0.1", self.port, 0, self.world, self.par.device, self.timeout_s)
        broadcast(self.group, self.buckets)

    def close(self) -> None:
        self.group = None  # drops the rendezvous server with it


def receive(ticket: dict[str, Any], group: Group, device: torch.device) -> list[torch.Tensor]:
    """The buckets of `ticket`, received from rank 0 into fresh buffers on `device`."""
    dtype = DTYPES[ticket["dtype"]]
    buckets = [torch.empty(n, dtype=dtype, device=device) for n in tensors.bucket_sizes(ticket["layout"])]
    broadcast(group, buckets, sender=ticket)
    return buckets
