"""Sequence packing: rows hold several samples, attention and loss stay inside each sample."""

from __future__ import annotations

import copy
import random

import pytest
import torch

from rlfleet.config.loss import LossConfig
from rlfleet.config.models import RLConfig, TrainerConfig
from rlfleet.microbatches import first_fit, packed_micro_batches, padded
from rlfleet.orchestrator.rollout import single_turn
from rlfleet.trainer.losses import PolicyLoss
from rlfleet.trainer.train import Policy, load_model, make_optimizer, train_step


def _records(n: int, vocab: int = 128, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        p, c = rng.randint(2, 9), rng.randint(1, 12)
        prompt = [1] + [rng.randrange(3, vocab) for _ in range(p - 1)]
        completion = [rng.randrange(3, vocab) for _ in range(c)]
        logprobs = [-rng.uniform(0.5, 5.0) for _ in range(c)]
        out.append(
            {
                "group": i // 4,
                **single_turn(prompt, completion, logprobs),
                "advantage": rng.uniform(-1.5, 1.5),
            }
        )
    return out


def test_first_fit_places_every_sequence_once_within_capacity():
    lengths = [7, 3, 9, 1, 4, 4, 8, 2, 10, 5]
    rows = first_fit(lengths, 10)
    assert sorted(i for r in rows for i in r) == list(range(len(lengths)))
    assert all(sum(lengths[i] for i in r) <= 10 for r in rows)
    assert len(rows) == 6  # 53 tokens: first-fit decreasing needs 6 rows of 10 here
    with pytest.raises(ValueError, match="11 tokens does not fit a packed row of 10"):
        first_fit([3, 11], 10)


def test_packed_rows_hold_samples_with_restarting_positions():
    recs = _records(12)
    (mb,) = packed_micro_batches(recs, pad_id=0, seq_len=32, rows_per_micro=64)
    assert set(mb) == {"input_ids", "loss_mask", "old_logprobs", "advantages", "position_ids", "real_tokens"}
    assert mb["input_ids"].shape[1] == 32
    lengths = [len(r["input_ids"]) for r in recs]
    assert mb["input_ids"].shape[0] == len(first_fit(lengths, 32)) < len(recs)
    assert int(mb["real_tokens"].sum()) == sum(lengths)  # a row's tail padding is not a token
    assert int(mb["loss_mask"].sum()) == sum(sum(r["loss_mask"]) for r in recs)
    assert int((mb["position_ids"] == 0).sum()) >= len(recs)  # each sample starts at position 0
    assert torch.isclose(mb["old_logprobs"].sum(), torch.tensor(sum(sum(r["logprobs"]) for r in recs))).item()


@pytest.fixture(scope="module")
def policy(tiny_model):
    torch.manual_seed(0)
    return Policy(load_model(str(tiny_model), "float32", torch.device("cpu")))


@torch.no_grad()
def test_packed_logprobs_equal_each_sample_alone(policy):
    recs = _records(10)
    (mb,) = packed_micro_batches(recs, pad_id=0, seq_len=64, rows_per_micro=64)
    packed, _ = policy(mb["input_ids"], 1.0, mb["position_ids"])
    got = packed[mb["loss_mask"][:, 1:].bool()]
    alone = []
    for r in sorted(recs, key=lambda r: -(len(r["input_ids"]))):
        one = padded([r], 0)
        lp, _ = policy(one["input_ids"])
        alone.append(lp[one["loss_mask"][:, 1:].bool()])
    # Row-major order of loss tokens in the packed rows differs from `sorted` order only by row
    # membership; compare as multisets of per-sample vectors via the sorted values.
    want = torch.cat(alone)
    assert got.shape == want.shape
    torch.testing.assert_close(got.sort().values, want.sort().values, rtol=1e-5, atol=1e-5)

    # Negative control: one position ramp over the whole row lets samples attend to each other.
    ramp = torch.arange(64).expand_as(mb["input_ids"])
    leaky, _ = policy(mb["input_ids"], 1.0, ramp)
    assert not torch.allclose(
        leaky[mb["loss_mask"][:, 1:].bool()].sort().values, want.sort().values, atol=1e-3
    )


def test_packed_train_step_equals_padded(tiny_model):
    recs = _records(16)
    num_tokens = sum(sum(r["loss_mask"]) for r in recs)
    cfg = TrainerConfig(lr=1e-2)
    results = []
    for micro in (
        [padded(recs[i : i + 4], 0) for i in range(0, 16, 4)],
        packed_micro_batches(recs, pad_id=0, seq_len=48, rows_per_micro=2),
    ):
        torch.manual_seed(0)
        model = Policy(load_model(str(tiny_model), "float32", torch.device("cpu")))
        opt = make_optimizer(model, cfg)
        metrics = train_step(
            model, opt, copy.deepcopy(micro), PolicyLoss(LossConfig(), num_tokens), cfg.max_grad_norm
        )
        results.append((metrics, [p.detach().clone() for p in model.parameters()]))
    (m_pad, p_pad), (m_pack, p_pack) = results
    assert abs(m_pad["loss"] - m_pack["loss"]) < 1e-5
    assert abs(m_pad["grad_norm"] - m_pack["grad_norm"]) < 1e-4 * max(1.0, m_pad["grad_norm"])
    # Adam's first step moves each element by ~lr whatever the gradient's size, so compare the
    # updated weights at a tolerance far below lr (a near-zero gradient summed in another order,
    # one attention call a sample instead of one a row, moves its element by ~1e-4).
    for a, b in zip(p_pad, p_pack, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=5e-4)


def test_seq_len_shorter_than_model_len_is_rejected():
    with pytest.raises(
        ValueError, match=r"orchestrator.seq_len \(64\) must be at least inference.max_model_len"
    ):
        RLConfig(model={"path": "m"}, orchestrator={"seq_len": 64}, inference={"max_model_len": 128})


def test_packed_sft_step_equals_padded(tiny_model):
    from rlfleet.trainer.nll import NLL
    from rlfleet.trainer.sft_data import Example, micro_batches
    from rlfleet.trainer.sft_data import packed_micro_batches as sft_packed

    rng = random.Random(1)
    examples = []
    for _ in range(12):
        n = rng.randint(4, 20)
        examples.append(Example([1] + [rng.randrange(3, 128) for _ in range(n - 1)], [0] * 3 + [1] * (n - 3)))
    results = []
    for micro in (micro_batches(examples, 4, 0), sft_packed(examples, 2, 40, 0)):
        torch.manual_seed(0)
        model = Policy(load_model(str(tiny_model), "float32", torch.device("cpu")))
        results.append(train_step(model, make_optimizer(model, TrainerConfig()), micro, NLL(micro), 1.0))
    assert results[0]["loss_tokens"] == results[1]["loss_tokens"] == sum(sum(e.loss_mask) for e in examples)
    assert abs(results[0]["loss"] - results[1]["loss"]) < 1e-5
    assert abs(results[0]["grad_norm"] - results[1]["grad_norm"]) < 1e-4


def test_warm_up_leaves_parameters_grads_and_rng_as_they_were(tiny_model):
    """The trainer's start-up (a real forward and backward; the optimizer's state created early for
    the checkpoint buffers) changes nothing a step depends on: a warmed-up trainer's first step
    equals a cold one's."""
    from rlfleet.trainer.train import init_optimizer_state, warm_up

    recs = _records(16)
    num_tokens = sum(sum(r["loss_mask"]) for r in recs)
    cfg = TrainerConfig(lr=1e-2)
    results = []
    for warmed in (False, True):
        model = Policy(load_model(str(tiny_model), "float32", torch.device("cpu")))
        torch.manual_seed(0)
        if warmed:
            before, rng = [p.detach().clone() for p in model.parameters()], torch.get_rng_state()
            assert warm_up(model, None) > 0
            assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
            assert all(p.grad is None for p in model.parameters())
            assert torch.equal(torch.get_rng_state(), rng)
        optimizer = make_optimizer(model, cfg)
        if warmed:
            init_optimizer_state(optimizer)
            assert len(optimizer.state) == len(list(model.parameters()))
        micro = packed_micro_batches(recs, pad_id=0, seq_len=48, rows_per_micro=2)
        metrics = train_step(model, optimizer, micro, PolicyLoss(LossConfig(), num_tokens), cfg.max_grad_norm)
        results.append((metrics["loss"], [p.detach().clone() for p in model.parameters()]))
    (cold_loss, cold), (warm_loss, warm) = results
    assert cold_loss == warm_loss
    assert all(torch.equal(a, b) for a, b in zip(cold, warm, strict=True))
