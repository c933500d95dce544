"""A step trained before its controller died keeps its record: the rerun resumes past the step's
checkpoint, so only the rerun can write it (the chaos soak found it missing, benchmarks/chaos.py)."""

from __future__ import annotations

from rlfleet.flows.rl import restore_step_records, step_record
from rlfleet.store import RunStore, layout
from rlfleet.store.records import read_steps, write_metrics, write_step


def publish_step(store: RunStore, step: int) -> None:
    """What a step leaves in the store once trained: its rollout manifest and trainer metrics."""
    staged = store.staging_dir(layout.step_dir(layout.ROLLOUTS, step))
    (staged / layout.ROLLOUT_RECORDS).write_text("")
    store.publish_dir(
        staged,
        layout.step_dir(layout.ROLLOUTS, step),
        {
            "step": step,
            "mean_reward": 0.5 + step,
            "reward_errors": 0,
            "metrics": {},
            "policy_step": step - 1,
            "policy_steps": [step - 1],
            "sample_seconds": 1.0,
            "num_completion_tokens": 100,
            "stream": {"finished": 4},
            "buffered_groups": 0,
        },
    )
    metrics = {"loss": -0.1 * step, "train_seconds": 1.0, "step_seconds": 1.5, "max_staleness": 0}
    write_metrics(store, step, metrics | {"step": step, "clip_frac": 0.0, "mask_frac": 0.0})


def test_the_rerun_writes_the_record_its_dead_controller_did_not(tmp_path):
    store = RunStore(tmp_path)
    for s in range(3):
        publish_step(store, s)
    roll = store.manifest(layout.step_dir(layout.ROLLOUTS, 0))
    write_step(store, step_record(0, roll, store.read_json("metrics/step_0.json"), None, {}, 2.0))
    # step 1 checkpointed, its controller killed before its record; step 2 past the checkpoint
    assert restore_step_records(store, start=2) == [1]
    records = read_steps(store)
    assert [r["step"] for r in records] == [0, 1]
    assert records[1]["mean_reward"] == 1.5 and records[1]["loss"] == -0.1
    assert restore_step_records(store, start=2) == []  # a second rerun adds nothing
