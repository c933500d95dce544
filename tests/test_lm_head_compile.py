"""The compiled chunked LM head: one graph, compiled on the trainer's warm-up row, serves every
micro-batch length the loop brings (step 0 recompiled three times before: the warm-up's static
length, a gradient view's base, a 1-row tail chunk)."""

from __future__ import annotations

import pytest
import torch

from rlfleet.trainer import lm_head
from rlfleet.trainer.lm_head import chunked_logprobs, spans


def test_a_one_row_tail_joins_the_chunk_before_it():
    assert spans(33, 16) == [(0, 16), (16, 33)]
    assert spans(32, 16) == [(0, 16), (16, 32)]
    assert spans(34, 16) == [(0, 16), (16, 32), (32, 34)]
    assert spans(1, 16) == [(0, 1)]
    assert spans(10, 16) == [(0, 10)]


def _step(n: int, flat_grad: bool) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(n)
    h = torch.randn(n, 8, generator=g, requires_grad=True)
    w = torch.randn(24, 8, generator=g, requires_grad=True)
    tgt = torch.randint(0, 24, (n,), generator=g)
    # the loop's shapes: [1, T] rows (a gradient that is a view of a 2-D tensor) or flat ones
    lp, ent = chunked_logprobs(
        h if flat_grad else h.view(1, n, 8), w, tgt if flat_grad else tgt.view(1, n), 16
    )
    (lp.square().sum() + 0.1 * ent.sum()).backward()
    return lp.detach().reshape(-1), h.grad, w.grad


@pytest.mark.usefixtures("_eager_lm_head_after")
def test_the_compiled_head_compiles_once_and_matches_eager():
    eager = {(n, flat): _step(n, flat) for n in (96, 33, 50, 17, 40) for flat in (True, False)}
    lm_head.compile_lm_head()
    torch._dynamo.reset()
    _step(96, False)  # the warm-up row's length (trainer.train.warm_up: 97 tokens, 96 targets)
    with torch._dynamo.config.patch(error_on_recompile=True):
        for (n, flat), want in eager.items():
            got = _step(n, flat)
            for a, b in zip(got, want, strict=True):
                torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


@pytest.mark.usefixtures("_eager_lm_head_after")
def test_after_the_trainer_warm_up_longer_and_shorter_micro_batches_reuse_the_compiled_head(tiny_model):
    """The warm-up row is shorter than a GPU's LM-head chunk; run in one chunk, it compiled a head
    that recompiled at step 0 for every micro-batch longer than a chunk (09:23, one H100)."""
    from rlfleet.trainer.train import Policy, load_model, warm_up

    policy = Policy(load_model(str(tiny_model), "float32", torch.device("cpu")), lm_head_chunk=128)
    lm_head.compile_lm_head()
    torch._dynamo.reset()
    warm_up(policy, None)
    vocab = policy.lm.config.vocab_size
    with torch._dynamo.config.patch(error_on_recompile=True):
        for n in (300, 200, 129, 60):  # chunks: three, two, one (a 1-row tail joins the one before), one
            ids = torch.randint(0, vocab, (1, n), generator=torch.Generator().manual_seed(n))
            pos = torch.cat([torch.arange(n // 3), torch.arange(n - n // 3)]).unsqueeze(0)
            logprobs, _ = policy(ids, 1.0, pos)
            logprobs.sum().backward()
    assert policy.lm_head_chunk == 128  # the warm-up's chunk was its own


@pytest.fixture
def _eager_lm_head_after():
    saved = lm_head._FWD, lm_head._BWD, lm_head._BWD_ENTROPY
    yield
    lm_head._FWD, lm_head._BWD, lm_head._BWD_ENTROPY = saved
    torch._dynamo.reset()


@pytest.mark.usefixtures("_eager_lm_head_after")
@pytest.mark.parametrize("compiled", [False, True])
def test_a_frozen_head_gets_no_gradient_and_the_hidden_states_the_same_one(compiled, monkeypatch):
    """LoRA freezes the LM head: its backward skips the [vocab, hidden] gradient (a matmul as large as
    the head's forward, and a float32 buffer of the head's size) and leaves `grad` None; the hidden
    states' gradient is the one a trained head gives them (with and without an entropy term)."""
    if compiled:
        lm_head.compile_lm_head()
        torch._dynamo.reset()
    g = torch.Generator().manual_seed(0)
    h0, w0 = torch.randn(40, 8, generator=g), torch.randn(24, 8, generator=g)
    tgt = torch.randint(0, 24, (40,), generator=g)
    weight_grads: list[torch.Tensor | None] = []

    def spy(fn):
        def chunk(*args):
            gh, gw = fn(*args)
            weight_grads.append(gw)
            return gh, gw

        return chunk

    monkeypatch.setattr(lm_head, "_BWD", spy(lm_head._BWD))
    monkeypatch.setattr(lm_head, "_BWD_ENTROPY", spy(lm_head._BWD_ENTROPY))
    for entropy in (0.0, 0.1):
        grads = []
        for trains in (True, False):
            weight_grads.clear()
            h, w = h0.clone().requires_grad_(), w0.clone().requires_grad_(trains)
            lp, ent = chunked_logprobs(h, w, tgt, 16)
            (lp.square().sum() + entropy * ent.sum()).backward()
            assert len(weight_grads) == 3  # chunks of 16, 16 and 8 rows
            assert all((gw is not None) == trains for gw in weight_grads)
            assert (w.grad is not None) == trains
            grads.append(h.grad)
        torch.testing.assert_close(grads[0], grads[1], atol=1e-6, rtol=1e-6)
