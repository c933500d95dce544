"""Which failures are retried: the classification and Prefect's task retries."""

from __future__ import annotations

import httpx
import pytest

from rlfleet.config.loader import ConfigError
from rlfleet.errors import DeterministicError, TransientError, is_transient


@pytest.mark.parametrize(
    ("exc", "transient"),
    [
        (httpx.ConnectError("refused"), True),
        (TimeoutError(), True),
        (TransientError("replica restarting"), True),
        (RuntimeError("unknown"), True),
        (DeterministicError("bad request"), False),
        (ValueError("shape mismatch"), False),
        (ConfigError("bad field"), False),
        (KeyError("missing"), False),
    ],
)
def test_retry_classification(exc, transient):
    assert is_transient(exc) is transient


def test_prefect_retries_transient_failures_only(prefect_api):
    from prefect import flow, task

    from rlfleet.config.models import RLConfig
    from rlfleet.tasks.rl import retry_options

    cfg = RLConfig.model_validate({"model": {"path": "m"}, "tasks": {"retries": 2, "retry_delay_s": 0}})
    calls: list[str] = []

    @task
    def flaky(kind: str) -> str:
        calls.append(kind)
        if kind == "transient" and calls.count(kind) < 3:
            raise httpx.ConnectError("connection refused")
        if kind == "deterministic":
            raise ValueError("wrong shape")
        return "ok"

    @flow
    def run(kind: str):
        return flaky.with_options(**retry_options(cfg))(kind)

    assert run("transient") == "ok"
    assert calls.count("transient") == 3
    with pytest.raises(ValueError, match="wrong shape"):
        run("deterministic")
    assert calls.count("deterministic") == 1
