"""The `[loss]` seam: every loss type, IS correction, KL and entropy term against the papers'
formulas computed by hand here; the default bit for bit equal to the frozen pre-`[loss]` GRPO loss;
micro-batches accumulating to one batch's gradient under every aggregation, packed and padded."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from rlfleet.config.loss import LossConfig
from rlfleet.config.models import TrainerConfig
from rlfleet.microbatches import micro_batches
from rlfleet.trainer.lm_head import chunked_logprobs, logprobs_and_entropy
from rlfleet.trainer.losses import PolicyLoss, StepNorm, micro_batch_loss, policy_fn
from rlfleet.trainer.train import Policy, accumulate, load_model, make_optimizer, optimizer_step, train_step
from tests.helpers import random_records


def frozen_grpo_loss(
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
    """rlfleet/trainer/loss.py:grpo_loss before `[loss]` (commit c8a4a59), verbatim: the spec.

    PPO-clip on every masked-in token whose ratio lies in [mask_low, mask_high].

    logprobs, old_logprobs, mask: [B, T]; advantages: [B] (one per sequence, GRPO) or [B, T].
    Returns the loss contribution of this micro-batch and summed statistics for logging (0-d
    tensors: reading them is a device sync, so the caller sums them first).
    """
    mask = mask.to(logprobs.dtype)
    adv = advantages.unsqueeze(-1) if advantages.dim() == 1 else advantages
    log_ratio = (logprobs - old_logprobs) * mask
    ratio = torch.exp(log_ratio)
    unclipped = ratio * adv
    clipped = torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high) * adv
    per_token = -torch.minimum(unclipped, clipped)
    with torch.no_grad():
        in_range = ((ratio >= mask_low) & (ratio <= mask_high)).to(mask.dtype)
    loss = (per_token * mask * in_range).sum() / max(num_tokens, 1)
    with torch.no_grad():
        is_clipped = (clipped < unclipped).to(mask.dtype) * mask * in_range
        # The sampler/trainer gap is ~1e-6 nats: its KL (~x^2/2) vanishes in float32, so float64
        # and expm1 (exp(x) - 1 without the cancellation).
        gap = (logprobs.double() - old_logprobs.double()) * mask.double()
        stats = {
            "clipped_tokens": is_clipped.sum(),
            "masked_tokens": (mask * (1.0 - in_range)).sum(),
            "ratio_sum": (ratio * mask).sum(),
            # k3 estimator of KL(sampler || trainer) on the sampled tokens
            "mismatch_kl_sum": (torch.expm1(gap) - gap).sum(),
            "logprob_diff_max": gap.abs().max() if gap.numel() else gap.new_zeros(()),
        }
    return loss, stats


def loss_of(cfg: LossConfig, lp, sampler, adv, mask, norm, pos=None, ref=None, ent=None):
    return micro_batch_loss(cfg, policy_fn(cfg), lp, sampler, adv, mask, norm, pos, ref, ent)


def grad_of(loss, lp):
    (g,) = torch.autograd.grad(loss, lp)
    return g


# -- the default is today's loss, bit for bit ------------------------------------------------------
@pytest.mark.parametrize("layout", ["padded", "packed"])
def test_default_grpo_is_the_frozen_loss_bit_for_bit(layout):
    """Random logprobs with gaps wide enough that the ratio mask [0.125, 8] and both clips act."""
    g = torch.Generator().manual_seed(0)
    for trial in range(5):
        b, t = 4, 33
        lp = (-torch.rand(b, t, generator=g) * 4).requires_grad_()
        sampler = lp.detach() + torch.randn(b, t, generator=g) * (0.05 if trial % 2 else 1.5)
        mask = (torch.rand(b, t, generator=g) > 0.3).float()
        adv = torch.randn(b, generator=g) if layout == "padded" else torch.randn(b, t, generator=g)
        pos = torch.randint(0, 5, (b, t + 1), generator=g) if layout == "packed" else None
        n = int(mask.sum()) + 7
        want, want_stats = frozen_grpo_loss(lp, sampler, adv, mask, n, 0.2, 0.28, 0.125, 8.0)
        got, stats = loss_of(LossConfig(), lp, sampler, adv, mask, StepNorm(n), pos)
        assert torch.equal(got, want)
        assert torch.equal(grad_of(got, lp), grad_of(want, lp))
        assert want_stats["masked_tokens"] > 0 or trial % 2
        for k, v in want_stats.items():
            assert torch.equal(stats[k], v), k


@pytest.mark.parametrize("seq_len", [0, 48])
def test_default_train_step_updates_weights_as_before(tiny_model, seq_len):
    """train_step with the default [loss] == today's train step (the frozen loss through the same
    accumulate and optimizer step): same loss, same updated weights, bit for bit."""
    recs = random_records(12)
    n = sum(sum(r["loss_mask"]) for r in recs)
    micro = micro_batches(recs, 0, 3 if not seq_len else 2, seq_len)
    cfg = TrainerConfig(lr=1e-2)

    def frozen_fn(mb, logprobs, entropy):
        adv = mb["advantages"]
        return frozen_grpo_loss(
            logprobs,
            mb["old_logprobs"][:, 1:],
            adv[:, 1:] if adv.dim() == 2 else adv,
            mb["loss_mask"][:, 1:],
            n,
            0.2,
            0.28,
            0.125,
            8.0,
        )

    results = []
    for new in (False, True):
        torch.manual_seed(0)
        model = Policy(load_model(str(tiny_model), "float32", torch.device("cpu")))
        opt = make_optimizer(model, cfg)
        if new:
            loss = train_step(
                model, opt, copy.deepcopy(micro), PolicyLoss(LossConfig(), n), cfg.max_grad_norm
            )["loss"]
        else:
            opt.zero_grad(set_to_none=True)
            loss = accumulate(model, copy.deepcopy(micro), frozen_fn)["loss"]
            optimizer_step(model, opt, cfg.max_grad_norm)
        results.append((loss, [p.detach().clone() for p in model.parameters()]))
    (old_loss, old_p), (new_loss, new_p) = results
    assert old_loss == new_loss
    assert all(torch.equal(a, b) for a, b in zip(old_p, new_p, strict=True))


# -- each loss type by hand ----------------------------------------------------------------------
# One packed row of two sequences (positions restart at 0): targets a1 a2 a3 | p b1 b2, where p, the
# second prompt's first token, is no loss target. Advantages per token, as packed rows carry them.
POS = torch.tensor([[0, 1, 2, 3, 0, 1, 2]])
MASK = torch.tensor([[1.0, 1.0, 1.0, 0.0, 1.0, 1.0]])
OLD = [-1.0, -2.0, -0.5, -3.0, -1.5, -0.7]


def _row(log_ratios, advs):
    lp = torch.tensor([[o + r for o, r in zip(OLD, log_ratios, strict=True)]], dtype=torch.float64)
    adv = torch.tensor([[advs[0]] * 3 + [advs[1]] * 3], dtype=torch.float64)
    return lp.requires_grad_(), torch.tensor([OLD], dtype=torch.float64), adv


def test_gspo_sequence_ratio_and_clip_by_hand():
    """GSPO eq. 5-7: s_i = (prod_t pi/pi_old)^(1/|y_i|), J = 1/G sum_i min(s_i A_i, clip(s_i, 1-e_l,
    1+e_h) A_i) with e = (3e-4, 4e-4); here s_0 = e^1e-4 is inside, s_1 = e^0.02 clipped (A_1 > 0)."""
    lr0, lr1 = [1e-4, -2e-4, 4e-4], [0.01, 0.03]
    lp, old, adv = _row(lr0 + [0.0] + lr1, [1.0, 0.5])
    cfg = LossConfig(type="gspo")
    assert (cfg.clip_low, cfg.clip_high, cfg.aggregation) == (3e-4, 4e-4, "seq_mean_token_mean")
    loss, stats = loss_of(cfg, lp, old, adv, MASK, StepNorm(5, 2), POS)
    s0, s1 = math.exp(sum(lr0) / 3), math.exp(sum(lr1) / 2)
    term0 = -min(s0 * 1.0, min(max(s0, 1 - 3e-4), 1 + 4e-4) * 1.0)
    term1 = -min(s1 * 0.5, min(max(s1, 1 - 3e-4), 1 + 4e-4) * 0.5)
    assert loss.item() == pytest.approx((term0 + term1) / 2, abs=1e-12)
    # d(-s_0 A_0 / G) / d log pi_t = -A_0 s_0 / (|y_0| G) on sequence 0; sequence 1 is clipped
    want = [-s0 / 6] * 3 + [0.0, 0.0, 0.0]
    assert grad_of(loss, lp)[0].tolist() == pytest.approx(want, abs=1e-12)
    assert stats["clipped_tokens"] == 2.0
    # the same two sequences as two right-padded rows give the same loss
    lp2 = torch.zeros(2, 3, dtype=torch.float64)
    lp2[0], lp2[1, :2] = lp.detach()[0, :3], lp.detach()[0, 4:]
    old2 = torch.tensor([OLD[:3], OLD[4:] + [0.0]], dtype=torch.float64)
    padded, _ = loss_of(
        cfg, lp2, old2, torch.tensor([1.0, 0.5]), torch.tensor([[1.0] * 3, [1, 1, 0]]), StepNorm(5, 2)
    )
    assert padded.item() == pytest.approx(loss.item(), abs=1e-12)


def test_cispo_clipped_detached_is_weight_by_hand():
    """MiniMax-M1 eq. 4-5: J = 1/sum|o_i| sum_i sum_t sg(clip(r, 1-e_low, 1+e_high)) A log pi, with
    the defaults e_low = 1 (no lower bound), e_high = 0.28: weights 0.5, 1.28, 1.1, 0.9, 2 -> 1.28."""
    ratios = [0.5, 1.5, 1.1, 1.0, 0.9, 2.0]
    lp, old, adv = _row([math.log(r) for r in ratios], [1.0, -2.0])
    loss, stats = loss_of(LossConfig(type="cispo"), lp, old, adv, MASK, StepNorm(5))
    w = [min(r, 1.28) for r in ratios]
    a = [1.0] * 3 + [-2.0] * 3
    lps = lp.detach()[0].tolist()
    keep = [1, 1, 1, 0, 1, 1]
    assert loss.item() == pytest.approx(
        -sum(k * wi * ai * li for k, wi, ai, li in zip(keep, w, a, lps, strict=True)) / 5
    )
    assert grad_of(loss, lp)[0].tolist() == pytest.approx(
        [-k * wi * ai / 5 for k, wi, ai in zip(keep, w, a, strict=True)]
    )
    assert stats["clipped_tokens"] == 2.0  # 1.5 and 2.0 above 1.28


def test_dr_grpo_divides_by_the_constant_normaliser_by_hand():
    """Dr.GRPO sec. 3.2: the token sum of PPO-clip terms / (G x MAX_TOKENS), not / sum |o_i|."""
    ratios = [1.5, 1.1, 0.5, 1.0, 0.5, 1.5]
    lp, old, adv = _row([math.log(r) for r in ratios], [1.0, -2.0])
    loss, _ = loss_of(LossConfig(type="dr_grpo"), lp, old, adv, MASK, StepNorm(5, 2, 2 * 16))
    a = [1.0] * 3 + [-2.0] * 3
    terms = [-min(r * ai, min(max(r, 0.8), 1.28) * ai) for r, ai in zip(ratios, a, strict=True)]
    assert loss.item() == pytest.approx(
        sum(t for t, m in zip(terms, MASK[0].tolist(), strict=True) if m) / 32, abs=1e-12
    )


@pytest.mark.parametrize("how", ["token_mean", "seq_mean_token_sum", "seq_mean_token_mean"])
def test_aggregations_by_hand(how):
    """token_mean: sum l / sum|o_i| (DAPO eq. 8); seq_mean_token_sum: sum l / G; seq_mean_token_mean:
    1/G sum_i 1/|o_i| sum_t l_it (GRPO eq. 3)."""
    ratios = [1.1, 0.9, 1.0, 1.0, 1.2, 0.95]
    lp, old, adv = _row([math.log(r) for r in ratios], [1.0, -2.0])
    loss, _ = loss_of(LossConfig(aggregation=how), lp, old, adv, MASK, StepNorm(5, 2), POS)
    a = [1.0] * 3 + [-2.0] * 3
    l_ = [-min(r * ai, min(max(r, 0.8), 1.28) * ai) for r, ai in zip(ratios, a, strict=True)]
    want = {
        "token_mean": (sum(l_[:3]) + sum(l_[4:])) / 5,
        "seq_mean_token_sum": (sum(l_[:3]) + sum(l_[4:])) / 2,
        "seq_mean_token_mean": (sum(l_[:3]) / 3 + sum(l_[4:]) / 2) / 2,
    }[how]
    assert loss.item() == pytest.approx(want, abs=1e-12)


# -- IS correction for the sampler/trainer mismatch ------------------------------------------------
@pytest.mark.parametrize("kind", ["token_tis", "seq_tis", "token_mis", "seq_mis"])
def test_is_correction_weights_by_hand(kind):
    """w = pi_old / pi_sampler (pi_old: the trainer's, detached; the PPO ratio is then 1): TIS
    (Yao et al. 2025) min(w, C), C = is_high = 2; MIS keeps w in [is_low, is_high] = [0.5, 2] and
    drops the rest; seq_*: w of a sequence = prod over its tokens."""
    gaps = [0.1, 1.0, -0.9, 5.0, 0.2, 0.3]  # log(pi_trainer / pi_sampler) per token
    lp = torch.tensor([OLD], dtype=torch.float64, requires_grad=True)
    sampler = lp.detach() - torch.tensor([gaps], dtype=torch.float64)
    adv = torch.tensor([[1.0] * 3 + [-2.0] * 3], dtype=torch.float64)
    loss, stats = loss_of(LossConfig(is_correction=kind), lp, sampler, adv, MASK, StepNorm(5), POS)
    a, m = adv[0].tolist(), MASK[0].tolist()
    if kind.startswith("seq_"):
        w_seq = [math.exp(sum(gaps[:3])), math.exp(sum(gaps[4:]))]
        w = [w_seq[0]] * 3 + [0.0] + [w_seq[1]] * 2
    else:
        w = [math.exp(gi) for gi in gaps]
    w = [min(wi, 2.0) if kind.endswith("tis") else (wi if 0.5 <= wi <= 2.0 else 0.0) for wi in w]
    # per token -min(1 * A, clip(1) * A) * w = -A w; d/d log pi = -A w
    assert loss.item() == pytest.approx(
        sum(-ai * wi * mi for ai, wi, mi in zip(a, w, m, strict=True)) / 5, abs=1e-12
    )
    assert grad_of(loss, lp)[0].tolist() == pytest.approx(
        [-ai * wi * mi / 5 for ai, wi, mi in zip(a, w, m, strict=True)]
    )
    if kind == "token_mis":
        assert stats["is_masked_tokens"] == 2.0  # e^1.0 = 2.72 and e^-0.9 = 0.41


# -- KL to the reference, entropy bonus ----------------------------------------------------------
@pytest.mark.parametrize("est", ["k1", "k2", "k3"])
def test_kl_penalty_estimators_by_hand(est):
    """Schulman's estimators of KL(pi || pi_ref), log r = log pi_ref - log pi: k1 = -log r,
    k2 = (log r)^2 / 2, k3 = r - 1 - log r (DeepSeekMath eq. 4); beta x their token mean is added."""
    lp = torch.tensor([OLD], dtype=torch.float64, requires_grad=True)
    ref = torch.tensor([[-1.2, -1.5, -0.5, 0.0, -2.0, -0.6]], dtype=torch.float64)
    zero = torch.zeros(1, 6, dtype=torch.float64)
    loss, stats = loss_of(
        LossConfig(kl_coef=0.1, kl_estimator=est), lp, lp.detach(), zero, MASK, StepNorm(5), ref=ref
    )
    value, grad = {
        "k1": (lambda d: -d, lambda d: 1.0),
        "k2": (lambda d: d * d / 2, lambda d: -d),
        "k3": (lambda d: math.exp(d) - 1 - d, lambda d: 1 - math.exp(d)),
    }[est]
    d = [r - o for r, o in zip(ref[0].tolist(), OLD, strict=True)]
    m = MASK[0].tolist()
    assert loss.item() == pytest.approx(
        0.1 * sum(value(x) * mi for x, mi in zip(d, m, strict=True)) / 5, abs=1e-12
    )
    assert grad_of(loss, lp)[0].tolist() == pytest.approx(
        [0.1 * grad(x) * mi / 5 for x, mi in zip(d, m, strict=True)]
    )
    assert stats["kl_sum"].item() == pytest.approx(sum(value(x) * mi for x, mi in zip(d, m, strict=True)))


def test_entropy_bonus_and_its_gradient_on_both_lm_head_paths():
    """H = -sum_v p_v log p_v per token; the loss gets -coef x H (token mean). Full logits and the
    chunked LM head give the same entropy and the same gradient (dH/dz_j = -p_j (log p_j + H))."""
    torch.manual_seed(0)
    h = torch.randn(1, 6, 8, dtype=torch.float64, requires_grad=True)
    w = torch.randn(11, 8, dtype=torch.float64, requires_grad=True)
    tgt = torch.randint(0, 11, (1, 6))
    cfg = LossConfig(entropy_coef=0.01)
    probs = (h @ w.t() / 0.7).softmax(-1)[0].tolist()
    hand = [-sum(p * math.log(p) for p in row) for row in probs]
    grads = []
    for path in ("full", "chunked"):
        if path == "full":
            lp, ent = logprobs_and_entropy(h @ w.t(), tgt, 0.7)
        else:
            lp, ent = chunked_logprobs(h, w, tgt, chunk=4, temperature=0.7)
        assert ent[0].tolist() == pytest.approx(hand, abs=1e-5)  # both compute in float32
        adv = torch.tensor([0.5], dtype=torch.float64)
        loss, stats = loss_of(cfg, lp, lp.detach(), adv, MASK, StepNorm(5), ent=ent)
        policy = -0.5 * sum(mi for mi in MASK[0].tolist())  # ratio 1: -min(1 A, 1 A) per token
        want = (policy - 0.01 * sum(hi * mi for hi, mi in zip(hand, MASK[0].tolist(), strict=True))) / 5
        assert loss.item() == pytest.approx(want, abs=1e-6)
        grads.append(torch.autograd.grad(loss, (h, w)))
    for a, b in zip(*grads, strict=True):
        assert torch.allclose(a, b, atol=1e-5)


# -- micro-batches add up to the step --------------------------------------------------------------
@pytest.mark.parametrize("seq_len", [0, 40])
@pytest.mark.parametrize(
    "cfg",
    [
        {"aggregation": "token_mean"},
        {"aggregation": "seq_mean_token_sum"},
        {"aggregation": "seq_mean_token_mean"},
        {"aggregation": "constant"},
        {"type": "gspo", "clip_low": 0.1, "clip_high": 0.1},
        {"type": "cispo", "is_correction": "seq_tis", "kl_coef": 0.1},
    ],
    ids=lambda c: "-".join(str(v) for v in c.values()),
)
def test_two_micro_batches_give_one_batchs_gradient(cfg, seq_len):
    """Split a step in 2 micro-batches: the sum of their losses' gradients == the whole batch's."""
    recs = random_records(9, seed=3)
    cfg = LossConfig(**cfg)
    norm = StepNorm(sum(sum(r["loss_mask"]) for r in recs), len(recs), 123.0)
    theta = torch.randn(
        128, dtype=torch.float64, generator=torch.Generator().manual_seed(1), requires_grad=True
    )

    def loss(mb):  # a "policy": log pi(token) = -softplus(theta[token]), and a reference from it
        lp = -torch.nn.functional.softplus(theta[mb["input_ids"][:, 1:]])
        adv = mb["advantages"]
        return loss_of(
            cfg,
            lp,
            mb["old_logprobs"][:, 1:].double(),
            adv[:, 1:] if adv.dim() == 2 else adv,
            mb["loss_mask"][:, 1:],
            norm,
            mb.get("position_ids"),
            lp.detach() * 1.1,
        )[0]

    (whole,) = micro_batches(recs, 0, 64, seq_len)
    parts = micro_batches(recs, 0, 5 if not seq_len else 1, seq_len)
    assert len(parts) >= 2
    total = loss(whole)
    g_whole = torch.autograd.grad(total, theta)[0]
    summed = sum(loss(mb) for mb in parts)
    g_parts = torch.autograd.grad(summed, theta)[0]
    assert total.item() != 0.0 and g_whole.abs().sum() > 0
    assert summed.item() == pytest.approx(total.item(), abs=1e-9)
    assert torch.allclose(g_parts, g_whole, atol=1e-6, rtol=0)


# -- a user's loss -------------------------------------------------------------------------------
USER_LOSS = '''
def reinforce(x):
    """Plain REINFORCE: -A log pi per token (the framework masks and aggregates)."""
    return -x.advantages * x.logprobs
'''


def test_a_user_loss_file_is_resolved_at_load_and_trains(tmp_path, monkeypatch):
    """`type = "file.py:fn"`: resolved against the cwd, stored absolute, called with LossInputs;
    its per-token loss goes through the same masks and aggregation: -1/N sum A log pi."""
    from rlfleet.config.loader import load
    from rlfleet.config.models import RLConfig

    (tmp_path / "my_loss.py").write_text(USER_LOSS)
    monkeypatch.chdir(tmp_path)
    cfg = load(RLConfig, ["--model.path", "m", "--loss.type", "my_loss.py:reinforce"]).loss
    assert cfg.type == f"{tmp_path / 'my_loss.py'}:reinforce" and not cfg.builtin
    assert (cfg.clip_low, cfg.clip_high) == (0.2, 0.28)
    lp, old, adv = _row([0.0] * 6, [1.0, -2.0])
    loss, stats = loss_of(cfg, lp, old, adv, MASK, StepNorm(5))
    a, m, lps = adv[0].tolist(), MASK[0].tolist(), lp.detach()[0].tolist()
    assert loss.item() == pytest.approx(-sum(x * y * z for x, y, z in zip(a, m, lps, strict=True)) / 5)
    assert grad_of(loss, lp)[0].tolist() == pytest.approx([-x * y / 5 for x, y in zip(a, m, strict=True)])
    assert "clipped_tokens" not in stats
