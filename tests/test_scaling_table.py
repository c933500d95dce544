"""benchmarks/scaling.py's table: every layout is a valid job, efficiency is against the right
1-GPU baseline, and the picture is drawn from the JSON (the GPU runs themselves need a 4-GPU host)."""

from __future__ import annotations

import importlib.util
import json
import shlex
import sys
from pathlib import Path

import pytest

from rlfleet.config.loader import load
from rlfleet.config.models import RLConfig

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def scaling():
    if str(ROOT / "benchmarks") not in sys.path:  # its siblings (common.py), as when run as a script
        sys.path.insert(0, str(ROOT / "benchmarks"))
    spec = importlib.util.spec_from_file_location("scaling", ROOT / "benchmarks" / "scaling.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def test_every_layout_loads_and_names_a_one_gpu_baseline_of_its_own_async_level(scaling):
    for name, layout in scaling.LAYOUTS.items():
        cfg = load(RLConfig, ["--model.path", "m", *shlex.split(layout.overrides)])
        base = scaling.LAYOUTS[layout.baseline]
        assert base.gpus == 1, name
        base_cfg = load(RLConfig, ["--model.path", "m", *shlex.split(base.overrides)])
        assert cfg.orchestrator.max_async_level == base_cfg.orchestrator.max_async_level, name
    assert scaling.LAYOUTS["colocated-sleep-4"].baseline == "shared-1-k0"  # sleep needs k = 0


def test_an_async_level_applies_to_the_k1_layouts_and_leaves_the_asleep_one_at_0(
    scaling, tmp_path, capsys, monkeypatch
):
    argv = ["--only", "shared-1,colocated-sleep-4", "--max-async-level", "2", "--dry-run"]
    monkeypatch.setattr(sys, "argv", ["scaling.py", *argv, "--out", str(tmp_path / "k2.json")])
    scaling.main()
    shared, asleep = capsys.readouterr().out.strip().splitlines()
    for line, k in ((shared, 2), (asleep, 0)):
        variant = shlex.split(line)[shlex.split(line).index("--variants") + 1].split("=", 1)[1]
        cfg = load(RLConfig, ["--model.path", "m", *shlex.split(variant)])
        assert cfg.orchestrator.max_async_level == k, line


def _result(tokens_per_s: float, mfu: list[float | None]) -> dict:
    n = len(mfu)
    per_step = {"step": [10.0] * n, "mfu": mfu, "train_tokens_per_s": [1e5] * n, "broadcast": [0.5] * n}
    return {"gen_tokens_per_s": tokens_per_s, "busy": 0.8, "median_step_s": 10.0, "per_step": per_step}


def test_rows_give_efficiency_against_the_baseline_and_skip_the_compiling_step(scaling, tmp_path):
    rows = {
        "shared-1": scaling.row("shared-1", {"shared-1": _result(10_000, [0.01, 0.30, 0.34])}),
        "colocated-4": scaling.row("colocated-4", {"colocated-4": _result(30_000, [0.02, 0.20, 0.40])}),
        "colocated-sleep-4": scaling.row("colocated-sleep-4", {"colocated-sleep-4": _result(20_000, [None])}),
    }
    scaling.with_efficiency(rows)
    assert rows["shared-1"]["efficiency"] == pytest.approx(1.0)
    assert rows["colocated-4"]["efficiency"] == pytest.approx(0.75)
    assert rows["colocated-4"]["trainer_mfu"] == pytest.approx(0.30)  # median of steps 1.., not step 0
    assert rows["colocated-sleep-4"]["efficiency"] is None  # its k = 0 baseline did not run
    assert rows["colocated-sleep-4"]["trainer_mfu"] is None  # a CPU-like run reports none

    doc = tmp_path / "scaling.json"
    doc.write_text(json.dumps({"shape": "05b", "device": "test", "rows": rows}))
    png = scaling.plot(doc)
    assert png == tmp_path / "scaling.png" and png.stat().st_size > 0


def test_merge_joins_lanes_and_computes_efficiency_across_them(scaling, tmp_path):
    """Lanes run side by side on disjoint GPUs: the 4-GPU layout's efficiency is against the
    baseline that ran in another lane, and a lane's skipped layouts do not enter the table."""
    one = {"visible_gpus": 1, "shape": "05b", "steps": 4, "device": "H200", "rows": {}, "layouts": {}}
    one["layouts"]["shared-1"] = {"gpus": 1}
    one["layouts"]["colocated-4"] = {"gpus": 4, "skipped": "needs 4 GPUs, 1 visible"}
    one["rows"]["shared-1"] = scaling.row("shared-1", {"shared-1": _result(10_000, [0.0, 0.4])})
    four = {
        "visible_gpus": 4,
        "shape": "05b",
        "steps": 4,
        "rows": {},
        "layouts": {"colocated-4": {"gpus": 4}},
    }
    four["rows"]["colocated-4"] = scaling.row("colocated-4", {"colocated-4": _result(20_000, [0.0, 0.3])})
    four["rows"]["colocated-4"]["efficiency"] = None  # as its lane wrote it: no baseline there
    parts = []
    for name, lane in (("a.json", four), ("b.json", one)):  # the skip comes after the run
        parts.append(tmp_path / name)
        parts[-1].write_text(json.dumps(lane))

    png = scaling.merge(tmp_path / "table.json", parts)
    doc = json.loads((tmp_path / "table.json").read_text())
    assert doc["rows"]["colocated-4"]["efficiency"] == pytest.approx(0.5)
    assert doc["layouts"]["colocated-4"] == {"gpus": 4}  # the lane that ran it, not the one that skipped it
    assert doc["device"] == "H200" and [lane["file"] for lane in doc["lanes"]] == ["a.json", "b.json"]
    assert png.stat().st_size > 0

    parts[0].write_text(json.dumps(four | {"steps": 10}))  # a lane of another job
    with pytest.raises(SystemExit, match="ran steps 10, the lanes before it 4"):
        scaling.merge(tmp_path / "other.json", parts[::-1])
    parts[0].write_text(json.dumps(four | {"max_async_level": 2}))  # more steps in flight
    with pytest.raises(SystemExit, match="ran max_async_level 2, the lanes before it None"):
        scaling.merge(tmp_path / "other.json", parts[::-1])
