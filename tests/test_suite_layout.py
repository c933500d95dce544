"""The test suite's own shape: test modules share code through tests/helpers.py (and the helper
modules beside it), never by importing one another or conftest."""

from __future__ import annotations

import ast
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
