"""How many tokens a GPU trainer's micro-batch may hold: the arithmetic, kept free of torch (config:
placement refuses what cannot fit before anything starts; the trainer sizes itself with the same).

A GPU trainer's micro-batch holds at most the tokens of `rows` packed rows of the batch's width
(rlfleet/microbatches.py), as many as fit and at most `trainer.micro_batch_tokens` (a cap, never a
reason to refuse); the trainer measures at its first batch (budget.py `TokenBudget`)
what one row of the batch's width costs and how much memory it finds free beside vLLM, and
`size_micro_batch` turns that into rows. Before anything starts, the memory plan (config/memory.py)
chooses the checkpointing the probe starts from, and refuses a row no choice can fit.

Why the trainer repacks the samples it loads instead of the orchestrator packing to its size: the
trainer is the one process that can measure its memory, and it does so once vLLM is serving (an
early-started trainer comes up beside a vLLM still allocating, so free memory at its start-up says
nothing). The orchestrator's files stay a transport of packed rows; no sizing travels through the
run store, so a relaunched trainer, or one on another node, sizes itself the same way.
"""

from __future__ import annotations

from dataclasses import dataclass

GIB = 1 << 30
# Kept spare of the free memory the probe finds: the allocator's fragmentation across micro-batch
# shapes, the loss's own tensors (the probe's is a zero), a KL reference's forward, NCCL buffers.
MARGIN = 0.10
HEADROOM = 512 << 20


@dataclass(frozen=True)
class Sizing:
    """A micro-batch's rows and the numbers behind them (the trainer logs `line()`)."""

    rows: int  # packed rows' worth of tokens per micro-batch: the most that fit, at most the request
    row_tokens: int  # the rows' width (orchestrator.seq_len)
    fit_rows: int  # the most rows that fit `usable_bytes` (0: not even one)
    free_bytes: int  # what the trainer's allocator could still get, its step's state held
    later_bytes: int  # taken only after the sizing: the weight transport's buffers, a process beside it
    usable_bytes: int  # free less later, the margin and the headroom
    row_bytes: int  # peak bytes one row's forward and backward adds (0: not measured)
    fixed_bytes: int = 0  # the part of row_bytes a micro-batch pays once, however many rows
    asked_rows: int | None = None  # the request (trainer.micro_batch_tokens) in rows; None: unset

    @property
    def tokens(self) -> int:
        return self.rows * self.row_tokens

    @property
    def fits(self) -> bool:
        return 1 <= self.rows <= self.fit_rows

    @property
    def token_bytes(self) -> float:
        return (self.row_bytes - self.fixed_bytes) / self.row_tokens

    def line(self) -> str:
        cap = "" if self.asked_rows is None else f", at most the {self.asked_rows} asked"
        return (
            f"{self.rows} rows of {self.row_tokens} tokens = {self.tokens} tokens a micro-batch{cap} "
            f"(free {self.free_bytes / GIB:.1f} GiB, {self.later_bytes / GIB:.1f} GiB kept for "
            f"the weight transport and any process beside it, usable {self.usable_bytes / GIB:.1f} GiB; "
            f"{self.token_bytes / (1 << 20):.3f} MiB a token, {self.row_bytes / GIB:.2f} GiB a row of "
            f"which {self.fixed_bytes / GIB:.2f} once a micro-batch: {self.fit_rows} rows fit)"
        )


def requested_rows(tokens: int, row_tokens: int) -> int:
    """Whole rows of `row_tokens` in a budget of `tokens`: never less than one (a packed row is the
    smallest micro-batch there is; placement refuses a budget below one row)."""
    return max(1, tokens // row_tokens)


def size_micro_batch(
    free_bytes: int,
    row_bytes: int,
    row_tokens: int,
    later_bytes: int = 0,
    requested_tokens: int | None = None,
    fixed_bytes: int = 0,
    margin: float = MARGIN,
    headroom: int = HEADROOM,
) -> Sizing:
    """Rows per micro-batch from what a probe measured.

    free_bytes: device free memory plus the allocator's cached, unallocated bytes, measured with the
    model, optimizer state and gradients resident (the state inside a step). row_bytes: the peak one
    forward and backward of one row of `row_tokens` added to that, of which fixed_bytes (gathered
    parameters, workspaces) a micro-batch pays once: k rows cost fixed + k x (row - fixed). It is
    clamped to half a row, and the LM head's chunk counts per row, both on the safe side.
    later_bytes (the weight transport's GPU buffers, made at the first publish) and a margin come
    off first. A request (trainer.micro_batch_tokens) is a cap: the micro-batch is as many rows as
    fit, at most that many, and `fits` unless not even one row does."""
    usable = max(0, int((free_bytes - later_bytes) * (1.0 - margin)) - headroom)
    fixed = max(0, min(fixed_bytes, row_bytes // 2))
    per_row = row_bytes - fixed
    fit = max(0, (usable - fixed) // per_row) if per_row > 0 else 0
    asked = None if requested_tokens is None else requested_rows(requested_tokens, row_tokens)
    rows = fit if asked is None else min(asked, fit)
    return Sizing(rows, row_tokens, fit, free_bytes, later_bytes, usable, row_bytes, fixed, asked)


def row_groups(total_rows: int, max_rows: int, ranks: int = 1) -> list[int]:
    """How many rows each micro-batch of a step gets: at most `max_rows`, as even as can be, and a
    count of micro-batches that divides over the ranks (each rank runs as many; one short of rows
    repeats a zeroed one, trainer/train.py `shard_micro_batches`). 10 rows by 4: [4, 3, 3]."""
    if total_rows <= 0:
        return []
    count = -(-total_rows // max(1, max_rows))
    count = min(total_rows, -(-count // ranks) * ranks)
    base, extra = divmod(total_rows, count)
    return [base + 1] * extra + [base] * (count - extra)


@dataclass(frozen=True)
class ModelShape:
    """What placement can read of a model without loading it (config.json, safetensors headers)."""

    params: int  # 0 when unknown: the bound below still holds
    layers: int
    hidden: int
    heads: int = 0  # num_attention_heads (0: unknown); tensor parallelism must divide it
    kv_heads: int = 0  # num_key_value_heads (0: as many as heads)
    head_dim: int = 0  # 0: hidden / heads
    intermediate: int = 0  # the MLP width a token runs through (MoE: experts per token x theirs); 0: unknown
    vocab: int = 0

    @property
    def ffn(self) -> int:
        """The MLP width a token runs through; 4 x hidden where the config does not say."""
        return self.intermediate or 4 * self.hidden
