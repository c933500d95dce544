"""`rlfleet trainer --bench` and `rlfleet sft --bench`: fake data through the real step, a table, JSON."""

from __future__ import annotations

import json
import math

import pytest

from rlfleet.cli import main

ROOT_ARGS = ["--bench.seq-len", "48", "--bench.micro-batch-size", "2", "--bench.warmup-steps", "1"]
ROOT_ARGS += ["--bench.micro-batches", "3"]


@pytest.mark.parametrize("command", ["trainer", "sft"])
def test_bench_measures_the_real_step_and_writes_json(command, tiny_model, tmp_path, capsys):
    out = tmp_path / "bench.json"
    argv = [command, "--model.path", str(tiny_model), "--output-dir", str(tmp_path / "run"), "--bench"]
    if command == "sft":
        argv += ["--data.path", "unused-by-the-bench.jsonl"]
    argv += [*ROOT_ARGS, "--bench.steps", "3", "--trainer.lr", "1e-2", "--bench.output-json", str(out)]
    assert main(argv) == 0

    result = json.loads(out.read_text())
    assert result["loss"] == ("sft" if command == "sft" else "grpo")
    assert result["world"] == 1 and result["tokens_per_step"] == 3 * 2 * 48  # micro-batches x rows x seq
    assert len(result["step_seconds_all"]) == 3 and all(t > 0 for t in result["step_seconds_all"])
    assert result["tokens_per_second"] == pytest.approx(result["tokens_per_step"] / result["step_seconds"])
    assert result["mfu"] is None  # no GPU peak to compare against on CPU
    losses = result["losses"]
    assert len(losses) == 4 and all(math.isfinite(x) for x in losses)
    if command == "sft":
        assert losses[-1] < losses[0]  # the same fake batch every step: the NLL must fall
    assert "tokens/s" in capsys.readouterr().out
    assert not (tmp_path / "run").exists(), "the bench writes nothing to the run's output dir"
