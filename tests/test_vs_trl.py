"""benchmarks/vs_trl.py's TRL side data parallel (`--trl-processes`): the same job on 2 processes
(torchrun, gloo on a CPU) as on 1 keeps each step's batch of sequences, every rank writes its clock
and the combined one sums their tokens. The GPU runs (nccl, a colocated vLLM per rank) need a
multi-GPU host: docs/benchmarks/long-generations.md."""

from __future__ import annotations

import importlib
import json
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from rlfleet.config.loader import load
from rlfleet.config.models import RLConfig

ROOT = Path(__file__).resolve().parents[1]
BATCH, GROUP, STEPS = 4, 4, 2


@pytest.fixture(scope="module")
def bench():
    """benchmarks/ on the path, as its scripts import one another (vs_trl -> common, trl_servers, trl_worker)."""
    if str(ROOT / "benchmarks") not in sys.path:
        sys.path.insert(0, str(ROOT / "benchmarks"))
    return importlib.import_module("vs_trl"), importlib.import_module("trl_worker")


def run_trl(vs_trl, model: Path, tmp: Path, processes: int) -> tuple[dict, dict]:
    """vs_trl's TRL run of the tiny job, cut to 2 steps of 4 x 4 sequences; (spec, result)."""
    argv = ["@", str(vs_trl.JOB), "--model.path", str(model), "--output-dir", str(tmp / "rlfleet")]
    argv += ["--max-steps", str(STEPS), "--orchestrator.batch-size", str(BATCH)]
    argv += ["--orchestrator.group-size", str(GROUP), "--orchestrator.max-tokens", "8"]
    tmp.mkdir()
    spec = vs_trl.trl_spec(load(RLConfig, argv), model, tmp, "cpu", "hf", processes)
    return spec, vs_trl.run_trl(spec, tmp, tmp / "trl.log")


def test_two_processes_share_the_step_batch_and_their_clocks_add_up(bench, tiny_model, tmp_path):
    # benchmark tooling, not the product: TRL is the `bench` extra, which `make test` leaves out
    pytest.importorskip("trl", reason="TRL is the bench extra: make bench-install")
    vs_trl, _ = bench
    with ThreadPoolExecutor(2) as pool:  # side by side: most of each run is importing TRL
        runs = [
            pool.submit(run_trl, vs_trl, tiny_model, tmp_path / name, n)
            for name, n in (("one", 1), ("two", 2))
        ]
        (one_spec, one), (two_spec, two) = (r.result() for r in runs)

    seqs = BATCH * GROUP
    g1, g2 = one_spec["grpo"], two_spec["grpo"]
    assert g1["per_device_train_batch_size"] * g1["gradient_accumulation_steps"] == seqs
    assert 2 * g2["per_device_train_batch_size"] * g2["gradient_accumulation_steps"] == seqs

    # one process writes the spec's result itself, each of two its own
    assert Path(one_spec["result"]).exists()
    result = Path(two_spec["result"])
    assert not result.exists()
    ranks = [json.loads(result.with_name(f"trl_clock.rank{r}.json").read_text()) for r in (0, 1)]

    assert one["steps"] == two["steps"] == STEPS
    assert all(len(r["gens"]) == STEPS for r in ranks)
    # each rank generates half of a step's sequences; together as many as one process
    assert [[len(g["lengths"]) for g in r["gens"]] for r in ranks] == [[seqs // 2] * STEPS] * 2
    assert [len(x) for x in two["per_step"]["lengths"]] == [len(x) for x in one["per_step"]["lengths"]]
    assert [len(x) for x in one["per_step"]["lengths"]] == [seqs] * STEPS
    # per step: the ranks' tokens summed, the slowest rank's generation
    assert two["per_step"]["tokens"] == [sum(r["gens"][s]["tokens"] for r in ranks) for s in range(STEPS)]
    assert two["per_step"]["tokens"] == [sum(x) for x in two["per_step"]["lengths"]]
    assert two["per_step"]["generate"] == [
        max(r["gens"][s]["generate_s"] for r in ranks) for s in range(STEPS)
    ]
    assert one.keys() == two.keys() and one["per_step"].keys() == two["per_step"].keys()


def test_the_step_batch_splits_over_processes_or_is_refused(bench):
    _, trl_worker = bench
    assert trl_worker.trl_batch(256, 8, 4) == {
        "per_device_train_batch_size": 8,
        "gradient_accumulation_steps": 8,
    }
    # a micro-batch larger than a process's share is the share
    assert trl_worker.trl_batch(32, 32, 2) == {
        "per_device_train_batch_size": 16,
        "gradient_accumulation_steps": 1,
    }
    with pytest.raises(SystemExit, match="24 sequences .* 5 processes x micro-batches of 4"):
        trl_worker.trl_batch(24, 4, 5)
    with pytest.raises(SystemExit, match="32 sequences .* 2 processes x micro-batches of 5"):
        trl_worker.trl_batch(32, 5, 2)


def test_lora_reaches_trls_side_as_the_same_peft_adapters(bench, tiny_model, tmp_path):
    """`--lora R` (rlfleet's [trainer.lora]) gives TRL's GRPOTrainer PEFT adapters of the same rank,
    alpha, dropout and targets; without it TRL trains the full model."""
    vs_trl, _ = bench
    argv = ["@", str(vs_trl.JOB), "--model.path", str(tiny_model), "--output-dir", str(tmp_path / "r")]
    full = vs_trl.trl_spec(load(RLConfig, argv), tiny_model, tmp_path, "cpu", "hf", 1)
    cfg = load(RLConfig, [*argv, "--trainer.lora.rank", "8", "--trainer.lora.alpha", "24"])
    lora = vs_trl.trl_spec(cfg, tiny_model, tmp_path, "cpu", "hf", 1)
    assert "peft" not in full
    assert lora["peft"] == {
        "r": 8,
        "lora_alpha": 24.0,
        "lora_dropout": 0.0,
        "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
        "bias": "none",
        "task_type": "CAUSAL_LM",
    }
