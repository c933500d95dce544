"""What keeps the docs from drifting: every config field has a description (the generated
reference would warn, and `mkdocs build --strict` fail), and the Benchmarks page (BENCHMARKS.md, its
docs copy, the README's numbers, the summary figure's JSON) is what benchmarks/summarize.py writes
from benchmarks/results/. tests/test_docs_browser.py looks at the built pages."""

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


def test_the_headline_is_one_row_per_claim_after_its_picture():
    summarize = _module("benchmarks/summarize.py")
    start, end = summarize.MARKS["page"]
    block = (ROOT / "BENCHMARKS.md").read_text().split(start)[1].split(end)[0]
    assert block.strip().startswith("![")  # the summary figure leads the page
    table = [line for line in block.splitlines() if line.startswith("| ")]
    header, rows = table[0], table[1:]
    assert "command" not in header and 1 <= len(rows) <= 12
    assert len({row.split(" | ")[1] for row in rows}) == len(rows), "one row per claim"
    readme = (ROOT / "README.md").read_text()
    for row in rows:  # the README's numbers are the headline's
        claim, mine, peer, ratio = row.split(" | ")[1:5]
        assert f"| {claim} | {mine} | {peer} | {ratio} |" in readme


def test_learning_plot_titles_from_the_runs_job():
    if str(ROOT / "benchmarks") not in sys.path:  # its siblings (common.py), as when run as a script
        sys.path.insert(0, str(ROOT / "benchmarks"))
    plot = _module("benchmarks/learning_vs_trl.py")
    run = {"config": {"model": "/m/smollm2", "job": "examples/smollm2/reason.toml", "max_tokens": 1024}}
    assert plot.job_title([run, run]) == "smollm2, examples/smollm2/reason.toml, max_tokens 1024"
    assert plot.job_title([{"framework": "trl"}]) == "learning_vs_trl.py runs"
