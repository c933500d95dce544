"""What keeps the docs from drifting: every config field has a description (the generated
reference would warn, and `mkdocs build --strict` fail), and BENCHMARKS.md's table is the one
benchmarks/summarize.py writes from benchmarks/results/."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from pydantic import BaseModel, Field

ROOT = Path(__file__).resolve().parent.parent


def _module(rel: str):
    spec = importlib.util.spec_from_file_location(Path(rel).stem, ROOT / rel)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def test_every_config_field_has_a_description():
    text, missing = _module("scripts/config_reference.py").render()
    assert missing == [], f"add Field(description=...) to: {missing}"
    assert '### [orchestrator.env.args] (type = "python")' in text
    assert "`stream_interval`" in text and "`startup_timeout_s`" in text


def test_a_field_without_description_is_reported():
    ref = _module("scripts/config_reference.py")

    class Inner(BaseModel):
        """A table."""

        documented: int = Field(1, description="Has one.")
        bare: int = 2

    class Root(BaseModel):
        inner: Inner = Field(default_factory=Inner)  # a table: its docstring is enough

    w = ref.Walk()
    ref.walk(Root, "", "root", "root", w)
    assert [m.rsplit(".", 1)[-1] for m in w.missing] == ["bare"]
    assert [s.title for s in w.sections] == ["root", "[inner]"]


def test_benchmarks_summary_is_current():
    summarize = _module("benchmarks/summarize.py")
    assert summarize.main(["--check"]) == 0, "run: python benchmarks/summarize.py"
