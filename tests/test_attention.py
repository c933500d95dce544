"""The trainer's varlen attention (what runs on a CPU) and the step's MFU arithmetic."""

from __future__ import annotations

import types

import pytest
import torch
import torch.nn.functional as F

from rlfleet.trainer.attention import kwargs, packing, varlen_attention
from rlfleet.trainer.flops import Work, matmul_params, model_flops


def test_samples_start_at_position_zero_and_at_every_row():
    pos = torch.tensor([[0, 1, 2, 0, 1, 0], [3, 4, 0, 1, 2, 3]])  # row 2 starts mid-sample: a bound anyway
    p = packing(pos)
    assert p.cu_seqlens.tolist() == [0, 3, 5, 6, 8, 12] and p.cu_seqlens.dtype == torch.int32
    assert (p.lengths, p.max_seqlen) == ([3, 2, 1, 2, 4], 4)


def _dense(q, k, v, bounds, window=None):
    """Reference: one causal attention over the whole flattened row with a block-diagonal mask."""
    t = q.shape[2]
    sample = torch.zeros(t, dtype=torch.long)
    for a in bounds[1:-1]:
        sample[a:] += 1
    i = torch.arange(t)
    mask = (sample[:, None] == sample[None, :]) & (i[:, None] >= i[None, :])
    if window:
        mask &= i[:, None] - i[None, :] < window
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True).transpose(1, 2)


@pytest.mark.parametrize("window", [None, 3])
def test_packed_attention_equals_a_block_diagonal_mask_with_grouped_kv_heads(window):
    torch.manual_seed(0)
    pos = torch.tensor([[0, 1, 2, 3, 4, 0, 1, 2, 0, 1, 2, 3, 4, 5, 0, 1]])
    q, k, v = torch.randn(1, 4, 16, 8), torch.randn(1, 2, 16, 8), torch.randn(1, 2, 16, 8)
    module = types.SimpleNamespace(num_key_value_groups=2, is_causal=True)
    got, _ = varlen_attention(module, q, k, v, None, sliding_window=window, **kwargs(packing(pos), q.device))
    bounds = packing(pos).cu_seqlens.tolist()
    torch.testing.assert_close(got, _dense(q, k, v, bounds, window), rtol=1e-5, atol=1e-5)
    # a caller that does not say reads the bounds off its position ids; a plain ramp is one sample
    read, _ = varlen_attention(module, q, k, v, None, sliding_window=window, position_ids=pos)
    torch.testing.assert_close(read, got)
    ramp, _ = varlen_attention(
        module, q, k, v, None, sliding_window=window, position_ids=torch.arange(16)[None]
    )
    torch.testing.assert_close(ramp, _dense(q, k, v, [0, 16], window), rtol=1e-5, atol=1e-5)
    assert not torch.allclose(ramp, got, atol=1e-3)
    # unpacked rows say so (Policy passes None): causal sdpa, or the sliding window where there is one
    alone, _ = varlen_attention(module, q, k, v, None, sliding_window=window, **kwargs(None, q.device))
    torch.testing.assert_close(alone, ramp)


def test_work_counts_real_tokens_and_each_real_samples_square():
    """Two rows of 6: samples of 4 and 2, then one of 3 and 3 positions of padding (its own segment)."""
    mb = {
        "input_ids": torch.zeros(2, 6, dtype=torch.long),
        "position_ids": torch.tensor([[0, 1, 2, 3, 0, 1], [0, 1, 2, 0, 1, 2]]),
        "real_tokens": torch.tensor([6, 3]),
    }
    work = Work()
    work.add(mb)
    assert (work.computed, work.tokens, work.square_lengths) == (12, 9, 16 + 4 + 9)
    config = types.SimpleNamespace(
        hidden_size=8, num_attention_heads=2, num_key_value_heads=1, num_hidden_layers=3,
        intermediate_size=16, vocab_size=10,
    )  # fmt: skip
    per_layer = 2 * 8 * 2 * 4 + 2 * 8 * 1 * 4 + 3 * 8 * 16
    assert matmul_params(config) == 3 * per_layer + 10 * 8
    assert model_flops(config, 9, 29) == 6 * matmul_params(config) * 9 + 6 * 3 * 2 * 4 * 29
    metrics = work.metrics(1.0, config, torch.device("cpu"), world=1)
    assert metrics == {"train_tokens_per_s": 9.0, "padding_frac": 0.25}  # no GPU peak: no mfu


def test_flash_attention_4_is_chosen_only_where_it_runs():
    """Off a Hopper / Blackwell GPU with the pinned flash-attn-4 (this CPU box), packed rows keep
    torch's kernels, and the log says why."""
    from rlfleet.trainer import attention

    assert attention.choose_kernel(torch.device("cpu")).startswith("sdpa once per sample")
    said = attention.choose_kernel(torch.device("cuda"))
    assert not attention.FA4 and said.startswith("torch's FlashAttention-2: ") and len(said) > 30


@pytest.mark.parametrize("window", [None, 4096])
def test_flash_attention_4_traces_whole_and_gives_each_input_its_gradient(window):
    """The FA4 op's shapes (its fake) and autograd formula, under torch.compile with no graph break,
    on meta tensors: its kernels need a Hopper GPU (benchmarks/attention_kernels.py checks the
    numbers there against float32 sdpa)."""
    from rlfleet.trainer.attention import _fa4

    compiled = torch.compile(_fa4, backend="aot_eager", fullgraph=True, dynamic=True)
    for total in (100, 257):  # a new length: the same graph
        q = torch.empty(total, 14, 64, device="meta", dtype=torch.bfloat16, requires_grad=True)
        k, v = (
            torch.empty(total, 2, 64, device="meta", dtype=torch.bfloat16, requires_grad=True) for _ in "kv"
        )
        out = compiled(q, k, v, torch.empty(4, device="meta", dtype=torch.int32), total // 2, None, window)
        assert out.shape == q.shape and out.dtype == torch.bfloat16
        out.sum().backward()
        assert [x.grad.shape for x in (q, k, v)] == [q.shape, k.shape, v.shape]
