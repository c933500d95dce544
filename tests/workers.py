"""How `make test` spreads the suite over its xdist workers (`pytest -n N --dist loadgroup`).

A fixture wider than a test is built once per worker that runs a test using it. So the tests that
share one run on one worker (an `xdist_group`): those of a fixture the machine may hold only once
or that is costly to build for the whole session (`SHARED_ONCE`), and those of one module that
share a module-scoped fixture (a vLLM host, a wheel's venv, a Prefect worker). xdist reads the
groups from the node ids, which pytest 9.2 no longer lets it mark: pyproject.toml keeps pytest
below it, and tests/test_suite_layout.py fails if the grouping stops.

Then the longest tests go first, so that the run does not end waiting on one of them while the
other workers idle: the end-to-end ones (marked `e2e` or `slurm`) ahead of the rest.

A pytest plugin (`pytest_plugins` in conftest.py), so tests/test_suite_layout.py can load it into
a suite of its own.
"""

from __future__ import annotations

import pytest

# session-scoped fixtures whose tests all run on one worker: fixture -> group
SHARED_ONCE = {"slurm": "slurm", "smollm2": "smollm2"}
LONG = ("e2e", "slurm")


def group_of(item: pytest.Item) -> str | None:
    """The worker group of `item`, or None when any worker may run it."""
    names = getattr(item, "fixturenames", ())
    for fixture, group in SHARED_ONCE.items():
        if fixture in names:
            return group
    info = getattr(item, "_fixtureinfo", None)
    defs = info.name2fixturedefs.values() if info is not None else ()
    if any(d[-1].scope == "module" for d in defs if d):
        return item.nodeid.split("::", 1)[0]
    return None


# before xdist's own hook, which reads the `xdist_group` marks into the node ids it schedules by
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        group = group_of(item)
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))
    items.sort(key=lambda item: not any(item.get_closest_marker(m) for m in LONG))  # stable
