"""Recoveries as first-class events: a relaunched trainer or vLLM replica, and a rollout's samples
sent again after a replica failed them, are a WARNING in the flow run's log, a Prefect event
(`rlfleet.trainer.relaunched`, `rlfleet.replica.relaunched`, `rlfleet.rollout.resent`) a user can
attach an automation to, and a line in the run's recoveries (runs/recoveries.py), which the
summary counts."""

from __future__ import annotations

from typing import Any

from prefect import get_run_logger
from prefect.events import emit_event
from prefect.runtime import flow_run

from rlfleet.runs.recoveries import record
from rlfleet.store import RunStore


def recovered(store: RunStore, run: str, what: str, message: str, **payload: Any) -> None:
    """Record a recovery (`what`: trainer.relaunched, replica.relaunched, rollout.resent) where a
    user sees it."""
    get_run_logger().warning(message)
    related = [
        {"prefect.resource.id": f"prefect.flow-run.{flow_run.id}", "prefect.resource.role": "flow-run"}
    ]
    emit_event(
        event=f"rlfleet.{what}",
        resource={"prefect.resource.id": f"rlfleet.run.{run}", "prefect.resource.name": run},
        related=related if flow_run.id else None,
        payload={"message": message, **payload},
    )
    record(store, what, message, **payload)
