"""MoE router load per step (rlfleet/trainer/router.py) on the real tiny Qwen3-MoE (4 experts, top-2)."""

from __future__ import annotations

import math

import pytest
import torch

from rlfleet.config.loss import LossConfig
from rlfleet.config.models import TrainerConfig
from rlfleet.microbatches import micro_batches
from rlfleet.trainer.losses import PolicyLoss
from rlfleet.trainer.nll import NLL
from rlfleet.trainer.parallel import Parallel, apply_activation_checkpointing
from rlfleet.trainer.router import load_metrics, real_token_mask
from rlfleet.trainer.tiny import make_tiny_model
from rlfleet.trainer.train import Policy, accumulate, load_model, make_optimizer, train_step, warm_up
from tests.helpers import random_records

PAD = 0


def records(n: int, seed: int = 0) -> list[dict]:
    """Trajectories of 3-20 tokens, advantages alternating -1, +1."""
    return random_records(n, seed, lambda rng, i: 1.0 if i % 2 else -1.0)


@pytest.fixture(scope="module")
def moe_model(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("models") / "qwen3_moe", seed=0, arch="qwen3_moe")


def _policy(path) -> Policy:
    torch.manual_seed(0)
    return Policy(load_model(str(path), "float32", torch.device("cpu")))


def _by_hand(policy: Policy, mbs: list[dict[str, torch.Tensor]]) -> torch.Tensor:
    """[layers, experts]: top-k of transformers' own router logits, counted on real tokens only."""
    lm, k = policy.lm, policy.lm.config.num_experts_per_tok
    counts = torch.zeros(lm.config.num_hidden_layers, lm.config.num_experts, dtype=torch.float64)
    with torch.no_grad():
        for mb in mbs:
            pos = mb.get("position_ids")  # use_cache=False as the trainer: packed rows stay apart
            out = lm(input_ids=mb["input_ids"], position_ids=pos, use_cache=False, output_router_logits=True)
            real = real_token_mask(mb).flatten()
            for layer, logits in enumerate(out.router_logits):
                picked = logits.topk(k, dim=-1).indices[real]
                counts[layer] += torch.bincount(picked.flatten(), minlength=counts.shape[1]).double()
    return counts


@pytest.mark.parametrize("seq_len", [0, 32])
def test_counts_are_the_router_logits_top_k_on_real_tokens_only(moe_model, seq_len):
    recs = records(10)
    mbs = micro_batches(recs, PAD, 4, seq_len)
    policy = _policy(moe_model)
    assert policy.routing is not None and policy.routing.layers == 2 and policy.routing.experts == 4
    for mb in mbs:
        with torch.no_grad(), policy.routing.counting(mb):
            policy(mb["input_ids"], 1.0, mb.get("position_ids"))
    got = policy.routing.step_counts()
    assert torch.equal(got, _by_hand(policy, mbs))
    real = sum(len(r["input_ids"]) for r in recs)
    padded = sum(mb["input_ids"].numel() for mb in mbs)
    assert padded > real  # there is padding to leave out, and it is left out:
    assert got.sum(-1).tolist() == [2.0 * real] * 2


def test_padding_and_a_ranks_filler_micro_batch_route_nothing(moe_model):
    """Rank 1 of 2 over 3 micro-batches trains micro-batch 1 and a zeroed repeat of micro-batch 0
    (so FSDP's collectives pair up); only micro-batch 1's real tokens count. Nothing counts
    outside `counting` (a forward of someone else's: the LoRA reference, a recompute)."""
    mbs = micro_batches(records(9), PAD, 3)
    policy = _policy(moe_model)
    with torch.no_grad():
        policy(mbs[2]["input_ids"])
    assert policy.routing.counts is None
    accumulate(policy, mbs, lambda mb, lp, ent: (lp.sum() * 0.0, {}), 1.0, Parallel(rank=1, world=2))
    assert torch.equal(policy.routing.step_counts(), _by_hand(policy, [mbs[1]]))
    assert policy.routing.step_counts().sum(-1).tolist() == [2.0 * int(mbs[1]["real_tokens"].sum())] * 2


@pytest.mark.parametrize("objective", ["rl", "sft"])
def test_a_train_step_on_the_moe_reports_router_load(moe_model, objective):
    recs = records(8)
    mbs = micro_batches(recs, PAD, 3)
    policy = _policy(moe_model)
    opt = make_optimizer(policy, TrainerConfig(lr=1e-3))
    warm_up(policy, None)  # its dummy row must not leak into step 0's counts
    loss = (
        NLL(mbs) if objective == "sft" else PolicyLoss(LossConfig(), sum(sum(r["loss_mask"]) for r in recs))
    )
    metrics = train_step(policy, opt, mbs, loss, 1.0)
    counts = _by_hand(policy, mbs)  # the weights moved after the forward: only the totals compare
    assert metrics["router/tokens"] == sum(len(r["input_ids"]) for r in recs)
    assert metrics == metrics | load_metrics(policy.routing.step_counts(), 2)
    assert counts.sum() == policy.routing.step_counts().sum()
    assert 0.0 <= metrics["router/max_vio"] <= 4 / 2 - 1
    assert metrics["router/load_cv"] >= 0.0 and 0 <= metrics["router/dead_experts"] <= 8
    # a second step counts only its own tokens
    again = train_step(policy, opt, mbs[:1], loss, 1.0)
    assert again["router/tokens"] == int(mbs[0]["real_tokens"].sum())


def test_activation_checkpointing_recompute_is_not_counted_twice(moe_model):
    mbs = micro_batches(records(6), PAD, 3)
    totals = []
    for mode in ("none", "full"):
        policy = _policy(moe_model)
        apply_activation_checkpointing(policy, mode)
        opt = make_optimizer(policy, TrainerConfig(lr=1e-3))
        train_step(policy, opt, mbs, NLL(mbs), 1.0)
        totals.append(policy.routing.step_counts())
        assert policy.routing._pending == []  # the backward's recompute left no indices behind
    assert torch.equal(*totals)


def test_a_dense_model_has_no_router_metrics(tiny_model):
    policy = _policy(tiny_model)
    assert policy.routing is None
    mbs = micro_batches(records(4), PAD, 2)
    metrics = train_step(policy, make_optimizer(policy, TrainerConfig()), mbs, NLL(mbs), 1.0)
    assert not [k for k in metrics if k.startswith("router/")]


def test_load_metrics_by_hand():
    """Layer 0 perfectly even; layer 1 one expert at twice the mean and one dead (8 tokens, top-2)."""
    counts = torch.tensor([[4.0, 4.0, 4.0, 4.0], [8.0, 0.0, 4.0, 4.0]], dtype=torch.float64)
    m = load_metrics(counts, 2)
    assert m["router/max_vio"] == 1.0  # (8 - 4) / 4, the worse layer
    assert math.isclose(m["router/load_cv"], (0.0 + math.sqrt(8.0) / 4) / 2)
    assert m["router/dead_experts"] == 1.0 and m["router/tokens"] == 8.0
    assert load_metrics(torch.zeros(2, 4, dtype=torch.float64), 2) == {}
