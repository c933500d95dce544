"""What moved last in a run, for the stall watchdog (runs/stalls.py): per replica its last sampled
token and its requests and weight loads in flight, the trainer's last step, what is starting, and
what the flow waits for.

The parties update it where they already see progress (the sampler per streamed chunk, the pool
per weight load, the `train` task's wait per step), so its updates are a few assignments: no lock
on the token path (the GIL makes each one atomic, and a reader needs no consistent cut). Times are
`time.monotonic()` seconds; `snapshot` gives ages.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypedDict

from rlfleet.errors import DeterministicError


class StallError(DeterministicError):
    """The run stalled and its policy (`faults.on_stall`) fails it: every wait of the run raises
    this, with the stall's diagnosis as its message; no retry."""


class LoadAge(TypedDict):
    step: int
    age_s: float


class WaitAge(TypedDict):
    name: str  # the flow's task: train-7, broadcast-6
    what: str  # what it waits for
    age_s: float


class ProgressSnapshot(TypedDict):
    idle_s: float  # since the last progress of any party
    last: str  # what that was
    token_age_s: dict[str, float]  # replica URL -> since its last token
    requests: dict[str, int]  # replica URL -> requests streaming from it now
    loads: dict[str, LoadAge]  # replica URL -> its weight load in flight
    trainer_step: int | None  # the last step the controller saw the trainer finish
    trainer_step_age_s: float | None
    starting: list[str]  # parties starting now (replicas being launched)
    waits: list[WaitAge]


class Progress:
    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self.clock = clock
        self.last = clock()  # the last progress of any party
        self.last_what = "nothing yet"
        self.events = 0  # progress made (tokens, steps, loads): did anything move since?
        self.tokens: dict[str, float] = {}
        self.requests: Counter[str] = Counter()  # the sampler counts its requests in flight
        self.loads: dict[str, tuple[int, float]] = {}
        self.trainer_step: tuple[int, float] | None = None
        self.starting: dict[str, float] = {}
        self.waits: dict[str, tuple[str, float]] = {}
        self.stall: StallError | None = None  # set when the policy fails the run

    # -- progress ------------------------------------------------------------------------------
    def token(self, url: str) -> None:
        """Tokens arrived from `url` (called per streamed chunk: keep it cheap)."""
        self.last = self.tokens[url] = self.clock()
        self.events += 1  # not atomic across threads; a lost increment is harmless

    def mark(self, what: str, event: bool = True) -> None:
        """Progress of another kind; `event=False`: only resets the clock (a start, a recovery)."""
        self.last, self.last_what = self.clock(), what
        self.events += event

    def trainer_stepped(self, step: int) -> None:
        self.trainer_step = (step, self.clock())
        self.mark(f"trainer step {step}")

    @contextmanager
    def loading(self, url: str, step: int) -> Iterator[None]:
        """`url` loads the weights of `step`; progress once it has."""
        self.loads[url] = (step, self.clock())
        try:
            yield
            self.mark(f"replica {url} loaded step {step}")
        finally:
            self.loads.pop(url, None)

    @contextmanager
    def starting_up(self, what: str) -> Iterator[None]:
        """`what` starts (vLLM replicas): not a stall, however long it takes (its own timeout
        bounds it); its end counts as progress."""
        self.starting[what] = self.clock()
        try:
            yield
        finally:
            self.starting.pop(what, None)
            self.mark(f"{what} started", event=False)

    @contextmanager
    def waiting(self, name: str, what: str) -> Iterator[None]:
        """The flow's task `name` waits for `what` (what the stall summary says it waits for)."""
        self.waits[name] = (what, self.clock())
        try:
            yield
        finally:
            self.waits.pop(name, None)

    # -- the watchdog's side -------------------------------------------------------------------
    def idle_s(self) -> float:
        return self.clock() - self.last

    def fail(self, error: StallError) -> None:
        """The run fails: the waits that check (`check`) raise `error`."""
        self.stall = error

    def check(self) -> None:
        """Raise the stall that fails the run, if any (a wait's poll calls this)."""
        if self.stall is not None:
            raise self.stall

    def snapshot(self) -> ProgressSnapshot:
        now, last = self.clock(), self.last
        step, tokens = self.trainer_step, dict(self.tokens)
        newest = max(tokens, key=tokens.__getitem__, default=None)
        what = f"a token from {newest}" if newest is not None and tokens[newest] >= last else self.last_what
        return {
            "idle_s": now - last,
            "last": what,
            "token_age_s": {u: now - t for u, t in tokens.items()},
            "requests": {u: n for u, n in list(self.requests.items()) if n},
            "loads": {u: {"step": s, "age_s": now - t} for u, (s, t) in list(self.loads.items())},
            "trainer_step": None if step is None else step[0],
            "trainer_step_age_s": None if step is None else now - step[1],
            "starting": list(self.starting),
            "waits": [{"name": n, "what": w, "age_s": now - t} for n, (w, t) in list(self.waits.items())],
        }
