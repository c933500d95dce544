"""The run's recoveries (`run/recoveries.json`): a relaunched trainer or vLLM replica, a rollout's
samples sent again. The tasks that recover append one each (tasks/events.py `recovered`, which also
tells the user); the flow's summary counts them."""

from __future__ import annotations

import threading
import time
from typing import Any

from rlfleet.store import RunStore, layout

_lock = threading.Lock()  # tasks run in worker threads of the flow's process


def record(store: RunStore, what: str, message: str, **payload: Any) -> None:
    with _lock:
        event = {"event": what, "at": time.time(), "message": message, **payload}
        store.write_json(layout.RECOVERIES, [*recoveries(store), event])


def recoveries(store: RunStore) -> list[dict[str, Any]]:
    return store.read_json(layout.RECOVERIES) if store.exists(layout.RECOVERIES) else []
