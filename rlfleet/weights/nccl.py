"""The nccl transport: trainer rank 0 broadcasts the weights to every vLLM worker.

The group is trainer rank 0 (under FSDP2 the other ranks only join the full-tensor gather of each
publish, `publisher.Follower`) plus each replica's workers (rank 1 + replica x tp + tp rank),
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
sender runs (`controller.Nccl`). Every member is on one node (`config/weights.py`), so "gone" is a
local process check.

A relaunched vLLM replica is a new member, and a group cannot grow: the controller asks for a new
one (`controller.regroup`, `sync/regroup.json`). The trainer answers between steps or from inside a send it
is waiting on (which it abandons): it opens a group with the request's id, rewrites its newest
ticket to name it, writes that ticket as the answer (`sync/regrouped.json`) and sends those
weights again; the controller loads the answer on every replica, old and new. The newest weights
are at least the served step (a relaunched trainer still replaying waits until it is there), so
the pool can only move forward.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from rlfleet.config.dtypes import torch_dtype
from rlfleet.config.models import TrainerJobConfig
from rlfleet.procs import running, this_process, wait_until
from rlfleet.store import RunStore
from rlfleet.trainer.hf_export import sent_state
from rlfleet.trainer.parallel import Parallel
from rlfleet.weights import tensors
from rlfleet.weights.publisher import Follower, vllm_dtype
from rlfleet.weights.tickets import REGROUP, REGROUPED, sender_running, served_step, ticket_rel

log = logging.getLogger("rlfleet.weights")


class SenderDied(RuntimeError):
    """The trainer process that was sending the weights exited; its relaunch sends them again."""


class Regrouped(RuntimeError):
    """The controller asked for a new group while a send waited: the send is abandoned."""


@dataclass
class Group:
    pg: dist.ProcessGroup
    store: dist.TCPStore  # on rank 0 the rendezvous server: it lives as long as the group


def rendezvous(host: str, port: int, rank: int, world: int, timeout_s: float) -> dist.TCPStore:
    """The group's store; rank 0 hosts it (port 0: a free one, `.port`)."""
    timeout = timedelta(seconds=timeout_s)
    return dist.TCPStore(host, port, world, is_master=rank == 0, timeout=timeout, wait_for_workers=False)


def open_group(
    host: str,
    port: int,
    rank: int,
    world: int,
    device: torch.device,
    timeout_s: float,
    store: dist.TCPStore | None = None,
) -> Group:
    """A process group of its own (not the default one) over `store` (else a new `rendezvous`).
    gloo connects every member here; NCCL at the first collective."""
    timeout = timedelta(seconds=timeout_s)
    store = store or rendezvous(host, port, rank, world, timeout_s)
    if device.type == "cuda":
        torch.cuda.set_device(device)
        opts = dist.ProcessGroupNCCL.Options()
        opts._timeout = timeout
        pg = dist.ProcessGroupNCCL(store, rank, world, opts)
    else:
        pg = dist.ProcessGroupGloo(store, rank, world, timeout)
    return Group(pg, store)


def broadcast(
    group: Group, buckets: list[torch.Tensor], stop: Callable[[], Exception | None] | None = None
) -> None:
    """Rank 0 sends `buckets`, the others receive into theirs. With `stop`, the wait polls it and
    aborts the group, raising what it returns, as soon as it returns an exception: a receiver's
    sender is gone (SenderDied), a sender was asked for a new group (Regrouped)."""
    opts = dist.BroadcastOptions()
    opts.rootRank = 0
    works = [group.pg.broadcast([b], opts) for b in buckets]
    if stop is not None:
        pause = 1e-4
        while not all(w.is_completed() for w in works):
            if (exc := stop()) is not None:
                group.pg.abort()
                raise exc
            time.sleep(pause)
            pause = min(pause * 2, 0.005)
    for w in works:
        w.wait()  # raises what the backend saw
    if buckets and buckets[0].is_cuda:
        torch.cuda.synchronize(buckets[0].device)


def sender_gone(ticket: dict[str, Any]) -> Callable[[], Exception | None]:
    def check() -> Exception | None:
        if sender_running(ticket):
            return None
        return SenderDied(f"the trainer (pid {ticket['group']['pid']}) exited during the weight broadcast")

    return check


class NcclPublisher:
    def __init__(
        self, store: RunStore, par: Parallel, dtype: str, port: int, receivers: int, timeout_s: float
    ):
        self.store, self.par, self.dtype = store, par, torch_dtype(dtype)
        self.port, self.world, self.timeout_s = port, 1 + receivers, timeout_s
        self.group_id = f"{os.getpid()}-{time.time_ns()}"
        self.sender = this_process()
        self.group: Group | None = None
        self.layout: list | None = None
        self.buckets: list[torch.Tensor] = []
        self.ticket: dict[str, Any] | None = None  # the newest one written: what the buckets hold
        self.next_look = 0.0  # when to read the regroup request again

    def publish(self, step: int, model: torch.nn.Module) -> None:
        sd = sent_state(model, self.par)
        if self.layout is None:
            self.layout = tensors.make_layout(sd, self.dtype)
            sizes = tensors.bucket_sizes(self.layout)
            self.buckets = [torch.empty(n, dtype=self.dtype, device=self.par.device) for n in sizes]
        tensors.fill(self.buckets, self.layout, sd)
        self.ticket = {
            "transport": "nccl",
            "step": step,
            "group": self._group_info(),
            "timeout_s": self.timeout_s,
            "dtype": str(self.dtype).removeprefix("torch."),
            "layout": self.layout,
        }
        self.store.write_json(ticket_rel(step), self.ticket)

    def _group_info(self) -> dict[str, Any]:
        return {
            "id": self.group_id,
            "host": "127.0.0.1",
            "port": self.port,
            "world": self.world,
            **self.sender,
        }

    def serve(self, step: int) -> None:
        if (held := served_step(self.store)) is not None and held >= step:
            self.poll()  # a replayed step: the replicas are past it and nobody will receive it
            return
        self._send()

    def poll(self) -> None:
        """Between steps (the trainer polls this while it waits for a batch): answer a regroup
        request, once the newest weights here are the served ones or newer."""
        if self.ticket is None or not self._due() or self._request() is None:
            return
        if (held := served_step(self.store)) is not None and self.ticket["step"] < held:
            return  # a relaunched trainer still replaying: it answers when it gets there
        self._send()

    def _send(self) -> None:
        """Send the newest weights; a regroup request, pending or arriving while the receivers are
        awaited, first moves them to a new group."""
        while True:
            if (request := self._request()) is not None:
                self._regroup(request["id"])
            if self.group is None:
                self.group = open_group(
                    "127.0.0.1", self.port, 0, self.world, self.par.device, self.timeout_s
                )
            try:
                return broadcast(self.group, self.buckets, stop=self._asked_to_regroup)
            except Regrouped:
                self.group = None
            except RuntimeError as e:  # a member is gone (gloo says so; NCCL hangs: see `stop`)
                self.group = None
                self._await_request(e)

    def _await_request(self, error: RuntimeError) -> None:
        """A receiver died: its replica's relaunch brings a regroup request; without one in
        `timeout_s`, the send's error stands."""
        wait_until(
            lambda: self._request() is not None,
            self.timeout_s,
            0.05,
            "a regroup request",
            on_timeout=lambda: error,
        )

    def _request(self) -> dict[str, Any] | None:
        """The controller's regroup request, unless it was answered (by this trainer or a dead
        one) or the controller that asked is gone (nobody would receive)."""
        if not self.store.exists(REGROUP):
            return None
        request = self.store.read_json(REGROUP)
        answered = self.store.read_json(REGROUPED) if self.store.exists(REGROUPED) else {"group": {}}
        if answered["group"].get("id") == request["id"] or not running(**request["by"]):
            return None
        return request

    def _due(self) -> bool:
        """Whether to read the request file again: a local stat is cheap, an object store's is not."""
        now = time.monotonic()
        if now < self.next_look:
            return False
        self.next_look = now + (0.02 if self.store.is_local else 0.2)
        return True

    def _asked_to_regroup(self) -> Exception | None:
        if self._due() and self._request() is not None:
            return Regrouped("the controller asked for a new weight-sync group")
        return None

    def _regroup(self, request_id: str) -> None:
        """A new group named by the request (rendezvous on a free port), the newest ticket
        rewritten to name it, and that ticket as the answer."""
        assert self.ticket is not None
        store = rendezvous("127.0.0.1", 0, 0, self.world, self.timeout_s)
        self.group_id, self.port = request_id, store.port
        self.ticket = {**self.ticket, "group": self._group_info()}
        self.store.write_json(ticket_rel(self.ticket["step"]), self.ticket)
        self.store.write_json(REGROUPED, self.ticket)  # the members connect once they read it
        log.warning(
            "weight sync: a new group (%s, port %d) for a relaunched vLLM replica; sending step %d again",
            request_id,
            self.port,
            self.ticket["step"],
        )
        self.group = open_group("127.0.0.1", self.port, 0, self.world, self.par.device, self.timeout_s, store)

    def close(self) -> None:
        self.group = None  # drops the rendezvous server with it


def publisher(cfg: TrainerJobConfig, store: RunStore, par: Parallel) -> NcclPublisher | Follower:
    """Rank 0 sends; under FSDP2 the other ranks only join each publish's gather."""
    if not par.is_main:
        return Follower(par)
    w = cfg.weights
    return NcclPublisher(store, par, vllm_dtype(cfg, par), w.nccl_port, cfg.inference.workers, w.timeout_s)


def receive(ticket: dict[str, Any], group: Group, device: torch.device) -> list[torch.Tensor]:
    """The buckets of `ticket`, received from rank 0 into fresh buffers on `device`."""
    dtype = torch_dtype(ticket["dtype"])
    buckets = [torch.empty(n, dtype=dtype, device=device) for n in tensors.bucket_sizes(ticket["layout"])]
    broadcast(group, buckets, stop=sender_gone(ticket))
    return buckets


def worker_receive(
    worker: Any, ticket: dict[str, Any], rank_base: int, device: torch.device
) -> Iterator[tuple[str, torch.Tensor]]:
    """A vLLM worker's share of the broadcast: its member of the trainer's group (`worker_group`)
    receives the buckets, read back as views by name."""
    group = worker_group(worker, ticket, rank_base, device)
    try:
        buckets = receive(ticket, group, device)
    except BaseException:
        worker._rlfleet_pg = None  # aborted or broken: the next ticket builds a new one
        raise
    return tensors.views(buckets, ticket["layout"])


def worker_group(worker: Any, ticket: dict[str, Any], rank_base: int, device: torch.device) -> Group:
    """The worker's member of the trainer's group, kept on the worker; rebuilt when a new trainer
    names a new one."""
    g = ticket["group"]
    cached = getattr(worker, "_rlfleet_pg", None)
    if cached is None or cached[0] != g["id"]:
        # a sender gone took its rendezvous store with it: connecting would wait out the timeout
        if not sender_running(ticket):
            raise SenderDied(
                f"the trainer (pid {g['pid']}) that wrote the step {ticket['step']} ticket exited"
            )
        if cached is not None:
            cached[1].pg.abort()  # the previous trainer's group; its sender is gone
        rank = rank_base + getattr(worker, "rank", 0)
        group = open_group(g["host"], g["port"], rank, g["world"], device, ticket["timeout_s"])
        worker._rlfleet_pg = (g["id"], group)
    return worker._rlfleet_pg[1]
