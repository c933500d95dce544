"""A GPU trainer's micro-batches by tokens: the sizing arithmetic (no GPU), and rows regrouped
into micro-batches train exactly as the orchestrator's did."""

from __future__ import annotations

import copy

import pytest
import torch

from rlfleet.config.loss import LossConfig
from rlfleet.config.models import ModelConfig, TrainerConfig, TrainerJobConfig
from rlfleet.config.sizing import (
    GIB,
    HEADROOM,
    MARGIN,
    requested_rows,
    row_groups,
    size_micro_batch,
)
from rlfleet.microbatches import flat_rows, packed_micro_batches, regroup_rows, samples_of
from rlfleet.trainer.budget import TokenBudget
from rlfleet.trainer.losses import PolicyLoss
from rlfleet.trainer.parallel import Parallel
from rlfleet.trainer.train import Policy, load_model, make_optimizer, train_step
from tests.helpers import random_records


def records(n: int, seed: int = 0) -> list[dict]:
    return random_records(n, seed, lambda rng, i: rng.gauss(0, 1))


def test_unset_the_micro_batch_is_the_most_rows_the_free_memory_holds_after_a_margin():
    # 40 GiB free, 4 GiB for the weight transport later: 36 GiB less 10% and the headroom
    s = size_micro_batch(40 * GIB, 3 * GIB, 8192, later_bytes=4 * GIB)
    assert s.usable_bytes == int(36 * GIB * (1 - MARGIN)) - HEADROOM
    assert s.fit_rows == s.rows == s.usable_bytes // (3 * GIB) == 10
    assert s.tokens == 10 * 8192 and s.fits
    assert s.token_bytes == 3 * GIB / 8192
    assert "10 rows of 8192 tokens = 81920 tokens" in s.line()


def test_what_a_micro_batch_pays_once_is_not_counted_per_row():
    # 35.5 GiB usable; a row of 3 GiB of which 1 GiB (gathered parameters) once: 1 + 17 x 2 fit
    s = size_micro_batch(40 * GIB, 3 * GIB, 8192, fixed_bytes=GIB)
    assert (s.fit_rows, s.fixed_bytes, s.token_bytes) == (17, GIB, 2 * GIB / 8192)
    # more than half a row "once" is not believed: clamped to half
    assert size_micro_batch(40 * GIB, 3 * GIB, 8192, fixed_bytes=3 * GIB).fixed_bytes == 3 * GIB // 2


def test_a_row_that_does_not_fit_leaves_zero_rows_and_does_not_fit():
    s = size_micro_batch(10 * GIB, 12 * GIB, 8192)
    assert (s.rows, s.fit_rows, s.fits) == (0, 0, False)
    assert not size_micro_batch(GIB // 4, 1, 8192).fits  # free below the headroom: nothing is usable


def test_a_requested_budget_is_a_cap_met_with_fewer_rows_when_fewer_fit():
    free, row = 40 * GIB, 3 * GIB  # 40 GiB less 10% and the headroom: 11 rows fit
    asked = size_micro_batch(free, row, 4608, requested_tokens=8 * 4608)
    assert (asked.rows, asked.tokens, asked.fits) == (8, 8 * 4608, True)
    too_many = size_micro_batch(free, row, 4608, requested_tokens=16 * 4608)
    assert (too_many.rows, too_many.fit_rows, too_many.asked_rows, too_many.fits) == (11, 11, 16, True)
    assert "at most the 16 asked" in too_many.line()
    none_fit = size_micro_batch(2 * GIB, row, 4608, requested_tokens=8 * 4608)
    assert (none_fit.rows, none_fit.fits) == (0, False)


def test_a_budget_counts_whole_rows_and_never_fewer_than_one():
    assert requested_rows(8 * 4608, 8192) == 4  # 36864 tokens: 4 rows of 8192, at most the budget
    assert requested_rows(512, 8192) == 1  # one sequence of 512 still trains: a row is the least
    assert requested_rows(8192, 8192) == 1


@pytest.mark.parametrize(
    ("total", "most", "ranks", "expected"),
    [
        (10, 4, 1, [4, 3, 3]),
        (10, 4, 2, [3, 3, 2, 2]),
        (8, 8, 1, [8]),
        (3, 8, 4, [1, 1, 1]),  # fewer rows than ranks: one row each, the rest repeat a zeroed one
        (78, 8, 1, [8] * 8 + [7] * 2),
        (0, 8, 1, []),
    ],
)
def test_rows_split_evenly_within_the_budget_and_over_the_ranks(total, most, ranks, expected):
    groups = row_groups(total, most, ranks)
    assert groups == expected
    assert sum(groups) == total and all(1 <= g <= most for g in groups)
    if total >= ranks:
        assert len(groups) % ranks == 0


def test_regrouped_rows_train_the_same_step(tiny_model):
    """The trainer's micro-batches by tokens are the orchestrator's rows regrouped: same rows in the
    same order, so the same loss, gradient norm and weights after the step."""
    recs = records(24)
    num_tokens = sum(sum(r["loss_mask"]) for r in recs)
    micro = packed_micro_batches(recs, pad_id=0, seq_len=32, rows_per_micro=1)
    rows = sum(len(m["input_ids"]) for m in micro)
    assert rows >= 4
    regrouped = regroup_rows(micro, row_groups(rows, 3))
    assert [len(m["input_ids"]) for m in regrouped] == row_groups(rows, 3)
    assert torch.equal(
        torch.cat([m["input_ids"] for m in regrouped]), torch.cat([m["input_ids"] for m in micro])
    )
    _same_step(tiny_model, micro, regrouped, num_tokens, atol=1e-4)


def _same_step(tiny_model, a: list, b: list, num_tokens: int, atol: float) -> tuple[dict, dict]:
    """One GRPO step from the same weights over micro-batches `a`, then `b`: the same loss, gradient
    norm and weights after it (Adam's first step moves each element by ~lr whatever its gradient:
    `atol` is far below lr). Both steps' metrics."""
    results = []
    for batches in (a, b):
        torch.manual_seed(0)
        model = Policy(load_model(str(tiny_model), "float32", torch.device("cpu")))
        opt = make_optimizer(model, TrainerConfig(lr=1e-2))
        m = train_step(model, opt, copy.deepcopy(batches), PolicyLoss(LossConfig(), num_tokens), 1.0)
        results.append((m, [p.detach().clone() for p in model.parameters()]))
    (m_a, p_a), (m_b, p_b) = results
    assert abs(m_a["loss"] - m_b["loss"]) < 1e-5
    assert abs(m_a["grad_norm"] - m_b["grad_norm"]) < 1e-4 * max(1.0, m_a["grad_norm"])
    for x, y in zip(p_a, p_b, strict=True):
        torch.testing.assert_close(x, y, rtol=0, atol=atol)
    return m_a, m_b


def test_samples_repacked_into_flat_rows_train_the_same_step_with_no_padding(tiny_model):
    """Under varlen attention the trainer repacks the step's samples into one flat row a micro-batch:
    every sample once, whole, no padding, at most the budget; the loss, gradient norm and weights
    after the step match the orchestrator's padded rows."""
    recs = records(24)
    num_tokens = sum(sum(r["loss_mask"]) for r in recs)
    micro = packed_micro_batches(recs, pad_id=0, seq_len=32, rows_per_micro=2)
    flat = flat_rows(micro, capacity=40)
    lengths = sorted(len(r["input_ids"]) for r in recs)
    assert sorted(len(s["input_ids"]) for s in samples_of(flat)) == lengths
    assert all(m["input_ids"].shape[0] == 1 and m["input_ids"].shape[1] <= 40 for m in flat)
    assert [int(m["real_tokens"]) for m in flat] == [m["input_ids"].shape[1] for m in flat]  # no padding
    assert (
        sum(m["input_ids"].numel() for m in flat) == sum(lengths) < sum(m["input_ids"].numel() for m in micro)
    )
    assert len(flat_rows(micro, capacity=40, ranks=4)) % 4 == 0  # the count divides over the ranks
    tight = flat_rows(micro, capacity=4)  # a budget below the longest sample: rows of the longest
    assert max(m["input_ids"].shape[1] for m in tight) == lengths[-1] and len(tight) > len(flat)
    # per-sample attention sums in another order than per-row: a near-zero gradient's element moves ~1e-4
    rows, flat_step = _same_step(tiny_model, micro, flat, num_tokens, atol=5e-4)
    assert flat_step["padding_frac"] == 0.0 < rows["padding_frac"]


def test_regroup_refuses_a_split_that_loses_rows():
    micro = packed_micro_batches(records(8), pad_id=0, seq_len=32, rows_per_micro=1)
    rows = sum(len(m["input_ids"]) for m in micro)
    with pytest.raises(ValueError, match="rows asked"):
        regroup_rows(micro, [rows + 1])


def test_a_cpu_trainer_keeps_the_micro_batches_it_is_given(tiny_model):
    """No probe and no regrouping on a CPU, even for packed rows and a token budget."""
    cfg = TrainerJobConfig(
        model=ModelConfig(path=str(tiny_model)), trainer=TrainerConfig(micro_batch_tokens=64)
    )
    policy = Policy(load_model(str(tiny_model), "float32", torch.device("cpu")))
    budget = TokenBudget(cfg, Parallel(), policy, make_optimizer(policy, cfg.trainer))
    micro = packed_micro_batches(records(16), pad_id=0, seq_len=32, rows_per_micro=1)
    assert budget.micro_batches(micro, by_tokens=True) is micro
    assert budget.metrics(len(micro)) == {}


class _FakeProbe:
    """probe_row's peaks for a model that costs `fixed` bytes a micro-batch and `per_token` a
    token, a third of it under selective activation checkpointing and a tenth under full (the
    modes TokenBudget turns on are recorded, not applied)."""

    SAVES = {"none": 1, "selective": 3, "full": 10}

    def __init__(self, monkeypatch, per_token: int, free: int, fixed: int = 256 << 20):
        self.per_token, self.fixed, self.modes, self.rows = per_token, fixed, ["none"], []
        monkeypatch.setattr("rlfleet.trainer.budget.probe_row", self.probe_row)
        monkeypatch.setattr("rlfleet.trainer.budget.free_memory", lambda device: free)
        monkeypatch.setattr("rlfleet.trainer.budget.apply_activation_checkpointing", self.checkpoint)

    @property
    def checkpointed(self) -> bool:
        return self.modes[-1] != "none"

    def probe_row(self, policy, par, tokens, sync):
        self.rows.append(tokens)
        return self.fixed + tokens * self.per_token // self.SAVES[self.modes[-1]]

    def checkpoint(self, model, mode):
        self.modes.append(mode)


def _budget(tiny_model, **trainer) -> TokenBudget:
    cfg = TrainerJobConfig(model=ModelConfig(path=str(tiny_model)), trainer=TrainerConfig(**trainer))
    policy = Policy(load_model(str(tiny_model), "float32", torch.device("cpu")))
    return TokenBudget(cfg, Parallel(), policy, make_optimizer(policy, cfg.trainer))


def test_rows_that_fit_keep_activation_checkpointing_off(tiny_model, monkeypatch):
    probe = _FakeProbe(monkeypatch, per_token=64 << 10, free=8 * GIB)  # a row of 8192: 0.5 GiB
    budget = _budget(tiny_model)
    sizing = budget.size(8192)
    assert not probe.checkpointed and budget.checkpointing == "none"
    assert (sizing.row_bytes, sizing.fixed_bytes) == (GIB // 2 + (256 << 20), 256 << 20)
    assert sizing.rows == sizing.fit_rows >= 1
    assert probe.rows[-1] == 8192  # the largest row was measured, after the short ones predicted it
    assert all(p.grad is None for p in budget.policy.parameters())


def test_a_row_that_does_not_fit_turns_selective_checkpointing_on_before_full(
    tiny_model, monkeypatch, caplog
):
    probe = _FakeProbe(monkeypatch, per_token=1 << 20, free=6 * GIB)  # a row: 8 GiB, 2.7 selective
    budget = _budget(tiny_model)
    with caplog.at_level("INFO", logger="rlfleet.trainer"):
        sizing = budget.size(8192)
    assert probe.modes == ["none", "selective"] and budget.checkpointing == "selective"
    row = (256 << 20) + 8192 * (1 << 20) // 3
    assert sizing.fits and sizing.rows == size_micro_batch(6 * GIB, row, 8192, fixed_bytes=256 << 20).rows
    assert "activation checkpointing turned on (selective)" in caplog.text
    assert "micro-batches: sized to the free memory; activation checkpointing selective" in caplog.text

    probe = _FakeProbe(monkeypatch, per_token=1 << 20, free=3 * GIB)  # selective 2.7 GiB: too much
    budget = _budget(tiny_model)
    assert budget.size(8192).fits
    assert probe.modes == ["none", "selective", "full"] and budget.checkpointing == "full"


def test_a_cap_is_met_with_fewer_rows_without_checkpointing_where_they_fit(tiny_model, monkeypatch, caplog):
    """64 rows asked, a few fit without checkpointing: those, not full checkpointing, not a refusal."""
    probe = _FakeProbe(monkeypatch, per_token=64 << 10, free=8 * GIB)  # a row of 8192: 0.5 GiB
    budget = _budget(tiny_model, micro_batch_tokens=64 * 8192)
    with caplog.at_level("INFO", logger="rlfleet.trainer"):
        sizing = budget.size(8192)
    assert probe.modes == ["none"] and budget.checkpointing == "none"
    assert 1 <= sizing.rows == sizing.fit_rows < 64 and sizing.asked_rows == 64
    assert "trainer.micro_batch_tokens as a cap" in caplog.text and "at most the 64 asked" in caplog.text


def test_a_row_that_does_not_fit_even_fully_checkpointed_is_refused_naming_the_field(tiny_model, monkeypatch):
    from rlfleet.errors import DeterministicError

    _FakeProbe(monkeypatch, per_token=16 << 20, free=6 * GIB)  # a row: 128 GiB, 12.8 checkpointed
    budget = _budget(tiny_model, micro_batch_tokens=64 * 8192)
    with pytest.raises(DeterministicError, match=r"orchestrator\.seq_len: one packed row of 8192 tokens"):
        budget.size(8192)
    assert budget.checkpointing == "full"  # tried before refusing
