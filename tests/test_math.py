import math

import pytest
import torch

from rlfleet.config.advantage import AdvantageConfig
from rlfleet.config.loss import LossConfig
from rlfleet.orchestrator.advantages import advantages, grpo_advantages
from rlfleet.trainer.lm_head import token_logprobs
from rlfleet.trainer.losses import StepNorm, micro_batch_loss, policy_fn


def _close(got, want, tol=1e-5):
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert abs(g - w) < tol, (got, want)


def grpo_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    num_tokens: int,
    clip_low: float = 0.2,
    clip_high: float = 0.28,
    mask_low: float = 0.0,
    mask_high: float = float("inf"),
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The `grpo` loss of `[loss]` with these bounds: PPO-clip on every
    masked-in token whose ratio lies in [mask_low, mask_high], summed / `num_tokens`.

    logprobs, old_logprobs (the sampler's), mask: [B, T]; advantages: [B] or [B, T].
    """
    cfg = LossConfig(
        clip_low=clip_low, clip_high=clip_high, mask_ratio_low=mask_low, mask_ratio_high=mask_high
    )
    return micro_batch_loss(
        cfg, policy_fn(cfg), logprobs, old_logprobs, advantages, mask, StepNorm(num_tokens)
    )


# -- advantages ---------------------------------------------------------------------------------
def test_grpo_advantages_hand_computed():
    a, b, c = grpo_advantages([[1, 0, 0, 1], [3.0, 3.0, 3.0], [0.0, 1.0, 2.0]])
    _close(a, [1.0, -1.0, -1.0, 1.0])  # mean 0.5, population std 0.5
    assert b == [0.0, 0.0, 0.0]  # constant group: no signal
    # mean 1, population std sqrt(2/3) = 0.8164966 -> +-1/0.8164966 = +-1.2247449
    _close(c, [-1.2247449, 0.0, 1.2247449])


def test_grpo_advantages_single_group_zero_mean():
    (adv,) = grpo_advantages([[0.2, 0.9, 0.4, 0.5, 0.0]])
    assert abs(sum(adv)) < 1e-9


def test_grpo_advantages_without_std_by_hand():
    """Dr.GRPO sec. 3.2: A_i = r_i - mean(r), no division by std(r)."""
    (a,) = advantages([[1, 0, 0, 1]], AdvantageConfig(std_normalize=False))
    _close(a, [0.5, -0.5, -0.5, 0.5])
    (b,) = advantages([[0.0, 1.0, 2.0]], AdvantageConfig(std_normalize=False))
    _close(b, [-1.0, 0.0, 1.0])


def test_rloo_advantages_by_hand():
    """RLOO (Ahmadian et al. 2024, eq. 5): A_i = r_i - 1/(k-1) sum_{j != i} r_j."""
    a, b, c = advantages([[1, 0, 0, 1], [3.0, 3.0, 3.0], [0.0, 1.0, 2.0]], AdvantageConfig(type="rloo"))
    _close(a, [1 - 1 / 3, 0 - 2 / 3, 0 - 2 / 3, 1 - 1 / 3])
    assert b == [0.0, 0.0, 0.0]
    _close(c, [0 - 1.5, 1 - 1.0, 2 - 0.5])


def test_reinforce_pp_advantages_by_hand():
    """REINFORCE++ (Hu et al. 2025, eq. 8-9): r - baseline, then (A - mean_batch) / std_batch.

    group baseline: groups [1,0,0,1] (mean 0.5) and [0,0,0,1] (mean 0.25) centre to
    [.5,-.5,-.5,.5,-.25,-.25,-.25,.75], batch mean 0, population variance (4 x .25 + 3 x .0625 +
    .5625) / 8 = .21875. batch baseline: r - 3/8, variance (3 x .390625 + 5 x .140625) / 8 = .234375.
    """
    rewards = [[1, 0, 0, 1], [0, 0, 0, 1]]
    g = advantages(rewards, AdvantageConfig(type="reinforce_pp"))
    sd = math.sqrt(0.21875)
    _close([x for row in g for x in row], [v / sd for v in [0.5, -0.5, -0.5, 0.5, -0.25, -0.25, -0.25, 0.75]])
    b = advantages(rewards, AdvantageConfig(type="reinforce_pp", baseline="batch"))
    sd = math.sqrt(0.234375)
    _close([x for row in b for x in row], [(r - 0.375) / sd for row in rewards for r in row])


def test_batches_carry_the_configured_advantages():
    from rlfleet.orchestrator.step_batches import with_advantages

    recs = [{"group": g, "reward": r} for g, r in [(1, 0.0), (0, 1.0), (0, 0.0), (1, 2.0)]]
    out = with_advantages(recs, AdvantageConfig(type="rloo"))
    assert [(m["group"], m["advantage"]) for m in out] == [(0, 1.0), (0, -1.0), (1, -2.0), (1, 2.0)]
    assert [m["advantage"] for m in with_advantages(recs)] == pytest.approx([1, -1, -1, 1], abs=1e-5)


# -- loss ---------------------------------------------------------------------------------------
CLIP_LOW, CLIP_HIGH = 0.2, 0.28
OLD = [[-1.0, -2.0, -0.5], [-1.5, -0.7, -3.0]]
# target ratios new/old per token; the last token of row 1 is padding (masked out)
RATIOS = [[1.5, 1.1, 0.5], [0.5, 1.5, 3.0]]
MASK = [[1, 1, 1], [1, 1, 0]]
ADV = [1.0, -2.0]
# (0,0): ratio 1.5 > 1.28, A>0 -> clipped      (0,1): 1.1, inside the range -> unclipped
# (0,2): 0.5 < 0.8 but A>0 -> unclipped         (1,0): 0.5 < 0.8, A<0 -> clipped
# (1,1): 1.5 > 1.28 but A<0 -> unclipped        (1,2): padding
CLIPPED = [[True, False, False], [True, False, False]]
NUM_TOKENS = 5


def _tensors():
    new = [
        [o + math.log(r) for o, r in zip(orow, rrow, strict=True)]
        for orow, rrow in zip(OLD, RATIOS, strict=True)
    ]
    logprobs = torch.tensor(new, dtype=torch.float64, requires_grad=True)
    return (
        logprobs,
        torch.tensor(OLD, dtype=torch.float64),
        torch.tensor(ADV, dtype=torch.float64),
        torch.tensor(MASK),
    )


def _reference():
    """Loss and d(loss)/d(logprob) in plain Python floats."""
    total, grads = 0.0, [[0.0] * 3 for _ in range(2)]
    for b in range(2):
        for t in range(3):
            if not MASK[b][t]:
                continue
            new = OLD[b][t] + math.log(RATIOS[b][t])
            ratio = math.exp(new - OLD[b][t])
            a = ADV[b]
            clamped = max(1 - CLIP_LOW, min(1 + CLIP_HIGH, ratio))
            unclipped, clipped = ratio * a, clamped * a
            total += -min(unclipped, clipped)
            if unclipped <= clipped:  # the unclipped branch is active: d/dlogp of -ratio*A
                grads[b][t] = -ratio * a / NUM_TOKENS
    return total / NUM_TOKENS, grads


def test_reference_is_the_hand_number():
    loss, _ = _reference()
    # -1.28 - 1.1 - 0.5 + 1.6 + 3.0 = 1.72 over 5 tokens
    assert loss == pytest.approx(0.344, abs=1e-12)


def test_grpo_loss_value_and_stats():
    logprobs, old, adv, mask = _tensors()
    loss, stats = grpo_loss(logprobs, old, adv, mask, NUM_TOKENS, CLIP_LOW, CLIP_HIGH)
    want, _ = _reference()
    assert loss.item() == pytest.approx(want, abs=1e-9)
    assert stats["clipped_tokens"] == 2.0
    assert stats["ratio_sum"] == pytest.approx(1.5 + 1.1 + 0.5 + 0.5 + 1.5, abs=1e-9)
    assert stats["mismatch_kl_sum"] > 0


def test_mismatch_kl_resolves_a_one_in_a_million_gap():
    """vLLM's and the trainer's logprobs differ by ~1e-6: the KL must not round to 0.0."""
    logprobs = torch.tensor([[-1.0, -2.0, -0.5]], dtype=torch.float32)
    old = logprobs + torch.tensor([[1e-6, -2e-6, 5.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    _, stats = grpo_loss(logprobs, old, torch.tensor([1.0]), mask, 2)
    gaps = (logprobs.double() - old.double())[0, :2]
    want = float((torch.expm1(gaps) - gaps).sum())
    assert want > 0 and float(stats["mismatch_kl_sum"]) == pytest.approx(want, rel=1e-6)
    assert float(stats["logprob_diff_max"]) == float(gaps.abs().max()) < 3e-6  # the masked 5.0 is left out


def test_grpo_loss_gradient_only_through_unclipped_masked_in_tokens():
    logprobs, old, adv, mask = _tensors()
    loss, _ = grpo_loss(logprobs, old, adv, mask, NUM_TOKENS, CLIP_LOW, CLIP_HIGH)
    loss.backward()
    grad = logprobs.grad.tolist()
    _, want = _reference()
    for b in range(2):
        for t in range(3):
            if CLIPPED[b][t] or not MASK[b][t]:
                assert grad[b][t] == 0.0, (b, t, grad)
            else:
                assert grad[b][t] != 0.0
                assert grad[b][t] == pytest.approx(want[b][t], abs=1e-9)
    # hand numbers: -1.1/5, -0.5/5, +2*1.5/5
    assert grad[0][1] == pytest.approx(-0.22)
    assert grad[0][2] == pytest.approx(-0.1)
    assert grad[1][1] == pytest.approx(0.6)


def test_grpo_loss_masks_tokens_with_ratio_out_of_bounds():
    """Off-policy masking: with bounds [0.6, 1.4] only token (0,1) (ratio 1.1) stays in the loss.

    (0,0) 1.5, (0,2) 0.5, (1,0) 0.5, (1,1) 1.5 are masked whatever PPO's clip would have done;
    (1,2) is padding and does not count as masked. The normalizer stays the step's 5 tokens:
    loss = -(1.1 * 1.0) / 5 = -0.22, gradient -1.1/5 on (0,1) and 0 everywhere else.
    """
    logprobs, old, adv, mask = _tensors()
    loss, stats = grpo_loss(logprobs, old, adv, mask, NUM_TOKENS, CLIP_LOW, CLIP_HIGH, 0.6, 1.4)
    assert loss.item() == pytest.approx(-0.22, abs=1e-9)
    assert stats["masked_tokens"] == 4.0 and stats["clipped_tokens"] == 0.0
    loss.backward()
    grad = logprobs.grad.tolist()
    assert grad[0][1] == pytest.approx(-0.22)
    assert [g for row in grad for g in row].count(0.0) == 5
    # default bounds mask nothing: the plain PPO-clip loss
    unmasked, stats = grpo_loss(logprobs, old, adv, mask, NUM_TOKENS, CLIP_LOW, CLIP_HIGH, 0.125, 8.0)
    assert unmasked.item() == pytest.approx(_reference()[0], abs=1e-9) and stats["masked_tokens"] == 0.0


def test_grpo_loss_micro_batches_sum_to_full_batch():
    logprobs, old, adv, mask = _tensors()
    full, full_stats = grpo_loss(logprobs, old, adv, mask, NUM_TOKENS, CLIP_LOW, CLIP_HIGH)
    full.backward()
    full_grad = logprobs.grad.clone()
    logprobs.grad = None

    parts = [
        grpo_loss(logprobs[s], old[s], adv[s], mask[s], NUM_TOKENS, CLIP_LOW, CLIP_HIGH)
        for s in (slice(0, 1), slice(1, 2))
    ]
    total = parts[0][0] + parts[1][0]
    total.backward()
    assert total.item() == pytest.approx(full.item(), abs=1e-12)
    assert torch.allclose(logprobs.grad, full_grad, atol=1e-12)
    assert parts[0][1]["clipped_tokens"] + parts[1][1]["clipped_tokens"] == full_stats["clipped_tokens"]


def test_grpo_loss_per_token_advantages_match_per_sequence():
    logprobs, old, adv, mask = _tensors()
    a, _ = grpo_loss(logprobs, old, adv, mask, NUM_TOKENS, CLIP_LOW, CLIP_HIGH)
    b, _ = grpo_loss(logprobs, old, adv[:, None].expand(2, 3), mask, NUM_TOKENS, CLIP_LOW, CLIP_HIGH)
    assert a.item() == pytest.approx(b.item(), abs=1e-12)


# -- token logprobs -----------------------------------------------------------------------------
def _manual(logits, targets, temperature):
    lp = torch.log_softmax(logits.double() / temperature, dim=-1)
    B, T = targets.shape
    return torch.tensor(
        [[lp[b, t, targets[b, t]].item() for t in range(T)] for b in range(B)], dtype=torch.float64
    )


@pytest.mark.parametrize("temperature", [1.0, 2.0])
def test_token_logprobs_matches_manual_gather(temperature):
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 4, 7, generator=g)
    targets = torch.randint(0, 7, (2, 4), generator=g)
    got = token_logprobs(logits, targets, temperature)
    assert got.shape == (2, 4)
    assert got.dtype == torch.float32
    assert torch.allclose(got.double(), _manual(logits, targets, temperature), atol=1e-5)


def test_token_logprobs_temperature_changes_values_and_upcasts():
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(1, 3, 5, generator=g) * 3
    targets = torch.zeros(1, 3, dtype=torch.long)
    assert not torch.allclose(token_logprobs(logits, targets, 1.0), token_logprobs(logits, targets, 2.0))
    assert token_logprobs(logits.to(torch.bfloat16), targets).dtype == torch.float32
