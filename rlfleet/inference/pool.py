"""The inference pool of a run: its replicas, the weight version they hold, and self-healing.

A run's pool lives in the controlling process across tasks (held by `rlfleet.runs.handles`), so
the `rollout` task can ask it for healthy URLs and a replica that died is relaunched directly from
the newest published weights. Whatever differs by weight transport the pool asks of the ticket
it holds (`weights.controller`).
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from rlfleet.config.models import InferenceJobConfig
from rlfleet.config.served import POLICY
from rlfleet.errors import DeterministicError, TransientError
from rlfleet.inference.server import (
    Replica,
    healthy,
    launch_replicas,
    post_control,
    probe,
    start_replica,
    start_replicas,
    stop_replicas,
    wait_ready,
)
from rlfleet.procs import wait_until
from rlfleet.progress import Progress
from rlfleet.store import run_store
from rlfleet.weights.client import load
from rlfleet.weights.controller import make_controller
from rlfleet.weights.tickets import write_served

log = logging.getLogger("rlfleet.inference")

WATCH_INTERVAL_S = 1.0  # how often the pool looks at its replicas' processes and /health


class InferencePool:
    """The policy's replicas, or (`cfg.name` another) a `[[served]]` model's: the same launch,
    watch and relaunch, but a frozen pool never loads weights nor writes the served version."""

    def __init__(self, cfg: InferenceJobConfig):
        self.cfg = cfg
        self.frozen = cfg.name != POLICY  # teachers and judges: weights never change on them
        self.replicas: list[Replica] = []
        self.policy_step = -1  # weight version the servers hold; -1 = the initial model
        # the newest weights on disk they loaded: what a relaunch starts from
        self.weights_path: str | None = None
        self.ticket: dict[str, Any] | None = None  # the last weights they loaded, any transport
        self.closed = False  # after shutdown nothing relaunches (a rollout still in flight must not)
        self.starting = False  # `start` ran: the replicas' processes are up, not yet waited for
        self.external_ready = False  # external replicas (inference.urls) were healthy once
        self.dropped: set[str] = set()  # external replicas that stopped answering
        self.asleep = False  # inference.sleep: weights and KV cache freed while the trainer steps
        self.relaunched: list[dict[str, Any]] = []  # dead replicas replaced, until a task reports them
        self.unsynced = False  # relaunched replicas not yet brought to the served weights
        # per URL: the version it samples with, switched between its load and its /resume
        self.versions: dict[str, int] = {}
        # the rollout stream relaunches and the flow broadcasts from different threads
        self.lock = threading.RLock()
        self._watcher: threading.Thread | None = None
        self._stop = threading.Event()
        self.progress = Progress()  # the run's, once a RunHandles adopts the pool (progress.py)

    @property
    def urls(self) -> list[str]:
        if self.cfg.inference.urls:
            return list(self.cfg.inference.urls)
        return [r.url for r in self.replicas]

    def serving(self) -> dict[str, int]:
        """URL -> its replica's process id (external replicas: 0), without the lock: a relaunch
        swaps a replica in only once it serves (`_relaunch`)."""
        if self.cfg.inference.urls:
            return dict.fromkeys(self.cfg.inference.urls, 0)
        return {r.url: r.process.pid or 0 for r in list(self.replicas)}

    def version(self, url: str) -> int:
        """The weight version `url` samples with now (the sampler credits tokens to it)."""
        return self.versions.get(url, self.policy_step)

    def ensure(self) -> list[str]:
        with self.lock:
            urls = self._ensure()
        self._watch_start()
        return urls

    def _watch_start(self) -> None:
        """Once the replicas first serve: a daemon thread relaunches one whose process exited, or
        whose /health fails, within about `WATCH_INTERVAL_S`, instead of when a request to it next
        fails. An idle stream (its groups all finished, waiting for the trainer) sent none, so a
        replica that died then was first noticed by the next broadcast. External replicas are not
        this controller's to relaunch."""
        if self._watcher is None and not self.cfg.inference.urls and not self.closed:
            name = "rlfleet-replica-watch" + ("" if not self.frozen else f"-{self.cfg.name}")
            self._watcher = threading.Thread(target=self._watch, name=name, daemon=True)
            self._watcher.start()

    def _watch(self) -> None:
        while not self._stop.wait(WATCH_INTERVAL_S):
            with self.lock:
                replicas, idle = list(self.replicas), self.starting or self.asleep
            if idle or not replicas:
                continue
            if all(r.process.alive() and probe(r.url) is not False for r in replicas):
                continue
            try:
                self.ensure()  # looks again under the lock: a request's heal may have relaunched it
            except DeterministicError:
                return  # shut down meanwhile
            except Exception as e:  # noqa: BLE001 - the next request or broadcast tries again
                log.warning("relaunching a dead vLLM replica failed (%s: %s)", type(e).__name__, e)

    def start(self) -> None:
        """Start the replicas' processes without waiting for them: the first `ensure` waits."""
        with self.lock:
            if not self.cfg.inference.urls and not self.replicas:
                self.replicas = start_replicas(self.cfg, self.weights_path)
                self.starting = True

    def _ensure(self) -> list[str]:
        """Launch missing or dead replicas (with the current weights) and return all URLs. Dead:
        the process exited, or /health refused or failed (`probe`); a replica too busy to answer
        in time is alive.

        External replicas (`inference.urls`, started by a SLURM job on its inference nodes) are
        only waited for, the first time until all are healthy. One that is down later is
        dropped for good (it could come back holding old weights) and the rollout goes on with
        the others; none left is a transient error.
        """
        if self.closed:
            raise DeterministicError("the inference pool was shut down")
        self.progress.check()  # a stall failed the run: relaunch nothing
        if self.cfg.inference.urls:
            return self._external()
        if self.starting:
            self.starting = False
            try:
                with self.progress.starting_up("vLLM replicas"):
                    wait_ready(self.cfg, self.replicas)
            except BaseException:
                self.replicas = []  # stopped by wait_ready
                raise
        dead = [r for r in self.replicas if not r.process.alive() or probe(r.url) is False]
        for r in dead:
            code = r.process.returncode()
            why = "its /health failed" if code is None else f"it exited with code {code}"
            log.warning(
                "vLLM %s replica %d at %s is dead (%s): relaunching", self.cfg.name, r.index, r.url, why
            )
        if dead or not self.replicas:
            self.relaunched += [
                {"replica": r.index, "exit_code": r.process.returncode(), "weights": self.policy_step}
                for r in dead
            ]
            with self.progress.starting_up("vLLM replicas"):
                self._relaunch(dead)
            self.unsynced = self.ticket is not None
            if not self.frozen:
                write_served(run_store(self.cfg.output_dir), self.policy_step)
        if self.unsynced:
            self._resync()
        return self.urls

    def _relaunch(self, dead: list[Replica]) -> None:
        """The dead replicas alone where the transport allows: the others keep serving (and the
        samples in flight on them go on). Else, or when none runs, all of them."""
        alone = self.ticket is None or make_controller(self.ticket["transport"]).relaunch_alone
        if alone and dead and len(dead) < len(self.replicas):
            stop_replicas(dead)
            offset = self.cfg.inference.replica_offset
            fresh = [start_replica(self.cfg, r.index - offset, self.weights_path) for r in dead]
            by_index = {r.index: r for r in wait_ready(self.cfg, fresh)}
            self.replicas = [by_index.get(r.index, r) for r in self.replicas]
            for r in dead:
                self.versions.pop(r.url, None)
            return
        stop_replicas(self.replicas)
        self.replicas = launch_replicas(self.cfg, self.weights_path)
        self.versions = {}
        self.asleep = False

    def take_relaunched(self) -> list[dict[str, Any]]:
        out, self.relaunched = self.relaunched, []
        return out

    def _resync(self) -> None:
        """Relaunched replicas started from files; their transport brings every replica to the
        weights the pool serves (nccl: maybe the step after). A failure leaves them unsynced, and
        the next `ensure` tries again."""
        assert self.ticket is not None
        store = run_store(self.cfg.output_dir)
        ticket = make_controller(self.ticket["transport"]).resync(
            store, self.ticket, self.cfg.weights.timeout_s
        )
        if ticket is not None:
            log.warning(
                "relaunched vLLM replicas: loading step %d through %s", ticket["step"], ticket["transport"]
            )
            self._load_all(self.urls, ticket)
            self.policy_step, self.ticket = ticket["step"], ticket
            write_served(store, self.policy_step)
            for r in self.relaunched:  # what they serve now
                r["weights"] = self.policy_step
        self.unsynced = False

    def broadcast(self, ticket: dict[str, Any]) -> dict[str, Any]:
        """Load a weights ticket (rlfleet/weights) on every replica at once, requests in flight
        paused in place; a small manifest back."""
        step = ticket["step"]
        if self.frozen:
            raise DeterministicError(f"served model {self.cfg.name!r} is frozen: no weights are loaded on it")
        with self.progress.waiting(f"broadcast-{step}", f"step {step}'s weights to load"), self.lock:
            return self._broadcast(ticket)

    def _broadcast(self, ticket: dict[str, Any]) -> dict[str, Any]:
        start = time.perf_counter()
        urls = self._ensure()
        transport = make_controller(ticket["transport"])
        if transport.skip(ticket, self.policy_step):  # nccl: a relaunch's regroup brought them here
            return self._loaded(start, [])
        if self.asleep:  # weight memory first, then the new weights, then the KV cache
            post_control(urls, "wake_up", self.cfg.weights.timeout_s, tags="weights")
        calls = self._load_all(urls, ticket)
        if self.asleep:
            post_control(urls, "wake_up", self.cfg.weights.timeout_s, tags="kv_cache")
            self.asleep = False
        self.policy_step, self.ticket = ticket["step"], ticket
        self.weights_path = transport.files(ticket) or self.weights_path
        write_served(run_store(self.cfg.output_dir), self.policy_step)  # the cuda_ipc trainer waits on it
        return self._loaded(start, calls)

    def adopt(self, ticket: dict[str, Any]) -> dict[str, Any]:
        """Take `ticket` as what the replicas serve already, loading nothing: a fleet replica whose
        last holder loaded this base model back (fleet/attach.py `serves_base`)."""
        start = time.perf_counter()
        with self.lock:
            self._ensure()
            self.policy_step, self.ticket = ticket["step"], ticket
            self.weights_path = make_controller(ticket["transport"]).files(ticket) or self.weights_path
            write_served(run_store(self.cfg.output_dir), self.policy_step)
            return self._loaded(start, [])

    def _loaded(self, start: float, calls: list[dict[str, Any]]) -> dict[str, Any]:
        assert self.ticket is not None  # set with policy_step by every load
        return {
            "step": self.policy_step,
            "transport": self.ticket["transport"],
            "weights_path": self.weights_path,
            "replicas": self.urls,
            "seconds": time.perf_counter() - start,
            "calls": calls,
        }

    def sleep(self) -> float:
        """Free vLLM's GPU memory for the trainer (level 2: weights are not kept; the next
        broadcast brings new ones); seconds taken."""
        start = time.perf_counter()
        with self.lock:
            if self.cfg.inference.sleep and not self.asleep:
                post_control(self._ensure(), "sleep", self.cfg.weights.timeout_s, level="2")
                self.asleep = True
        return time.perf_counter() - start

    def _load_all(self, urls: list[str], ticket: dict[str, Any]) -> list[dict[str, Any]]:
        """Concurrently: an nccl broadcast needs every replica's workers in it at once."""
        tp, w = self.cfg.inference.tensor_parallel_size, self.cfg.weights

        def one(i: int, url: str) -> dict[str, Any]:
            def loaded() -> None:
                self.versions[url] = ticket["step"]

            with self.progress.loading(url, ticket["step"]):
                return load(url, ticket, 1 + i * tp, w.timeout_s, w.in_flight_kv, loaded)

        with ThreadPoolExecutor(max(len(urls), 1)) as ex:
            return list(ex.map(one, range(len(urls)), urls))

    def _external(self) -> list[str]:
        if not self.external_ready:
            for url in self.urls:
                wait_until(
                    lambda url=url: healthy(url), self.cfg.inference.startup_timeout_s, what=f"vLLM at {url}"
                )
            self.external_ready = True
        for url in self.urls:
            if url in self.dropped or probe(url) is not False:
                continue
            if self.cfg.fleet is None:
                log.warning("external vLLM replica %s stopped answering; dropped from the pool", url)
                self.dropped.add(url)
                continue
            self._rejoin(url)
        live = [u for u in self.urls if u not in self.dropped]
        if not live:
            raise TransientError(f"no external vLLM replica is healthy: {self.urls}")
        return live

    def _rejoin(self, url: str) -> None:
        """A fleet's replica that stopped answering: its fleet relaunches it (from the base model),
        so wait for it, then load what this run serves on it. It is never dropped: a fleet's
        replica does come back, and with the weights this load gives it."""
        log.warning(
            "fleet %s's replica %s stopped answering: waiting for the fleet to relaunch it",
            self.cfg.fleet,
            url,
        )
        with self.progress.starting_up(f"fleet {self.cfg.fleet}'s replica"):
            wait_until(lambda: healthy(url), self.cfg.inference.startup_timeout_s, what=f"vLLM at {url}")
        self.relaunched.append(
            {"replica": self.urls.index(url), "exit_code": None, "weights": self.policy_step}
        )
        if self.ticket is not None:
            self.versions.pop(url, None)
            self._load_all([url], self.ticket)

    def shutdown(self) -> None:
        self.closed = True
        self._stop.set()
        with self.lock:
            stop_replicas(self.replicas)
            self.replicas = []
