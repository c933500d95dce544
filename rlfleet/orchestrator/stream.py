"""Continuous rollouts: groups are sampled without a step barrier into a buffer in the run store,
and step N takes the first finished groups whose tokens all come from weights it may train on.

A background thread runs one event loop. It starts a group (one prompt, `group_size`
trajectories, each its own coroutine) whenever the steps that are still to be taken need more
groups than are in flight or buffered: the groups for steps `taken .. served + 1 + k`, where
`served` is the weight version the pool holds and k is `max_async_level`. With k = 0 that is one
step's groups on the newest weights (on-policy); with k >= 1 the replicas keep sampling while the
trainer steps and while weights change (the pool loads them with requests paused in place).

A finished group is written to `buffer/groups/<uid>.json` before it is taken, so a controller that
restarts loses no group still within bound. `take(N)` waits for each env's share of
`batch_size` groups with `N-1-m <= oldest token's version` and `newest <= N-1` (m is
`max_staleness`: `max_off_policy_steps`, or k when unset), publishes them as
`rollouts/step_N` and removes them from the buffer; groups that can no longer train any step are
dropped and counted, and those still in flight are cancelled (`aborted_stale`).

Batch shaping (`orchestrator.shaping`, rules in orchestrator/shaping.py) happens where a group
finishes. With dynamic sampling a group whose rewards all equal is held aside instead of entering
the buffer (`dropped_zero_variance`), and the demand is counted per env, so the stream samples
another prompt of that env in its place (`refilled`), until `max_refill` refills were started
since the last take. Then held groups count as buffered: the step waits for its env's groups in
flight and fills what is still missing with held ones, oldest first. Held groups are written to
the buffer like the others (a restarted controller holds them again) and go when too stale.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from rlfleet.config.rollouts import OrchestratorConfig
from rlfleet.errors import TransientError, is_transient
from rlfleet.orchestrator.envs import load_envs
from rlfleet.orchestrator.generate import SamplingParams, raise_if_none_scored, rollout_group
from rlfleet.orchestrator.rollout import load_tokenizer, publish_rollout, rollout_stats, trajectory_record
from rlfleet.orchestrator.sampler import Replicas, Sampler
from rlfleet.orchestrator.shaping import informative, shape_overlong, step_shaping
from rlfleet.store import RunStore, layout
from rlfleet.store.records import RolloutManifest, TrajectoryRecord

log = logging.getLogger("rlfleet.orchestrator")


@dataclass
class Group:
    uid: str  # "<prompt chunk>-<index in it>"
    env: str
    records: list[TrajectoryRecord]
    finished_at: float = field(default_factory=time.time)

    @property
    def oldest(self) -> int:
        return min(r["policy_step"] for r in self.records)

    @property
    def newest(self) -> int:
        return max(r["policy_step_max"] for r in self.records)

    def fits(self, step: int, m: int) -> bool:
        return step - 1 - m <= self.oldest and self.newest <= step - 1


@dataclass
class Counts:
    """Lifetime numbers of the stream (what a step record and the benchmarks read)."""

    started: int = 0
    finished: int = 0
    dropped_stale: int = 0
    aborted_stale: int = 0  # cancelled in flight once no step left could take them
    failed: int = 0
    generated_tokens: int = 0
    resent_samples: int = 0
    dropped_zero_variance: int = 0  # dynamic sampling: finished groups held aside
    refilled: int = 0  # dynamic sampling: groups started in place of held ones


class RolloutStream:
    def __init__(
        self,
        cfg: OrchestratorConfig,
        store: RunStore,
        model_path: str,
        replicas: Replicas,
        served: Any,  # () -> int: the version the pool holds
        seed: int,
        max_model_len: int,
        next_step: int,
        max_steps: int | None = None,  # no groups for steps from it on (None: no last step)
    ):
        self.cfg, self.store, self.replicas, self.served, self.seed = cfg, store, replicas, served, seed
        self.model_path = model_path
        self.params = SamplingParams(
            cfg.group_size, cfg.max_tokens, cfg.temperature, cfg.stall_timeout_s, max_model_len
        )
        self.envs = load_envs(cfg.env)
        self.counts_per_env = dict(zip([e.name for e in self.envs], cfg.env_counts(), strict=True))
        self.taken = next_step  # the next step take() serves
        self.max_steps = max_steps
        self.counts = Counts()
        self.error: BaseException | None = None
        self.shaping = cfg.shaping
        self._refill_cap = cfg.shaping.refill_cap(cfg.batch_size)
        self._ready: list[Group] = []  # finished, in finish order
        self._held: list[Group] = []  # dynamic sampling: finished with zero reward variance
        self._in_flight = dict.fromkeys(self.counts_per_env, 0)  # groups, per env
        self._since_take = {"dropped": 0, "refilled": 0}  # dynamic sampling, since the last take()
        self._failing = 0  # groups failed since the last one finished
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._wake: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._cursor = (
            store.read_json(layout.BUFFER_CURSOR)["chunk"] + 1 if store.exists(layout.BUFFER_CURSOR) else 0
        )
        self._queue: list[tuple[Any, Any, str]] = []  # (env, example, uid) drawn, not yet started
        self._restore(next_step)

    # -- the controller's side -------------------------------------------------------------
    def start(self) -> RolloutStream:
        self._thread = threading.Thread(target=self._run, name="rollout-stream", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self.notify()
        with self._cond:
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=30)

    def _revive(self) -> None:
        """After the sampling thread died (its groups in flight were cancelled), a new one; the
        finished groups stay in the buffer. A thread that only reported a failed group goes on."""
        if self._thread is None or self._stop.is_set():
            return
        self._thread.join(timeout=5)  # it is past its last use of the lock
        if self._thread.is_alive():
            return
        log.warning("rollout stream: its sampling thread died; starting it again")
        self._in_flight = dict.fromkeys(self.counts_per_env, 0)
        self._failing = 0
        self._loop = self._wake = None
        self.start()

    def notify(self) -> None:
        """The served version (or the demand) changed: start what is now needed."""
        if self._loop is not None and self._wake is not None:
            self._loop.call_soon_threadsafe(self._wake.set)

    def take(self, step: int) -> RolloutManifest:
        """Block until step N's groups are finished, publish them as `rollouts/step_N`; its manifest."""
        t0 = time.perf_counter()
        with self._cond:
            while True:
                self._drop_stale(step)
                chosen = self._choose(step, self.cfg.max_staleness)
                if chosen is not None:
                    break
                if self.error is not None:  # raised once: the rollout's retry samples again
                    error, self.error = self.error, None
                    self._revive()
                    raise error
                if self._stop.is_set():
                    raise TransientError("the rollout stream was stopped")
                self._cond.wait(timeout=1.0)
            held = [g for g in chosen if g in self._held]
            for g in chosen:
                (self._held if g in held else self._ready).remove(g)
            self.taken = max(self.taken, step + 1)
            waited = time.perf_counter() - t0
            buffered, counts = len(self._ready), asdict(self.counts)
            since, self._since_take = self._since_take, {"dropped": 0, "refilled": 0}
            self._drop_stale(step + 1, held_only=True)  # so that they stop counting for the next step
        self.notify()
        records = []
        for i, g in enumerate(chosen):
            records += [dict(r, group=i, group_uid=g.uid) for r in g.records]
        raise_if_none_scored([r["error"] for r in records])
        if held:
            log.info(
                "rollout stream: step %d filled with %d zero-variance groups (max_refill spent)",
                step,
                len(held),
            )
        meta = {
            "step": step,
            "policy_step": min(g.oldest for g in chosen),
            "policy_steps": sorted(
                {r["policy_step"] for r in records} | {r["policy_step_max"] for r in records}
            ),
            "sample_seconds": waited,  # how long the step waited for its groups
            "group_uids": [g.uid for g in chosen],
            "buffered_groups": buffered,
            "stream": counts,
            "taken_at": time.time(),
            **rollout_stats(records),
        }
        if self.shaping.dynamic_sampling or self.shaping.overlong != "none":
            meta["shaping"] = step_shaping(
                records, self.shaping, since["dropped"], since["refilled"], len(held)
            )
        manifest = publish_rollout(self.store, step, {0: records}, meta)
        for g in chosen:
            self.store.remove(layout.buffered_group(g.uid))
        return manifest

    def _choose(self, step: int, m: int) -> list[Group] | None:
        chosen: list[Group] = []
        for env, count in self.counts_per_env.items():
            mine = [g for g in self._ready if g.env == env and g.fits(step, m)][:count]
            if len(mine) < count and self._refills_spent() and not self._in_flight[env]:
                mine += [g for g in self._held if g.env == env and g.fits(step, m)][: count - len(mine)]
            if len(mine) < count:
                return None
            chosen += mine
        return sorted(chosen, key=lambda g: g.finished_at)

    def _refills_spent(self) -> bool:
        return self.shaping.dynamic_sampling and self._since_take["refilled"] >= self._refill_cap

    def _drop_stale(self, step: int, held_only: bool = False) -> None:
        """Groups too old for `step` are too old for every later step (held ones were counted
        when they were held)."""
        m = self.cfg.max_staleness
        for g in [g for g in self._held if g.oldest < step - 1 - m]:
            self._held.remove(g)
            self.store.remove(layout.buffered_group(g.uid))
        if held_only:
            return
        stale = [g for g in self._ready if g.oldest < step - 1 - m]
        for g in stale:
            self._ready.remove(g)
            self.store.remove(layout.buffered_group(g.uid))
        if stale:
            self.counts.dropped_stale += len(stale)
            log.info("rollout stream: dropped %d groups too stale for step %d", len(stale), step)

    def _restore(self, next_step: int) -> None:
        """A restarted controller keeps the buffered groups step `next_step` may still use;
        those of a published rollout (taken just before a crash) and those sampled by weights a
        resume is about to recompute (newer than next_step - 1) go."""
        taken = set()
        for s in self.store.complete_steps(layout.ROLLOUTS):
            manifest = self.store.manifest(layout.step_dir(layout.ROLLOUTS, s), verify=False)
            taken |= set(manifest.get("group_uids", []))
        kept = []
        for name in sorted(self.store.fs.glob(self.store.path(layout.buffered_group("*")))):
            uid = layout.group_uid(name)
            g = Group(**self.store.read_json(layout.buffered_group(uid)))
            if uid in taken or g.newest > next_step - 1:
                self.store.remove(layout.buffered_group(uid))
            else:
                shape_overlong(g.records, self.shaping, self.cfg.max_tokens)  # if buffered unshaped
                kept.append(g)
        kept.sort(key=lambda g: g.finished_at)
        self._held = [g for g in kept if not self._admitted(g)]
        self._ready = [g for g in kept if self._admitted(g)]
        if kept:
            log.info("rollout stream: %d buffered groups kept from an earlier controller", len(kept))

    # -- the sampling loop (its own thread and event loop) --------------------------------
    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as exc:  # surfaces in take()
            log.exception("rollout stream failed")
            with self._cond:
                self.error = exc
                self._cond.notify_all()

    def _admitted(self, g: Group) -> bool:
        return not self.shaping.dynamic_sampling or informative(g.records)

    def _wanted(self) -> list[tuple[str | None, bool]]:
        """Groups the steps up to the newest usable one still need beyond those in flight or ready,
        as (env, refill). Without dynamic sampling env is None: the next prompt drawn, whichever
        env's. With it each env's share is counted on its own, and a held group is replaced (a
        refill) while `max_refill` since the last take lasts, then counted as had."""
        newest = self.served() + 1 + self.cfg.max_async_level  # the last step these weights may train
        if self.max_steps is not None:  # after the run's last broadcast nothing is left to sample
            newest = min(newest, self.max_steps - 1)
        steps = max(newest - self.taken + 1, 0)
        with self._cond:
            if not self.shaping.dynamic_sampling:
                have = sum(self._in_flight.values()) + len(self._ready)
                return [(None, False)] * (steps * self.cfg.batch_size - have)
            budget = self._refill_cap - self._since_take["refilled"]
            out: list[tuple[str | None, bool]] = []
            for env, count in self.counts_per_env.items():
                need = steps * count - self._in_flight[env] - sum(g.env == env for g in self._ready)
                held = sum(g.env == env for g in self._held)
                refill = min(max(need, 0), held, budget)  # held groups replaced while the budget lasts
                budget -= refill
                out += [(env, False)] * max(need - held, 0) + [(env, True)] * refill
            return out

    async def _main(self) -> None:
        self._loop, self._wake = asyncio.get_running_loop(), asyncio.Event()
        tok = await asyncio.to_thread(load_tokenizer, self.model_path)
        sampler = Sampler(self.replicas, self.cfg.temperature, self.cfg.stall_timeout_s)
        tasks: dict[asyncio.Task, int] = {}  # groups in flight: the weights each started on
        try:
            while not self._stop.is_set():
                self._abort_hopeless(tasks)
                for name, refill in self._wanted():
                    env, example, uid = await self._next(name)
                    served = self.served()
                    task = asyncio.create_task(self._group(env, example, uid, served, tok, sampler))
                    tasks[task] = served
                    task.add_done_callback(tasks.pop)
                    with self._cond:
                        self._in_flight[env.name] += 1
                        self._since_take["refilled"] += refill
                        self.counts.refilled += refill
                        self.counts.started += 1
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), timeout=0.5)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await sampler.aclose()

    def _abort_hopeless(self, tasks: dict[asyncio.Task, int]) -> None:
        """Cancel the groups in flight that no step left can take, so that the replicas sample
        groups that can train. A group's first tokens come from the weights it started on, or
        the next ones if a load came first; take() drops a group older than N-1-m."""
        oldest_usable = self.taken - 1 - self.cfg.max_staleness
        hopeless = [t for t, served in tasks.items() if served + 1 < oldest_usable and not t.cancelling()]
        for task in hopeless:
            task.cancel()
        if hopeless:
            with self._cond:
                self.counts.aborted_stale += len(hopeless)
            log.info(
                "rollout stream: aborted %d groups in flight, too stale for step %d",
                len(hopeless),
                self.taken,
            )

    async def _next(self, env: str | None) -> tuple[Any, Any, str]:
        """The first queued prompt (of `env`, if named), drawing chunks until there is one; a
        refill's chunk leaves the other envs' prompts queued for their next groups."""
        while True:
            for i, item in enumerate(self._queue):
                if env is None or item[0].name == env:
                    return self._queue.pop(i)
            await asyncio.to_thread(self._draw_chunk)  # an env may run its own event loop to draw

    def _draw_chunk(self) -> None:
        """Prompts come in chunks of one step's worth (`batch_size`, shared among the envs by
        weight), chunk c being what `env.examples(c, ...)` gives: on-policy without drops, chunk N
        is step N's prompts, as a step-synchronous loop would have drawn them."""
        c = self._cursor
        for env in self.envs:
            exs = env.examples(c, self.counts_per_env[env.name], self.seed)
            self._queue += [(env, ex, f"{c}-{env.name}-{i}") for i, ex in enumerate(exs)]
        self.store.write_json(layout.BUFFER_CURSOR, {"chunk": c})
        self._cursor += 1

    async def _group(self, env: Any, example: Any, uid: str, served: int, tok: Any, sampler: Sampler) -> None:
        try:  # the group's whole life: a cancel or a failure while its file is written counts too
            trajs = await rollout_group(env, example, self.params, tok, sampler)
            group = Group(uid, env.name, [trajectory_record(t, 0, env.name, served) for t in trajs])
            tokens = sum(sum(r["loss_mask"]) for r in group.records)  # before a mask shapes them
            shape_overlong(group.records, self.shaping, self.cfg.max_tokens)
            # off the loop (fsync), compact: a third of the stream thread's CPU went to dataclasses'
            # deep copy and indented JSON for files read back only after a restart (py-spy, tiny job)
            data = json.dumps(vars(group)).encode()
            await asyncio.to_thread(self.store.write_bytes, layout.buffered_group(uid), data)
        except asyncio.CancelledError:  # aborted as too stale, or the stream stops
            with self._cond:
                self._in_flight[env.name] -= 1
            raise
        except Exception as exc:
            with self._cond:
                self._in_flight[env.name] -= 1
                self.counts.failed += 1
                self._failing += 1
                if not is_transient(exc) or self._failing >= self.cfg.batch_size:
                    self.error = exc  # a bug, or nothing comes back: fail the step, do not wait forever
                self._cond.notify_all()
            log.warning("rollout stream: group %s failed: %s", uid, exc)
            self.notify()
            return
        admitted = self._admitted(group)
        with self._cond:
            self._in_flight[env.name] -= 1
            (self._ready if admitted else self._held).append(group)
            self.counts.dropped_zero_variance += not admitted
            self._since_take["dropped"] += not admitted
            self._failing = 0
            self.counts.finished += 1
            self.counts.generated_tokens += tokens
            self.counts.resent_samples += sum(any(t.get("resent") for t in r["turns"]) for r in group.records)
            self._cond.notify_all()
        if not admitted:
            self.notify()  # its replacement starts now
