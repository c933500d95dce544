"""The controller's side of the seam: one class of rules per transport, which the registry
(config/weights.py) names and `make_controller` builds with the transport's name.

Each class owns every controller-side rule that differs by transport: where step N's ticket comes
from (`ticket`), what replicas relaunched from files load to serve the pool's weights again
(`resync`), which broadcast loads nothing (`skip`), which directory a relaunch starts from
(`files`) and whether one replica may be relaunched alone (`relaunch_alone`). The pool and the broadcast task ask these and never test a transport's name; a new
transport is one class here, one registry entry, and its own module (publisher and receiver).

The pool picks by the ticket it holds, not by the config: a resumed run loads files whatever its
transport, and a replica relaunched then needs nothing more. The classes hold no state and no
store (`run_store` is opened per call, so that a credentials change reaches it). Import-light:
the flow imports this module, never torch.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

from rlfleet.config.weights import FILES, transport_config
from rlfleet.procs import this_process, wait_until
from rlfleet.store import RunStore
from rlfleet.weights.tickets import REGROUP, REGROUPED, newest_weights, sender_running, trainer_ticket

Ticket = dict[str, Any]  # JSON: it crosses into vLLM's workers and the trainer's process


class Trainer(Protocol):
    """The trainer as the controller watches it (`trainer.launch.TrainerProcess`)."""

    def failure(self, store: RunStore, step: int) -> Exception | None:
        """The error to raise if it died, else None."""


@dataclass(frozen=True)
class Sender:
    """How the broadcast keeps the trainer that sends step N's weights running (nccl)."""

    running: Callable[[], Trainer]  # the trainer, relaunched if it died: it replays step N
    timeout_s: float  # how long to wait for a ticket whose sender runs (a replay included)


class ControllerTransport(Protocol):
    name: str  # the transport's, from the registry
    # whether a dead replica can be relaunched alone while the others serve on (not when every
    # replica is in one group that cannot grow)
    relaunch_alone: ClassVar[bool]

    def ticket(self, store: RunStore, step: int, sender: Sender | None = None) -> Ticket:
        """Step N's ticket for the broadcast. `sender` keeps a sending trainer running; without
        one the ticket is taken as written (a sender in this process: tests, benchmarks)."""

    def resync(self, store: RunStore, held: Ticket, timeout_s: float) -> Ticket | None:
        """What replicas relaunched from `files` load, every replica together, to serve `held`
        again; None: the files are `held`'s weights."""

    def skip(self, ticket: Ticket, served: int) -> bool:
        """Whether broadcasting `ticket` to replicas that serve step `served` loads nothing."""

    def files(self, ticket: Ticket) -> str | None:
        """The directory holding `ticket`'s weights, which a relaunched replica starts from;
        None: not in files (the pool keeps the last directory it had)."""


def files_ticket(store: RunStore, step: int) -> Ticket:
    """The newest verified weights at or before `step`: what a resumed run loads, any transport.
    Sizes only (checksum=False): this run's trainer hashed them as it wrote them."""
    s, path = newest_weights(store, step, checksum=False)
    return {"transport": FILES, "step": s, "path": path}


@dataclass(frozen=True)
class Filesystem:
    """`weights/step_N`, reloaded in place; a relaunched replica starts from the same files."""

    name: str
    relaunch_alone: ClassVar[bool] = True

    def ticket(self, store: RunStore, step: int, sender: Sender | None = None) -> Ticket:
        return files_ticket(store, step)

    def resync(self, store: RunStore, held: Ticket, timeout_s: float) -> Ticket | None:
        return None

    def skip(self, ticket: Ticket, served: int) -> bool:
        return False

    def files(self, ticket: Ticket) -> str | None:
        return ticket["path"]


@dataclass(frozen=True)
class CudaIpc:
    """The trainer's GPU buffers, mapped by vLLM. The trainer keeps the served step's buffer until
    the controller acknowledges the next (`write_served`), so a relaunched replica maps it again."""

    name: str
    relaunch_alone: ClassVar[bool] = True

    def ticket(self, store: RunStore, step: int, sender: Sender | None = None) -> Ticket:
        return trainer_ticket(store, step, self.name)

    def resync(self, store: RunStore, held: Ticket, timeout_s: float) -> Ticket | None:
        return held

    def skip(self, ticket: Ticket, served: int) -> bool:
        return False

    def files(self, ticket: Ticket) -> str | None:
        return None


@dataclass(frozen=True)
class Nccl:
    """A broadcast from the trainer, which sends each step once, to a group that cannot grow: a
    relaunched replica needs a new group (`regroup`), and the trainer's answer brings every
    replica to its newest weights, so the broadcast of a step the pool then serves loads nothing."""

    name: str
    relaunch_alone: ClassVar[bool] = False

    def ticket(self, store: RunStore, step: int, sender: Sender | None = None) -> Ticket:
        if sender is None:
            return trainer_ticket(store, step, self.name)
        trainer = sender.running()
        return live_ticket(store, step, self.name, lambda: trainer.failure(store, step), sender.timeout_s)

    def resync(self, store: RunStore, held: Ticket, timeout_s: float) -> Ticket | None:
        return regroup(store, timeout_s)

    def skip(self, ticket: Ticket, served: int) -> bool:
        return ticket["step"] <= served

    def files(self, ticket: Ticket) -> str | None:
        return None


def make_controller(transport: str) -> ControllerTransport:
    """The controller's rules for `transport`: `weights.transport`, or a held ticket's."""
    return transport_config(transport).part("controller")(transport)


def live_ticket(
    store: RunStore,
    step: int,
    transport: str,
    failure: Callable[[], Exception | None],
    timeout_s: float,
    poll_s: float = 0.2,
) -> Ticket:
    """Step N's ticket of a sending `transport` (nccl), once its sender runs: a relaunched trainer
    replays up to step N and writes it again. `failure()` names a trainer that died meanwhile (raised)."""

    def written() -> Ticket | None:
        t = trainer_ticket(store, step, transport)
        return t if sender_running(t) else None

    return wait_until(
        written,
        timeout_s,
        poll_s,
        abort=failure,
        on_timeout=lambda: TimeoutError(
            f"no running trainer wrote the step {step} {transport} ticket in {timeout_s:.0f} s"
        ),
    )


def regroup(store: RunStore, timeout_s: float, poll_s: float = 0.05) -> Ticket:
    """Ask the trainer for a new nccl group and return its answer, a ticket of the newest weights
    to load on every replica. Raises TimeoutError if no running trainer answers in `timeout_s` (a
    dead one is relaunched by the next task; the request stays and is answered then)."""
    request_id = f"regroup-{os.getpid()}-{time.time_ns()}"
    store.write_json(REGROUP, {"id": request_id, "by": this_process()})

    def answered() -> Ticket | None:
        answer = store.read_json(REGROUPED) if store.exists(REGROUPED) else None
        return answer if answer and answer["group"]["id"] == request_id and sender_running(answer) else None

    return wait_until(
        answered,
        timeout_s,
        poll_s,
        on_timeout=lambda: TimeoutError(
            f"no running trainer answered the weight-sync regroup request in {timeout_s:.0f} s"
        ),
    )
