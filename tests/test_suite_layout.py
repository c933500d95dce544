"""The test suite's own shape: test modules share code through tests/helpers.py (and the helper
modules beside it), never by importing one another or conftest; and how `make test` spreads them
over its workers (tests/workers.py)."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def test_no_test_module_imports_another_or_conftest():
    bad = []
    for path in sorted(TESTS.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = (
                [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else []
            )
            for name in names:
                module = name.removeprefix("tests.")
                if name.startswith("tests.") and (module.startswith("test_") or module == "conftest"):
                    bad.append(f"{path.name}:{node.lineno} imports {name}")
    assert not bad, "import from tests/helpers.py instead:\n" + "\n".join(bad)


SUITE = """
import os, pytest

@pytest.fixture(scope="module")
def host(tmp_path_factory):
    with open(os.environ["BUILT"], "a") as f:
        f.write(os.environ.get("PYTEST_XDIST_WORKER", "main") + "\\n")

@pytest.mark.parametrize("i", range(6))
def test_uses_the_host(host, i):
    pass

@pytest.mark.parametrize("i", range(6))
def test_alone(i):
    pass

@pytest.mark.e2e
def test_long():
    pass
"""


def test_a_module_fixture_is_built_once_across_workers_and_long_tests_go_first(tmp_path):
    """tests/workers.py under `make test`'s scheduling: the six tests sharing a module-scoped
    fixture run on one of two workers, which builds it once; the e2e test is collected first."""
    (tmp_path / "conftest.py").write_text('pytest_plugins = ["tests.workers"]\n')
    (tmp_path / "test_suite.py").write_text(SUITE)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}  # this run's own options
    env |= {"PYTHONPATH": str(TESTS.parent), "BUILT": str(tmp_path / "built.txt")}
    args = [
        sys.executable,
        "-m",
        "pytest",
        "-p",
        "no:cacheprovider",
        "--rootdir",
        str(tmp_path),
        "-o",
        "markers=e2e",
    ]
    run = subprocess.run(
        [*args, "-q", "-n", "2", "--dist", "loadgroup", str(tmp_path)],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert len((tmp_path / "built.txt").read_text().split()) == 1, run.stdout
    listed = subprocess.run(
        [*args, "--collect-only", "-q", str(tmp_path)],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert listed.stdout.splitlines()[0].endswith("::test_long"), listed.stdout
