"""The samples in flight, written as they stream, so that a controller killed mid-step (or a
sampling thread that died) continues them from their tokens instead of sampling them again.

Each sampling life appends to its own log, `buffer/partials/<life>.jsonl` (store/records.py:
`PartialStart` when a group starts, `PartialTokens` with what a sample streamed since the last
flush, `PartialEnd` when a group leaves the books). Writes are batched: every `partials_flush_s`
one block for all samples is appended, without fsync (a killed process's writes are in the page
cache; a machine crash loses at most the last block, whose tokens are then sampled again). A
group's file in `buffer/groups` or a published rollout supersedes its partial tokens: a finished
group is never continued a second time.

Only a trajectory's first turn is logged (the group's one request: all of a one-turn env's
sampling). A multi-turn trajectory restored with its first turn goes on with the env from there;
a later turn that was in flight is sampled again.

A new life (`resume`) reads every log, keeps what may still train, writes it as its own log's
first block and deletes the older logs. A log that outgrows a few times its live tokens is
rotated the same way, so the logs stay about the size of what is in flight.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from dataclasses import dataclass, field

from rlfleet.orchestrator.generate import runs
from rlfleet.orchestrator.sampler import Sample
from rlfleet.store import RunStore, layout
from rlfleet.store.records import PartialEnd, PartialRecord, PartialStart, PartialTokens

log = logging.getLogger("rlfleet.orchestrator")

ROTATE_BYTES = 16 << 20  # a log is rotated past this and 4x its last snapshot


def sample_id(group: str, index: int) -> str:
    """A sample's stable id: its group's uid and its index in the group."""
    return f"{group}/{index}"


@dataclass
class Partial:
    """A group a log says was in flight: each sample's first turn as far as it was written."""

    group: str
    env: str
    served: int  # the weights served when it started
    samples: list[Sample] = field(default_factory=list)

    @property
    def oldest(self) -> int | None:
        """The oldest weights among its tokens; None before its first token."""
        return min((v for s in self.samples for v in s.versions), default=None)

    def start(self) -> PartialStart:
        return {"group": self.group, "env": self.env, "n": len(self.samples), "served": self.served}


def logs(store: RunStore) -> list[str]:
    """Every life's log, oldest first."""
    found = store.fs.glob(store.path(layout.PARTIALS_LOGS))
    lives = sorted(life for p in found if (life := layout.partials_life(p)) is not None)
    return [layout.partials_log(life) for life in lives]


def read_partials(store: RunStore) -> dict[str, Partial]:
    """The groups the logs leave in flight, merged oldest life first (a rotation's or a new
    life's copy overlaps the log it replaced with the same tokens; a torn last line is skipped)."""
    groups: dict[str, Partial] = {}
    for rel in logs(store):
        try:
            data = store.read_bytes(rel)
        except FileNotFoundError:  # rotated away since the listing (a reader beside a live stream)
            continue
        for line in data.splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            _apply(groups, record)
    return groups


def _apply(groups: dict[str, Partial], r: PartialRecord) -> None:
    if "ended" in r:
        groups.pop(r["group"], None)
    elif "sample" in r:
        uid, _, i = r["sample"].rpartition("/")
        if uid not in groups:
            return
        s = groups[uid].samples[int(i)]
        skip = len(s.completion_ids) - r["at"]
        if skip < 0:  # a gap (never written so): what follows it cannot be placed
            return
        s.completion_ids += r["ids"][skip:]
        s.logprobs += r["logprobs"][skip:]
        s.versions += [v for v, n in r["versions"] for _ in range(n)][skip:]
        s.finish_reason = r.get("finish", s.finish_reason)
    elif r["group"] not in groups:
        groups[r["group"]] = Partial(r["group"], r["env"], r["served"], [Sample() for _ in range(r["n"])])


def resume(
    store: RunStore, finished: set[str], served: int, oldest_usable: int, flush_s: float
) -> tuple[PartialLog, list[Partial], list[Partial]]:
    """A new life's log, the groups it continues and those too stale to (counted by the stream).

    A group whose records are in `finished` (buffered or published) is done. Tokens sampled by
    weights newer than `served` (a resume recomputes those) are cut, with whatever followed them;
    a group with a token older than `oldest_usable` can train no step left. The samples kept
    carry their tokens (`Sample.resumed`): the sampler continues each from them."""
    keep, stale = [], []
    for p in read_partials(store).values():
        if p.group in finished:
            continue
        for s in p.samples:
            cut = next((i for i, v in enumerate(s.versions) if v > served), None)
            if cut is not None:
                del s.completion_ids[cut:], s.logprobs[cut:], s.versions[cut:]
                s.finish_reason = ""
            s.resumed = len(s.completion_ids)
        oldest = p.oldest
        (stale if oldest is not None and oldest < oldest_usable else keep).append(p)
    lives = logs(store)
    life = (layout.partials_life(lives[-1]) or 0) + 1 if lives else 0
    partials = PartialLog(store, life, flush_s)
    for p in keep:
        partials.track(p.start(), p.samples, written=False)
    partials.rotate([PartialEnd(group=p.group, ended="dropped_stale") for p in stale])
    for rel in lives:
        store.remove(rel)
    if keep or stale:
        log.info(
            "rollout stream: %d groups in flight continue from their tokens (%d samples, %d tokens); "
            "%d too stale dropped",
            len(keep),
            sum(bool(s.resumed) for p in keep for s in p.samples),
            sum(s.resumed for p in keep for s in p.samples),
            len(stale),
        )
    return partials, keep, stale


class PartialLog:
    """This life's log. The loop's thread calls `track`, `end` and `flush` (the samples change on
    it, so each block is read there); the writes run in a worker thread, one at a time."""

    def __init__(self, store: RunStore, life: int, flush_s: float):
        self.store, self.rel, self.life, self.flush_s = store, layout.partials_log(life), life, flush_s
        self._live: dict[str, _Live] = {}
        self._lines: list[PartialRecord] = []  # start and end records not written yet
        self._bytes = self._base = 0  # the log's size; its first block's
        self._io = threading.Lock()

    def track(self, start: PartialStart, samples: list[Sample], written: bool = True) -> None:
        """A group starts (`written`: its start record goes in the next block)."""
        self._live[start["group"]] = _Live(start, samples)
        if written:
            self._lines.append(start)

    def end(self, group: str, why: str) -> None:
        """A group left the books (finished and its file written, failed, or aborted as stale);
        a stop leaves its groups in the log, for the next life to continue."""
        if self._live.pop(group, None) is not None:
            self._lines.append(PartialEnd(group=group, ended=why))

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.flush_s)
            await self.flush()

    async def flush(self) -> None:
        rotate = self._bytes > max(ROTATE_BYTES, 4 * self._base)
        if lines := self._snapshot() if rotate else self._block():
            await asyncio.to_thread(self._write, lines, rotate)

    def close(self) -> None:
        """The last block, on the calling thread (after the loop's tasks were cancelled)."""
        if lines := self._block():
            self._write(lines, False)

    def rotate(self, lines: list[PartialRecord]) -> None:
        """Start a new file with every live group from its first token, then `lines`."""
        self._write(self._snapshot() + lines, True)

    def _block(self) -> list[PartialRecord]:
        lines, self._lines = self._lines, []
        return lines + [line for live in self._live.values() for line in live.block()]

    def _snapshot(self) -> list[PartialRecord]:
        self._lines = []  # the live groups' starts are in it; the ended ones are absent
        lines: list[PartialRecord] = []
        for live in self._live.values():
            live.written = [0] * len(live.samples)
            live.finished = [False] * len(live.samples)
            lines += [live.start, *live.block()]
        return lines

    def _write(self, lines: list[PartialRecord], rotate: bool) -> None:
        data = "".join(json.dumps(line) + "\n" for line in lines).encode()  # off the loop's thread
        with self._io:
            if not rotate:
                self.store.append_bytes(self.rel, data)
                self._bytes += len(data)
                return
            old = self.rel  # a new file, whole; then the older one goes
            if self._bytes:
                self.life += 1
                self.rel = layout.partials_log(self.life)
            self.store.write_bytes(self.rel, data)
            if old != self.rel:
                self.store.remove(old)
            self._bytes = self._base = len(data)


@dataclass
class _Live:
    """A group in flight and how much of each of its samples is in the log."""

    start: PartialStart
    samples: list[Sample]
    written: list[int] = field(default_factory=list)
    finished: list[bool] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.written = [0] * len(self.samples)
        self.finished = [False] * len(self.samples)

    def block(self) -> list[PartialRecord]:
        """A record per sample with tokens (or a finish) not written yet (slices: the samples
        grow on while the writer encodes them)."""
        lines: list[PartialRecord] = []
        for i, s in enumerate(self.samples):
            n, at = len(s.completion_ids), self.written[i]
            if n > at or (s.finish_reason and not self.finished[i]):
                lines.append(_tokens(sample_id(self.start["group"], i), s, at, n))
                self.written[i], self.finished[i] = n, bool(s.finish_reason)
        return lines


def _tokens(sample: str, s: Sample, at: int, n: int) -> PartialTokens:
    record: PartialTokens = {
        "sample": sample,
        "at": at,
        "ids": s.completion_ids[at:n],
        "logprobs": s.logprobs[at:n],
        "versions": runs(s.versions[at:n]),
    }
    if s.finish_reason:
        record["finish"] = s.finish_reason
    return record
