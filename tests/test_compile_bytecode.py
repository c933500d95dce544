"""scripts/compile_bytecode.py, which `make install` runs: bytecode for every module a run can
import, none for a package's own `tests/`, and a file that does not compile is counted, not fatal."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

from tests.helpers import ROOT


def pyc(source: Path) -> Path:
    return Path(importlib.util.cache_from_source(str(source)))


def test_modules_are_compiled_and_a_packages_tests_are_not(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "tests").mkdir(parents=True)
    (pkg / "sub").mkdir()
    modules = [pkg / "__init__.py", pkg / "sub" / "m.py"]
    for i, path in enumerate(modules):
        path.write_text(f"X = {i}\n")
    (pkg / "tests" / "test_m.py").write_text("Y = 1\n")
    (pkg / "py2.py").write_text("print 'a Python 2 file, as some packages ship'\n")
    run = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "compile_bytecode.py"), str(tmp_path)],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "compiled 2 of 3 files" in run.stderr
    assert all(pyc(m).is_file() for m in modules)
    assert not pyc(pkg / "tests" / "test_m.py").exists()
    assert not pyc(pkg / "py2.py").exists()
