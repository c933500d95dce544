"""Logprobs and entropy of the targets: from full logits (`token_logprobs`,
`logprobs_and_entropy`), or from the LM head without materializing [tokens, vocab] logits.

At a 152k vocabulary one 4096-token sequence has 2.5 GB of fp32 logits, more than the rest of a
1.5B model's activations. `chunked_logprobs` runs the head over `chunk` tokens at a time, keeps
only the log-sum-exp per token, and recomputes each chunk's logits in backward (one extra head
matmul) so peak memory is one chunk of logits whatever the sequence length. A soft-capped head
(Gemma-2's `final_logit_softcapping`: logits = cap * tanh(logits / cap), before the temperature, as
transformers and vLLM apply it) is capped here too.
"""

from __future__ import annotations

import torch


def token_logprobs(logits: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """log p(target) per position; logits [B, T, V], targets [B, T] -> [B, T] (float32)."""
    logits = logits.float()
    if temperature != 1.0:
        logits = logits / temperature
    return torch.gather(logits.log_softmax(-1), -1, targets.unsqueeze(-1)).squeeze(-1)


def logprobs_and_entropy(
    logits: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """(log p(target), entropy of the next-token distribution), both differentiable, [B, T]; for
    an entropy bonus on the full-logits path (the chunked LM head gives both without the logits)."""
    logits = logits.float()
    if temperature != 1.0:
        logits = logits / temperature
    logp = logits.log_softmax(-1)
    entropy = -(logp.exp() * logp).sum(-1)
    return torch.gather(logp, -1, targets.unsqueeze(-1)).squeeze(-1), entropy


def _logits(
    hidden: torch.Tensor, weight: torch.Tensor, inv_temp: float, softcap: float
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(logits / temperature, d capped / d raw logits or None when uncapped)."""
    raw = (hidden @ weight.t()).float()
    if not softcap:
        return raw * inv_temp, None
    t = torch.tanh(raw / softcap)
    return t * (softcap * inv_temp), 1.0 - t * t


def _chunk_forward(
    hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, inv_temp: float, softcap: float = 0.0
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    logits, _ = _logits(hidden, weight, inv_temp, softcap)
    lse = logits.logsumexp(-1)
    logprob = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - lse
    probs = (logits - lse.unsqueeze(-1)).exp()
    entropy = lse - (probs * logits).sum(-1)
    return logprob, entropy, lse


def _chunk_backward(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    lse: torch.Tensor,
    grad: torch.Tensor,
    inv_temp: float,
    softcap: float = 0.0,
    weight_grad: bool = True,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """d logprob / d logits = onehot(target) - softmax, scaled by the incoming grad; the head's own
    gradient only where it trains (`weight_grad`: a frozen head under LoRA skips a [vocab, hidden]
    matmul a chunk)."""
    logits, dcap = _logits(hidden, weight, inv_temp, softcap)
    g = (logits - lse.unsqueeze(-1)).exp().mul_(-grad.unsqueeze(-1))
    g.scatter_add_(-1, targets.unsqueeze(-1), grad.unsqueeze(-1))
    g = g * inv_temp if dcap is None else g * inv_temp * dcap
    g = g.to(hidden.dtype)
    return g @ weight, g.t() @ hidden if weight_grad else None


def _chunk_backward_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    lse: torch.Tensor,
    entropy: torch.Tensor,
    grad: torch.Tensor,
    grad_entropy: torch.Tensor,
    inv_temp: float,
    softcap: float = 0.0,
    weight_grad: bool = True,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """As `_chunk_backward`, plus an entropy bonus's gradient: d H / d logit_j = -p_j (log p_j + H)."""
    logits, dcap = _logits(hidden, weight, inv_temp, softcap)
    logp = logits - lse.unsqueeze(-1)
    g = logp.exp() * -(grad.unsqueeze(-1) + grad_entropy.unsqueeze(-1) * (logp + entropy.unsqueeze(-1)))
    g.scatter_add_(-1, targets.unsqueeze(-1), grad.unsqueeze(-1))
    g = g * inv_temp if dcap is None else g * inv_temp * dcap
    g = g.to(hidden.dtype)
    return g @ weight, g.t() @ hidden if weight_grad else None


# Swapped for torch.compile'd versions by `compile_lm_head` (fuses the [chunk, vocab] elementwise work).
_FWD, _BWD, _BWD_ENTROPY = _chunk_forward, _chunk_backward, _chunk_backward_entropy


def compile_lm_head() -> None:
    global _FWD, _BWD, _BWD_ENTROPY
    # dynamic: one graph for every chunk length, compiled in the trainer's warm-up. Automatic dynamic
    # compiled a static graph for the warm-up's length and recompiled at step 0's first chunk.
    _FWD = torch.compile(_chunk_forward, dynamic=True)
    _BWD = torch.compile(_chunk_backward, dynamic=True)
    _BWD_ENTROPY = torch.compile(_chunk_backward_entropy, dynamic=True)


def spans(n: int, chunk: int) -> list[tuple[int, int]]:
    """[start, end) of chunks of at most `chunk` rows; a 1-row tail joins the chunk before it (a
    dynamic graph assumes sizes of 2 or more and would recompile for it)."""
    out = [(s, min(s + chunk, n)) for s in range(0, n, chunk)]
    if len(out) > 1 and out[-1][1] - out[-1][0] == 1:
        out[-2:] = [(out[-2][0], n)]
    return out


class _ChunkedLogprob(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, targets, chunk: int, inv_temp: float, softcap: float):  # type: ignore[override]
        n = hidden.shape[0]
        logprob = hidden.new_empty(n, dtype=torch.float32)
        entropy = torch.empty_like(logprob)
        lse = torch.empty_like(logprob)
        for s, e in spans(n, chunk):
            logprob[s:e], entropy[s:e], lse[s:e] = _FWD(hidden[s:e], weight, targets[s:e], inv_temp, softcap)
        ctx.save_for_backward(hidden, weight, targets, lse, entropy)
        ctx.chunk, ctx.inv_temp, ctx.softcap = chunk, inv_temp, softcap
        ctx.set_materialize_grads(False)  # an entropy nothing uses gets None: the cheaper backward
        return logprob, entropy

    @staticmethod
    def backward(ctx, grad_logprob, grad_entropy):  # type: ignore[override]
        hidden, weight, targets, lse, entropy = ctx.saved_tensors
        grad_hidden = torch.empty_like(hidden)
        trains = ctx.needs_input_grad[1]  # a frozen head (LoRA): no [vocab, hidden] gradient at all
        grad_weight = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if trains else None
        # fresh 1-D tensors: autograd hands in views of [n] or [1, n] tensors, and a view's base is
        # part of what a compiled graph guards on (step 0 recompiled for it)
        grad_logprob = (
            torch.zeros_like(lse) if grad_logprob is None else grad_logprob.float().reshape(-1).clone()
        )
        if grad_entropy is not None:
            grad_entropy = grad_entropy.float().reshape(-1).clone()
        for s, e in spans(hidden.shape[0], ctx.chunk):
            if grad_entropy is None:
                gh, gw = _BWD(
                    hidden[s:e],
                    weight,
                    targets[s:e],
                    lse[s:e],
                    grad_logprob[s:e],
                    ctx.inv_temp,
                    ctx.softcap,
                    trains,
                )
            else:
                gh, gw = _BWD_ENTROPY(
                    hidden[s:e],
                    weight,
                    targets[s:e],
                    lse[s:e],
                    entropy[s:e],
                    grad_logprob[s:e],
                    grad_entropy[s:e],
                    ctx.inv_temp,
                    ctx.softcap,
                    trains,
                )
            grad_hidden[s:e] = gh
            if grad_weight is not None:
                grad_weight += gw
        return (
            grad_hidden,
            None if grad_weight is None else grad_weight.to(weight.dtype),
            None,
            None,
            None,
            None,
        )


def chunked_logprobs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    chunk: int,
    temperature: float = 1.0,
    softcap: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(logprob of target, entropy), both float32 and shaped like `targets`.

    hidden [..., H] (the final-norm output), weight [V, H] (the LM head), targets [...] token ids,
    softcap the head's final logit soft-capping (0: none).
    Both are differentiable: the entropy's gradient (an entropy bonus) costs nothing when unused.
    """
    shape = targets.shape
    h = hidden.reshape(-1, hidden.shape[-1])
    if not h.is_contiguous():
        h = h.contiguous()
    lp, ent = _ChunkedLogprob.apply(
        h, weight, targets.reshape(-1), chunk, 1.0 / temperature, float(softcap or 0.0)
    )
    return lp.view(shape), ent.view(shape)
