"""Continuous rollouts: groups are sampled without a step barrier into a buffer in the run store,
and step N takes, of the groups whose tokens all come from weights it may train on, those closest to
going stale first (buffer.py's take policy).

A background thread runs one event loop. It starts a group (one prompt, `group_size`
trajectories, each its own coroutine) whenever the steps that are still to be taken need more
groups than are in flight or buffered: the groups for steps `taken .. served + 1 + k`, where
`served` is the weight version the pool holds and k is `max_async_level`. With k = 0 that is one
step's groups on the newest weights (on-policy); with k >= 1 the replicas keep sampling while the
trainer steps and while weights change (the pool loads them with requests paused in place).

What is in flight, what is finished, and which groups step N may take are the `GroupBuffer`'s
books (buffer.py: demand, take policy, the buffer's files); this module is the thread that samples
into it and the `take` that waits on it. Every change to the books holds `_cond`. `take(N)`
publishes the groups as `rollouts/step_N` and then removes their buffer files; groups in flight
that no step left can take are cancelled (`aborted_stale`). The samples in flight are logged as
they stream (partials.py): a new life (a restarted controller, a new sampling thread) continues the
groups an earlier one left in flight from their tokens.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from typing import Any

from rlfleet.config.rollouts import OrchestratorConfig
from rlfleet.errors import TransientError
from rlfleet.orchestrator.buffer import Group, GroupBuffer
from rlfleet.orchestrator.envs import load_envs
from rlfleet.orchestrator.generate import SamplingParams, raise_if_none_scored, rollout_group
from rlfleet.orchestrator.partials import Partial, PartialLog, resume, sample_id
from rlfleet.orchestrator.rollout import (
    Rollout,
    load_tokenizer,
    publish_rollout,
    rollout_stats,
    trajectory_record,
)
from rlfleet.orchestrator.sampler import Replicas, Sample, Sampler
from rlfleet.orchestrator.shaping import shape_overlong, step_shaping
from rlfleet.orchestrator.teacher import Teacher
from rlfleet.progress import Progress
from rlfleet.store import RunStore, layout

log = logging.getLogger("rlfleet.orchestrator")


class RolloutStream:
    """The controller's rollout side: `start` the sampling thread, `take(N)` step N's groups,
    `notify` it of new weights, `stop` it. The flow holds one per run (runs/handles.py)."""

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
        progress: Progress | None = None,  # the run's, for the stall watchdog (progress.py)
        teacher: Teacher | None = None,  # loss.distill: its logprobs join each finished group
    ):
        self.progress = progress or Progress()
        self.teacher = teacher
        self.cfg, self.store, self.replicas, self.served, self.seed = cfg, store, replicas, served, seed
        self.model_path = model_path
        self.params = SamplingParams(
            cfg.group_size, cfg.max_tokens, cfg.temperature, cfg.stall_timeout_s, max_model_len
        )
        self.envs = load_envs(cfg.env)
        env_counts = dict(zip([e.name for e in self.envs], cfg.env_counts(), strict=True))
        self.buffer = GroupBuffer(cfg, store, env_counts, next_step)
        self.max_steps = max_steps
        self.error: BaseException | None = None
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._wake: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._partials: PartialLog | None = None  # the sampling thread's log of its samples in flight
        self._prompts = Prompts(self.envs, env_counts, seed, store)

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
        """After the sampling thread died (its groups in flight were cancelled), a new one; the finished groups stay in the buffer. A thread that only
        reported a failed group goes on."""
        if self._thread is None or self._stop.is_set():
            return
        self._thread.join(timeout=5)  # it is past its last use of the lock
        if self._thread.is_alive():
            return
        log.warning("rollout stream: its sampling thread died; starting it again")
        self.buffer.sampling_stopped()
        self._loop = self._wake = None
        self.start()

    def notify(self) -> None:
        """The served version (or the demand) changed: start what is now needed."""
        if self._loop is not None and self._wake is not None:
            self._loop.call_soon_threadsafe(self._wake.set)

    def take(self, step: int) -> Rollout:
        """Block until step N's groups are finished, publish them as `rollouts/step_N`; its
        manifest and the records it holds."""
        t0 = time.perf_counter()
        with self._cond:
            while (taken := self.buffer.take(step)) is None:
                if self.error is not None:  # raised once: the rollout's retry samples again
                    error, self.error = self.error, None
                    self._revive()
                    raise error
                if self._stop.is_set():
                    raise TransientError("the rollout stream was stopped")
                self.progress.check()  # a stall that fails the run
                self._cond.wait(timeout=1.0)
        waited = time.perf_counter() - t0
        self.notify()
        records = []
        for i, g in enumerate(taken.groups):
            records += [
                dict(r, group=i, group_uid=g.uid, sample_id=sample_id(g.uid, j))
                for j, r in enumerate(g.records)
            ]
        raise_if_none_scored([r["error"] for r in records])
        if taken.held:
            log.info(
                "rollout stream: step %d filled with %d zero-variance groups (max_refill spent)",
                step,
                taken.held,
            )
        meta = {
            "step": step,
            "policy_step": min(g.oldest for g in taken.groups),
            "policy_steps": sorted(
                {r["policy_step"] for r in records} | {r["policy_step_max"] for r in records}
            ),
            "sample_seconds": waited,  # how long the step waited for its groups
            "group_uids": [g.uid for g in taken.groups],
            "buffered_groups": taken.buffered,
            "stream": taken.counts,
            "taken_at": time.time(),
            **rollout_stats(records),
        }
        shaping = self.cfg.shaping
        if shaping.dynamic_sampling or shaping.overlong != "none":
            meta["shaping"] = step_shaping(records, shaping, taken.dropped, taken.refilled, taken.held)
        manifest = publish_rollout(self.store, step, records, meta)
        self.buffer.discard(taken.groups)  # after the publish: a restart finds them in one place
        return Rollout(manifest, records)

    # -- the sampling loop (its own thread and event loop) --------------------------------
    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as exc:  # surfaces in take()
            log.exception("rollout stream failed")
            with self._cond:
                self.error = exc
                self._cond.notify_all()

    def _wanted(self) -> list[tuple[str | None, bool]]:
        """The groups to start now (buffer.py: `GroupBuffer.wanted`)."""
        newest = self.served() + 1 + self.cfg.max_async_level  # the last step these weights may train
        if self.max_steps is not None:  # after the run's last broadcast nothing is left to sample
            newest = min(newest, self.max_steps - 1)
        with self._cond:
            return self.buffer.wanted(newest)

    async def _main(self) -> None:
        self._loop, self._wake = asyncio.get_running_loop(), asyncio.Event()
        # transformers' imports: ~6 s, over 20 s on a loaded 2-core box; starting, not a stall
        with self.progress.starting_up("the rollout stream"):
            tok = await asyncio.to_thread(load_tokenizer, self.model_path)
        sampler = Sampler(
            self.replicas, self.cfg.temperature, self.cfg.stall_timeout_s, progress=self.progress
        )
        tasks: dict[asyncio.Task, int] = {}  # groups in flight (named by uid): the weights each started on
        partials, resumed = await asyncio.to_thread(self._resume)
        self._partials = partials
        flusher = asyncio.create_task(partials.run())
        try:
            for p in resumed:
                env, example = await asyncio.to_thread(self._prompts.example, p.env, p.group)
                self._launch(tasks, (env, example, p.group), (tok, sampler), resumed=p)
            while not self._stop.is_set():
                self._abort_hopeless(tasks)
                for name, refill in self._wanted():
                    self._launch(tasks, await self._prompts.next(name), (tok, sampler), refill)
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), timeout=0.5)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            flusher.cancel()
            partials.close()  # what the stopped groups streamed: the next life continues them
            await sampler.aclose()

    def _resume(self) -> tuple[PartialLog, list[Partial]]:
        """This life's log, and the groups an earlier life left in flight to continue (partials.py)."""
        with self._cond:
            finished, oldest_usable = self.buffer.finished(), self.buffer.taken - 1 - self.cfg.max_staleness
        partials, keep, stale = resume(
            self.store, finished, self.served(), oldest_usable, self.cfg.partials_flush_s
        )
        with self._cond:
            self.buffer.counts.dropped_partial += len(stale)
            self.buffer.counts.resumed_samples += sum(bool(s.resumed) for p in keep for s in p.samples)
        return partials, keep

    def _launch(
        self,
        tasks: dict[asyncio.Task, int],
        group: tuple[Any, Any, str],
        sampling: tuple[Any, Sampler],
        refill: bool = False,
        resumed: Partial | None = None,
    ) -> None:
        """Start a group, (env, example, uid); `resumed`: one an earlier life left in flight."""
        assert self._partials is not None
        env, example, uid = group
        served = self.served() if resumed is None or resumed.oldest is None else resumed.oldest
        samples = resumed.samples if resumed is not None else [Sample() for _ in range(self.params.n)]
        if resumed is None:
            self._partials.track(
                {"group": uid, "env": env.name, "n": len(samples), "served": served}, samples
            )
        with self._cond:  # in the books before it can end
            self.buffer.started(env.name, refill)
        task = asyncio.create_task(self._group(env, example, uid, served, *sampling, samples), name=uid)
        tasks[task] = served
        task.add_done_callback(tasks.pop)

    def _abort_hopeless(self, tasks: dict[asyncio.Task, int]) -> None:
        """Cancel the groups in flight that no step left can take, so that the replicas sample
        groups that can train. A group's first tokens come from the weights it started on, or
        the next ones if a load came first; take() drops a group older than N-1-m."""
        oldest_usable = self.buffer.taken - 1 - self.cfg.max_staleness
        hopeless = [t for t, served in tasks.items() if served + 1 < oldest_usable and not t.cancelling()]
        for task in hopeless:
            task.cancel()
            if self._partials is not None:
                self._partials.end(task.get_name(), "aborted_stale")
        if hopeless:
            with self._cond:
                self.buffer.counts.aborted_stale += len(hopeless)
            log.info(
                "rollout stream: aborted %d groups in flight, too stale for step %d",
                len(hopeless),
                self.buffer.taken,
            )

    async def _group(
        self, env: Any, example: Any, uid: str, served: int, tok: Any, sampler: Sampler, samples: list[Sample]
    ) -> None:
        """One group's whole life. However it ends (finished and written, failed, or cancelled as
        too stale or by the stop, even while its file is written), it leaves the books once, in
        the `finally`."""
        group: Group | None = None
        failure: Exception | None = None
        tokens = 0
        try:
            trajs = await rollout_group(env, example, self.params, tok, sampler, samples)
            finished = Group(uid, env.name, [trajectory_record(t, 0, env.name, served) for t in trajs])
            if self.teacher is not None:  # overlaps the other groups' sampling (teacher.py)
                asked = time.monotonic()
                await self.teacher.score(finished.records)
                with self._cond:
                    self.buffer.counts.teacher_ms += round((time.monotonic() - asked) * 1000)
            tokens = sum(sum(r["loss_mask"]) for r in finished.records)  # before a mask shapes them
            shape_overlong(finished.records, self.cfg.shaping, self.cfg.max_tokens)
            await asyncio.to_thread(self.buffer.write, finished)  # off the loop: fsync
            group = finished
        except Exception as exc:  # not a cancel: that propagates, after the `finally`
            failure = exc
            log.warning("rollout stream: group %s failed: %s", uid, exc)
        finally:
            if (group is not None or failure is not None) and self._partials is not None:  # not cancelled
                self._partials.end(uid, "failed" if group is None else "finished")
            with self._cond:
                resample = self.buffer.ended(env.name, group, failure, tokens)
                if failure is not None and self.buffer.fails_the_step(failure):
                    self.error = failure
                self._cond.notify_all()
        if resample:
            self.notify()  # its replacement starts now


class Prompts:
    """The prompts the stream draws, in chunks of one step's worth (`batch_size`, shared among the
    envs by weight), chunk c being what `env.examples(c, ...)` gives: on-policy without drops,
    chunk N is step N's prompts, as a step-synchronous loop would have drawn them. The next chunk
    is kept in the run store (`buffer/cursor.json`), so a restarted controller draws on."""

    def __init__(self, envs: list[Any], env_counts: dict[str, int], seed: int, store: RunStore):
        self.envs, self.env_counts, self.seed, self.store = envs, env_counts, seed, store
        cursor = layout.BUFFER_CURSOR
        self._cursor = store.read_json(cursor)["chunk"] + 1 if store.exists(cursor) else 0
        self._queue: list[tuple[Any, Any, str]] = []  # (env, example, uid) drawn, not yet started

    async def next(self, env: str | None) -> tuple[Any, Any, str]:
        """The first queued prompt (of `env`, if named), drawing chunks until there is one; a
        refill's chunk leaves the other envs' prompts queued for their next groups."""
        while True:
            for i, item in enumerate(self._queue):
                if env is None or item[0].name == env:
                    return self._queue.pop(i)
            await asyncio.to_thread(self._draw_chunk)  # an env may run its own event loop to draw

    def example(self, env: str, uid: str) -> tuple[Any, Any]:
        """The env and example of a group `uid` ("<chunk>-<env>-<index>") drawn before: `examples`
        is a function of (chunk, count, seed)."""
        chunk, index = int(uid.split("-", 1)[0]), int(uid.rsplit("-", 1)[1])
        e = next(e for e in self.envs if e.name == env)
        return e, e.examples(chunk, self.env_counts[env], self.seed)[index]

    def _draw_chunk(self) -> None:
        c = self._cursor
        for env in self.envs:
            exs = env.examples(c, self.env_counts[env.name], self.seed)
            self._queue += [(env, ex, f"{c}-{env.name}-{i}") for i, ex in enumerate(exs)]
        self.store.write_json(layout.BUFFER_CURSOR, {"chunk": c})
        self._cursor += 1
