"""The rollout stream's books: which groups are sampling, which are finished, which step N may take.

No threads and no vLLM: `RolloutStream` (stream.py) changes the books only under its lock (`write`,
which touches only the group's file, runs in a worker thread without it), and tests drive it
directly. Three rules live here and nowhere else:

- **Demand** (`wanted`): the steps still to be taken, up to the newest the served weights may
  train, need `batch_size` groups each; what is in flight or buffered counts against that.
- **Take policy** (`take`): step N takes each env's share of `batch_size` groups with
  `N-1-m <= oldest token's version` and `newest <= N-1` (m: `max_off_policy_steps`, see
  `OrchestratorConfig.max_staleness`), the one closest to going stale first (oldest token's
  version, then the first finished): a long group that finished late trains before fresher ones
  instead of going stale behind them. Groups that can no longer train any step are dropped and
  counted (`dropped_stale`).
- **Restore**: a finished group is written to `buffer/groups/<uid>.json` before it is taken, so
  a controller that restarts loses no group still within bound (`restore`).

Batch shaping (`orchestrator.shaping`, rules in shaping.py) decides where a group finishes. With
dynamic sampling a group whose rewards all equal is held aside instead of entering the buffer
(`dropped_zero_variance`), and the demand is counted per env, so the stream samples another prompt
of that env in its place (`refilled`), until `max_refill` refills were started since the last take.
Then held groups count as buffered: the step waits for its env's groups in flight and fills what is
still missing with held ones, oldest first. Held groups are written to the buffer like the others
(a restarted controller holds them again) and go when too stale.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict, dataclass, field

from rlfleet.config.rollouts import OrchestratorConfig
from rlfleet.errors import is_transient
from rlfleet.orchestrator.shaping import informative, shape_overlong
from rlfleet.store import RunStore, layout
from rlfleet.store.records import TrajectoryRecord

log = logging.getLogger("rlfleet.orchestrator")


@dataclass
class Group:
    uid: str  # "<prompt chunk>-<env>-<index in it>"
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


def _deadline(g: Group) -> tuple[int, float]:
    """The take order: the group that goes stale first (its oldest token's version), then the
    first finished."""
    return g.oldest, g.finished_at


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
    resumed_samples: int = 0  # continued from the tokens an earlier life logged (partials.py)
    dropped_partial: int = 0  # groups an earlier life left in flight, too stale to continue
    teacher_ms: int = 0  # loss.distill: groups' waits for the teacher's logprobs, summed (they overlap)


@dataclass
class Taken:
    """What `GroupBuffer.take` gives step N: its groups (finish order) and the books at that moment."""

    groups: list[Group]
    held: int  # zero-variance groups among them (dynamic sampling, `max_refill` spent)
    buffered: int  # finished groups left for later steps
    counts: dict[str, int]  # Counts, as a step record keeps them
    dropped: int  # dynamic sampling since the previous take: groups held aside
    refilled: int  # and prompts started in their place


class GroupBuffer:
    """Groups in flight (counted per env) and finished (in memory and in the run store)."""

    def __init__(self, cfg: OrchestratorConfig, store: RunStore, env_counts: dict[str, int], next_step: int):
        self.cfg, self.store, self.shaping = cfg, store, cfg.shaping
        self.env_counts = env_counts  # each env's groups in a step
        self.taken = next_step  # the next step take() serves
        self.counts = Counts()
        self.ready: list[Group] = []  # finished, in finish order
        self.held: list[Group] = []  # dynamic sampling: finished with zero reward variance
        self.in_flight = dict.fromkeys(env_counts, 0)  # groups, per env
        self._refill_cap = cfg.shaping.refill_cap(cfg.batch_size)
        self._since_take = {"dropped": 0, "refilled": 0}  # dynamic sampling, since the last take
        self._failing = 0  # groups failed since the last one finished
        self.published: set[str] = set()  # uids of the groups in published rollouts
        self.restore(next_step)

    # -- demand --------------------------------------------------------------------------------
    def wanted(self, newest: int) -> list[tuple[str | None, bool]]:
        """Groups the steps up to `newest` (the last step the served weights may train) still need
        beyond those in flight or ready, as (env, refill). Without dynamic sampling env is None:
        the next prompt drawn, whichever env's. With it each env's share is counted on its own, and
        a held group is replaced (a refill) while `max_refill` since the last take lasts, then
        counted as had."""
        steps = max(newest - self.taken + 1, 0)
        if not self.shaping.dynamic_sampling:
            have = sum(self.in_flight.values()) + len(self.ready)
            return [(None, False)] * (steps * self.cfg.batch_size - have)
        budget = self._refill_cap - self._since_take["refilled"]
        out: list[tuple[str | None, bool]] = []
        for env, count in self.env_counts.items():
            need = steps * count - self.in_flight[env] - sum(g.env == env for g in self.ready)
            held = sum(g.env == env for g in self.held)
            refill = min(max(need, 0), held, budget)  # held groups replaced while the budget lasts
            budget -= refill
            out += [(env, False)] * max(need - held, 0) + [(env, True)] * refill
        return out

    def started(self, env: str, refill: bool) -> None:
        self.in_flight[env] += 1
        self._since_take["refilled"] += refill
        self.counts.refilled += refill
        self.counts.started += 1

    def ended(self, env: str, group: Group | None, failure: Exception | None = None, tokens: int = 0) -> bool:
        """A group in flight is over: finished and written (`group`, `tokens` sampled), failed
        (`failure`), or cancelled (neither). The one place a group leaves `in_flight`. True when
        its place is to be sampled again now (it failed, or was held aside)."""
        self.in_flight[env] -= 1
        if failure is not None:
            self.counts.failed += 1
            self._failing += 1
            return True
        if group is None:
            return False
        admitted = self.admitted(group)
        (self.ready if admitted else self.held).append(group)
        self.counts.dropped_zero_variance += not admitted
        self._since_take["dropped"] += not admitted
        self._failing = 0
        self.counts.finished += 1
        self.counts.generated_tokens += tokens
        self.counts.resent_samples += sum(any(t.get("resent") for t in r["turns"]) for r in group.records)
        return not admitted

    def sampling_stopped(self) -> None:
        """The sampling thread died: nothing is in flight any more. A group's `finally` ends it
        in the books (`ended`), but a task cancelled before its first step never runs its body."""
        self.in_flight = dict.fromkeys(self.in_flight, 0)
        self._failing = 0

    def fails_the_step(self, failure: Exception) -> bool:
        """A bug, or nothing comes back (a whole step's worth failed in a row): fail the step
        instead of waiting forever. A transient failure alone is sampled again."""
        return not is_transient(failure) or self._failing >= self.cfg.batch_size

    def admitted(self, g: Group) -> bool:
        return not self.shaping.dynamic_sampling or informative(g.records)

    # -- take policy ---------------------------------------------------------------------------
    def take(self, step: int) -> Taken | None:
        """Step N's groups, out of the books (their files stay until `discard`), or None while
        some env's share is still missing."""
        self.drop_stale(step)
        chosen = self._choose(step, self.cfg.max_staleness)
        if chosen is None:
            return None
        held = [g for g in chosen if g in self.held]
        for g in chosen:
            (self.held if g in held else self.ready).remove(g)
        self.taken = max(self.taken, step + 1)
        self.published |= {g.uid for g in chosen}
        since, self._since_take = self._since_take, {"dropped": 0, "refilled": 0}
        taken = Taken(chosen, len(held), len(self.ready), asdict(self.counts), **since)
        self.drop_stale(step + 1, held_only=True)  # so that they stop counting for the next step
        return taken

    def finished(self) -> set[str]:
        """The uids of every group whose records are buffered or published: what a log of the
        samples in flight says of them is superseded."""
        return self.published | {g.uid for g in self.ready + self.held}

    def _choose(self, step: int, m: int) -> list[Group] | None:
        chosen: list[Group] = []
        ready, held = sorted(self.ready, key=_deadline), sorted(self.held, key=_deadline)
        for env, count in self.env_counts.items():
            mine = [g for g in ready if g.env == env and g.fits(step, m)][:count]
            if len(mine) < count and self._refills_spent() and not self.in_flight[env]:
                mine += [g for g in held if g.env == env and g.fits(step, m)][: count - len(mine)]
            if len(mine) < count:
                return None
            chosen += mine
        return sorted(chosen, key=lambda g: g.finished_at)

    def _refills_spent(self) -> bool:
        return self.shaping.dynamic_sampling and self._since_take["refilled"] >= self._refill_cap

    def drop_stale(self, step: int, held_only: bool = False) -> None:
        """Groups too old for `step` are too old for every later step (held ones were counted
        when they were held)."""
        m = self.cfg.max_staleness
        for g in [g for g in self.held if g.oldest < step - 1 - m]:
            self.held.remove(g)
            self.store.remove(layout.buffered_group(g.uid))
        if held_only:
            return
        stale = [g for g in self.ready if g.oldest < step - 1 - m]
        for g in stale:
            self.ready.remove(g)
            self.store.remove(layout.buffered_group(g.uid))
        if stale:
            self.counts.dropped_stale += len(stale)
            log.info("rollout stream: dropped %d groups too stale for step %d", len(stale), step)

    # -- the files -----------------------------------------------------------------------------
    def write(self, group: Group) -> None:
        """A finished group's file, before it enters the books. Compact: a third of the stream
        thread's CPU went to dataclasses' deep copy and indented JSON for files read back only
        after a restart (py-spy, tiny job)."""
        self.store.write_bytes(layout.buffered_group(group.uid), json.dumps(vars(group)).encode())

    def discard(self, groups: list[Group]) -> None:
        """The files of groups a published rollout holds now."""
        for g in groups:
            self.store.remove(layout.buffered_group(g.uid))

    def restore(self, next_step: int) -> None:
        """A restarted controller keeps the buffered groups step `next_step` may still use;
        those of a published rollout (taken just before a crash) and those sampled by weights a
        resume is about to recompute (newer than next_step - 1) go."""
        taken = set()
        for s in self.store.complete_steps(layout.ROLLOUTS):
            manifest = self.store.manifest(layout.step_dir(layout.ROLLOUTS, s), verify=False)
            taken |= set(manifest.get("group_uids", []))
        self.published = taken
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
        self.held = [g for g in kept if not self.admitted(g)]
        self.ready = [g for g in kept if self.admitted(g)]
        if kept:
            log.info("rollout stream: %d buffered groups kept from an earlier controller", len(kept))
