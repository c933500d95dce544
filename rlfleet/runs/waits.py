"""The wait chain of a stalled run, from what the controller knows (`RunState`): who waits for whom,
and which party is stuck (the culprit the policy relaunches). Pure functions of the state, so
tests give it any state they like; `RunHandles.run_state` (runs/handles.py) builds the real one.

The rules, first match wins:
1. a replica's weight load in flight for most of the stall (half or more): that replica;
2. the flow waits for a trainer step and the trainer has its model: the trainer;
3. replicas with requests in flight and no token for the whole stall: those replicas;
4. the stream waits for groups with no request on any replica: the controller (user env code, or
   the stream's event loop blocked); nothing to relaunch;
5. otherwise: unknown (the dumps say more).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal, TypedDict

from rlfleet.progress import ProgressSnapshot
from rlfleet.runs.dumps import RunProcess


class ReplicaState(TypedDict):
    index: int
    url: str
    pid: int | None  # its guard


class TrainerState(TypedDict):
    pid: int | None  # its guard; None: not launched here (SLURM ranks) or not running
    starting: bool  # launched, still loading its model


class StreamState(TypedDict):
    next_step: int  # the step the next take serves
    batch_size: int  # groups a step takes
    ready: int  # finished groups in the buffer
    in_flight: int  # groups sampling (or scoring)
    served: int  # the weight version the replicas hold


class RunState(TypedDict):
    timeout_s: float
    progress: ProgressSnapshot
    replicas: list[ReplicaState]
    trainer: TrainerState
    stream: StreamState | None
    processes: list[RunProcess]


Culprit = Literal["replica", "trainer", "controller", "unknown"]


@dataclass
class Diagnosis:
    culprit: Culprit
    replicas: list[int] = field(default_factory=list)  # the stuck ones, when culprit = replica
    why: str = ""  # one line: who is stuck and how we know
    chain: list[str] = field(default_factory=list)  # who waits for whom, one party a line


def replica_party(index: int) -> str:
    """A replica's name among a run's processes (`RunProcess.party`)."""
    return f"replica_{index}"


def _age(s: float | None) -> str:
    return "never" if s is None else f"{s:.0f} s ago"


def _procs(state: RunState, party: str) -> str:
    ps = [p for p in state["processes"] if p["party"] == party]
    ps = [p for p in ps if p["role"] != "guard"] or ps  # a guard says little, unless it is all there is
    return ", ".join(f"{p['role']} {p['pid']} {p['status']}" for p in ps) or "no process"


def diagnose(state: RunState) -> Diagnosis:
    prog, t = state["progress"], state["timeout_s"]
    by_url = {r["url"]: r for r in state["replicas"]}
    chain = [f"{w['name']} waits for {w['what']} ({w['age_s']:.0f} s)" for w in prog["waits"]]
    if (s := state["stream"]) is not None:
        chain.append(
            f"the rollout stream: step {s['next_step']} takes {s['batch_size']} groups: {s['ready']} finished, "
            f"{s['in_flight']} in flight (weights served: step {s['served']})"
        )
    for r in state["replicas"]:
        url = r["url"]
        load = prog["loads"].get(url)
        loading = f"loading step {load['step']} for {load['age_s']:.0f} s; " if load else ""
        chain.append(
            f"replica {r['index']} ({url}): {loading}{prog['requests'].get(url, 0)} requests in flight, "
            f"last token {_age(prog['token_age_s'].get(url))}; {_procs(state, replica_party(r['index']))}"
        )
    tr = state["trainer"]
    step = prog["trainer_step"]
    done = "no step yet" if step is None else f"last step {step}, {_age(prog['trainer_step_age_s'])}"
    chain.append(
        f"trainer: {'loading its model; ' if tr['starting'] else ''}{done}; {_procs(state, 'trainer')}"
    )

    # open for most of the stall: a load starts just after the progress it follows (a trainer step's
    # publish), so one that never returns is a little younger than the stall
    stuck = [
        (by_url[u]["index"], ld) for u, ld in prog["loads"].items() if u in by_url and ld["age_s"] >= t / 2
    ]
    if stuck:
        stuck.sort(key=lambda il: il[0])
        ld = max((ld for _, ld in stuck), key=lambda ld: ld["age_s"])
        return Diagnosis(
            "replica",
            [i for i, _ in stuck],
            f"replica {_names([i for i, _ in stuck])} has not finished loading the weights of step "
            f"{ld['step']} for {ld['age_s']:.0f} s",
            chain,
        )
    train = [w for w in prog["waits"] if w["name"].startswith("train-")]
    if train and not tr["starting"]:
        w = train[0]
        why = f"{w['name']} waits for {w['what']} for {w['age_s']:.0f} s; trainer: {_procs(state, 'trainer')}"
        return Diagnosis("trainer", [], why, chain)
    silent = sorted(
        r["index"]
        for r in state["replicas"]
        if prog["requests"].get(r["url"], 0) > 0 and prog["token_age_s"].get(r["url"], math.inf) >= t
    )
    if silent:
        urls = {r["index"]: r["url"] for r in state["replicas"]}
        age = max(prog["token_age_s"].get(urls[i], math.inf) for i in silent)
        since = f"for {age:.0f} s" if math.isfinite(age) else "yet"
        return Diagnosis(
            "replica", silent, f"replica {_names(silent)} has requests in flight and no token {since}", chain
        )
    if s is not None and s["in_flight"] and not any(prog["requests"].values()):
        return Diagnosis(
            "controller",
            [],
            f"step {s['next_step']} waits for {s['in_flight']} groups in flight, none of which has a request on a "
            "replica: they wait in environment code (reward, tool, env response) or the rollout stream's event "
            "loop is blocked (controller.txt has its thread)",
            chain,
        )
    return Diagnosis("unknown", [], f"nothing progressed for {prog['idle_s']:.0f} s; see the dumps", chain)


def _names(indices: list[int]) -> str:
    return ", ".join(str(i) for i in indices)


def summary(state: RunState, d: Diagnosis, action: str) -> str:
    """summary.txt: the stall in one line, the culprit, the wait chain, what rlfleet did."""
    prog = state["progress"]
    head = (
        f"stalled: nothing progressed for {prog['idle_s']:.0f} s (faults.stall_timeout_s = "
        f"{state['timeout_s']:g}); the last progress was {prog['last']}"
    )
    chain = "\n".join(f"  {line}" for line in d.chain)
    return f"{head}\nstuck: {d.culprit}: {d.why}\nwait chain:\n{chain}\naction: {action}\n"
