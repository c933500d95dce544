"""The run as the Prefect UI shows it while it goes, not only at its end: live artifacts under
stable keys (`<run>-progress`, `<run>-metrics`, `<run>-reward-curve`), the progress bar after every
step, the metrics table and the reward curve every few steps, at the end, and from a failing run's
cleanup. Recoveries are events the tasks emit (tasks/events.py).
"""

from __future__ import annotations

import base64
import time
from typing import Any

from prefect.artifacts import (
    create_image_artifact,
    create_progress_artifact,
    create_table_artifact,
    update_progress_artifact,
)

from rlfleet.flows.artifacts import artifact_key, metric_row
from rlfleet.report import reward_curve_png
from rlfleet.store import RunStore, layout
from rlfleet.store.records import StepRecord


class LiveArtifacts:
    """Progress after every step; the table and curve after the first step, then at most every
    PUBLISH_EVERY_S, and at the end. Rendering the curve costs ~0.25 s on 2 cores: drawn after
    every step it was a quarter of the tiny job's step loop (py-spy over the controller)."""

    PUBLISH_EVERY_S = 10.0

    def __init__(self, store: RunStore, name: str, max_steps: int, start: int):
        self.store, self.name, self.max_steps = store, name, max_steps
        self.rows: dict[int, dict[str, Any]] = {}  # a finished step's row, read from the store once
        self.published: int | None = None  # the last step the table and curve show
        self.published_at = -float("inf")  # time.monotonic() of that
        self.progress = create_progress_artifact(
            100.0 * start / max_steps, key=artifact_key(name, "progress"), description=self._said(start)
        )

    def _said(self, done: int) -> str:
        return f"rl run {self.name}: {done} of {self.max_steps} steps done"

    def step_done(self, step: int, steps: list[StepRecord]) -> None:
        update_progress_artifact(
            self.progress, 100.0 * (step + 1) / self.max_steps, description=self._said(step + 1)
        )
        if time.monotonic() - self.published_at >= self.PUBLISH_EVERY_S:
            self.publish(steps)

    def _row(self, rec: StepRecord) -> dict[str, Any]:
        if rec["step"] not in self.rows:
            self.rows[rec["step"]] = metric_row(self.store, rec)
        return self.rows[rec["step"]]

    def publish(self, steps: list[StepRecord]) -> None:
        """The metrics table and the reward curve of the steps so far (a new version of each key,
        unless the last one already shows them: the run's end follows its last step's publish)."""
        if not steps or steps[-1]["step"] == self.published:
            return
        self.published, self.published_at = steps[-1]["step"], time.monotonic()
        create_table_artifact(
            key=artifact_key(self.name, "metrics"),
            table=[self._row(rec) for rec in steps],
            description=f"per-step metrics of rl run {self.name} (steps 0-{steps[-1]['step']})",
        )
        png = reward_curve_png(steps, f"{self.name}: mean reward per step")
        self.store.write_bytes(layout.REWARD_CURVE, png)  # the run's curve file, as live as the artifact
        create_image_artifact(
            image_url="data:image/png;base64," + base64.b64encode(png).decode(),
            key=artifact_key(self.name, "reward-curve"),
            description=f"reward curve of rl run {self.name} (steps 0-{steps[-1]['step']})",
        )
