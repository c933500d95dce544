"""scripts/compile_bytecode.py, which `make install` runs: bytecode for every module a run can
import, none for a package's own `tests/`, and a file that does not compile is counted, not fatal;
`make run`'s install compiles the directories its list names, the list written from where a run
left bytecode."""

from __future__ import annotations

import importlib.util
import py_compile
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


def load_script():
    spec = importlib.util.spec_from_file_location(
        "compile_bytecode", ROOT / "scripts" / "compile_bytecode.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_run_list_names_the_directories_a_run_imported_from(tmp_path, monkeypatch, capsys):
    script = load_script()
    monkeypatch.setattr(script, "RUN_IMPORTS", tmp_path / "run_imports.txt")
    site = tmp_path / "site"
    for rel in ("pkg/__init__.py", "pkg/a.py", "pkg/sub/__init__.py", "pkg/sub/b.py", "other/c.py", "top.py"):
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        (site / rel).write_text("X = 1\n")
    for imported in ("pkg/__init__.py", "top.py"):  # what a run's imports left behind
        py_compile.compile(str(site / imported), cfile=str(pyc(site / imported)))
    script.record([site])
    assert [x for x in script.RUN_IMPORTS.read_text().splitlines() if not x.startswith("#")] == [".", "pkg"]
    # each named directory's own modules (pkg/a.py too, not imported then), not its subpackages
    files = {Path(f).relative_to(site).as_posix() for f in script.listed([site])}
    assert files == {"pkg/__init__.py", "pkg/a.py", "top.py"}
    script.RUN_IMPORTS.write_text("pkg\ngone/with/an/upgrade\n")  # a listed directory that is gone: skipped
    assert {Path(f).name for f in script.listed([site])} == {"__init__.py", "a.py"}
    assert "1 of 2 directories in run_imports.txt are not installed" in capsys.readouterr().err
