"""SFT data: local JSONL/parquet rows -> token ids with a loss mask, batched in a seed-fixed order.

Two row formats. Chat: `{"messages": [{"role", "content"}, ...], "tools": [...]?}`, rendered with
the tokenizer's chat template (with the row's tool schemas, as an RL rollout with those tools
renders them); only the assistant turns (with the template's end-of-turn text) carry loss.
Prompt/completion: `{"prompt", "completion"}`, encoded as BOS + prompt + completion + EOS like the
RL rollouts' raw prompts; only completion and EOS carry loss.

The order is a function of (seed, step): step N takes global positions [N*B, (N+1)*B), position g
is row perm_e[g % rows] of epoch e = g // rows. So the data cursor is the step, and a run resumed
from a checkpoint sees exactly the batches it would have seen.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedTokenizerBase

from rlfleet.chat import render
from rlfleet.config.models import SFTDataConfig
from rlfleet.microbatches import first_fit, pack_rows

SUFFIXES = (".jsonl", ".parquet")


class DataError(ValueError):
    """The dataset cannot be used as configured; deterministic, so never retried."""


@dataclass(frozen=True)
class SFTDataset:
    rows: list[dict[str, Any]]
    format: str  # "chat" | "prompt_completion"

    def __len__(self) -> int:
        return len(self.rows)


@dataclass(frozen=True)
class Example:
    input_ids: list[int]
    loss_mask: list[int]  # 1 where the token is a training target


# -- reading and validating --------------------------------------------------------------------
def read_rows(path: str | Path) -> list[dict[str, Any]]:
    p = Path(path)
    if not p.is_file():
        raise DataError(f"data.path: {p} is not a file")
    if p.suffix not in SUFFIXES:
        raise DataError(f"data.path: {p} must end in .jsonl or .parquet")
    if p.suffix == ".parquet":
        try:
            import pyarrow.parquet as pq
        except ImportError:
            raise DataError("data.path: reading .parquet needs pyarrow (`pip install pyarrow`)") from None
        try:
            return pq.read_table(p).to_pylist()
        except Exception as e:
            raise DataError(f"data.path: {p} is not a readable parquet file: {e}") from None
    rows = []
    with p.open(encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise DataError(f"data.path: {p}:{n}: invalid JSON: {e}") from None
            if not isinstance(row, dict):
                raise DataError(f"data.path: {p}:{n}: a row must be a JSON object")
            rows.append(row)
    return rows


def detect_format(row: dict[str, Any]) -> str:
    if "messages" in row:
        return "chat"
    if "prompt" in row and "completion" in row:
        return "prompt_completion"
    raise DataError(
        f"data.format: cannot detect from the first row's keys {sorted(row)}: "
        "expected 'messages' (chat) or 'prompt' and 'completion'"
    )


def row_problem(row: dict[str, Any], fmt: str) -> str | None:
    if fmt == "prompt_completion":
        bad = [k for k in ("prompt", "completion") if not isinstance(row.get(k), str)]
        return f"needs string {' and '.join(repr(k) for k in bad)}" if bad else None
    messages = row.get("messages")
    if not isinstance(messages, list) or not messages:
        return "needs a non-empty 'messages' list"
    tools = row.get("tools")
    if tools is not None and not (isinstance(tools, list) and all(isinstance(t, dict) for t in tools)):
        return "has 'tools' that are not a list of function schemas"
    for m in messages:
        if (
            not isinstance(m, dict)
            or not isinstance(m.get("role"), str)
            or not isinstance(m.get("content"), str)
        ):
            return "every message needs string 'role' and 'content'"
    if not any(m["role"] == "assistant" for m in messages):
        return "has no assistant message (nothing to train on)"
    return None


def load_dataset(cfg: SFTDataConfig) -> SFTDataset:
    """Read and validate every row, so a bad row fails before training starts, naming the row."""
    rows = read_rows(cfg.path)
    if not rows:
        raise DataError(f"data.path: {cfg.path} has no rows")
    fmt = detect_format(rows[0]) if cfg.format == "auto" else cfg.format
    for i, row in enumerate(rows):
        if (problem := row_problem(row, fmt)) is not None:
            raise DataError(f"data.format: row {i} of {cfg.path} is not {fmt}: it {problem}")
    return SFTDataset(rows, fmt)


def check_data(cfg: SFTDataConfig) -> list[str]:
    """Preflight: the problems with the dataset, as lines naming the field."""
    try:
        load_dataset(cfg)
    except DataError as e:
        return [str(e)]
    return []


# -- tokenizing --------------------------------------------------------------------------------
def encode_chat(
    tok: PreTrainedTokenizerBase, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None
) -> Example:
    """Render the whole conversation once; mask the characters each assistant turn adds.

    An assistant turn i spans from the end of render(messages[:i], generation prompt) to the end
    of render(messages[:i+1]). Tokens are mapped to those character spans by their offsets, so the
    ids are exactly what the template gives at inference.
    """
    if not tok.is_fast:
        raise DataError("data.format: chat masking needs a fast tokenizer (character offsets)")
    full = render(tok, messages, tools, generation=False)
    spans = []
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        before = render(tok, messages[:i], tools, generation=True) if i else ""
        upto = render(tok, messages[: i + 1], tools, generation=False)
        if not (full.startswith(upto) and upto.startswith(before)):
            raise DataError(
                "data.format: the chat template renders earlier turns differently once later ones "
                "follow, so assistant tokens cannot be located"
            )
        spans.append((len(before), len(upto)))
    enc = tok(full, add_special_tokens=False, return_offsets_mapping=True)
    mask = [int(any(a <= s < b for a, b in spans)) for s, _ in enc["offset_mapping"]]
    return Example(list(enc["input_ids"]), mask)


def encode_prompt_completion(tok: PreTrainedTokenizerBase, prompt: str, completion: str) -> Example:
    head = [tok.bos_token_id] if tok.bos_token_id is not None else []
    head += tok(prompt, add_special_tokens=False)["input_ids"]
    tail = tok(completion, add_special_tokens=False)["input_ids"]
    if tok.eos_token_id is not None:
        tail = [*tail, tok.eos_token_id]
    return Example(head + tail, [0] * len(head) + [1] * len(tail))


def encode(tok: PreTrainedTokenizerBase, row: dict[str, Any], fmt: str, max_seq_len: int) -> Example:
    if fmt == "chat":
        ex = encode_chat(tok, row["messages"], row.get("tools"))
    else:
        ex = encode_prompt_completion(tok, row["prompt"], row["completion"])
    return Example(ex.input_ids[:max_seq_len], ex.loss_mask[:max_seq_len])


# -- order and batches -------------------------------------------------------------------------
@lru_cache(maxsize=4)
def _permutation(n: int, seed: int, epoch: int, shuffle: bool) -> tuple[int, ...]:
    order = list(range(n))
    if shuffle:
        random.Random(f"{seed}/sft/{epoch}").shuffle(order)
    return tuple(order)


def step_rows(n: int, step: int, batch_size: int, seed: int, shuffle: bool) -> list[int]:
    """Row indices of step `step`: a pure function of its arguments (the cursor is the step)."""
    out = []
    for g in range(step * batch_size, (step + 1) * batch_size):
        epoch, pos = divmod(g, n)
        out.append(_permutation(n, seed, epoch, shuffle)[pos])
    return out


def collate(examples: list[Example], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-padded tensors; padding is never a target, and causal attention never looks right."""
    width = max(len(e.input_ids) for e in examples)
    ids = torch.full((len(examples), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(examples), width), dtype=torch.long)
    for i, e in enumerate(examples):
        ids[i, : len(e.input_ids)] = torch.tensor(e.input_ids)
        mask[i, : len(e.loss_mask)] = torch.tensor(e.loss_mask)
    real = torch.tensor([len(e.input_ids) for e in examples], dtype=torch.long)
    return {"input_ids": ids, "loss_mask": mask, "real_tokens": real}


def micro_batches(examples: list[Example], size: int, pad_id: int) -> list[dict[str, torch.Tensor]]:
    return [collate(examples[i : i + size], pad_id) for i in range(0, len(examples), size)]


def packed_micro_batches(
    examples: list[Example], rows_per_micro: int, width: int, pad_id: int
) -> list[dict[str, torch.Tensor]]:
    """Examples packed into rows of `width` tokens (rlfleet/microbatches.py); a sample's first token is
    never a target, so the shift at a boundary takes no loss across samples."""
    seqs = [{"input_ids": e.input_ids, "loss_mask": [0, *e.loss_mask[1:]]} for e in examples]
    rows = first_fit([len(e.input_ids) for e in examples], width)
    pad, dtypes = {"input_ids": pad_id, "loss_mask": 0}, {"input_ids": torch.long, "loss_mask": torch.long}
    return [
        pack_rows(seqs, rows[i : i + rows_per_micro], width, pad, dtypes)
        for i in range(0, len(rows), rows_per_micro)
    ]


def step_batches(
    ds: SFTDataset, tok: PreTrainedTokenizerBase, cfg: SFTDataConfig, step: int, seed: int
) -> list[dict[str, torch.Tensor]]:
    idx = step_rows(len(ds), step, cfg.batch_size, seed, cfg.shuffle)
    examples = [encode(tok, ds.rows[i], ds.format, cfg.max_seq_len) for i in idx]
    if cfg.pack:
        return packed_micro_batches(examples, cfg.micro_batch_size, cfg.max_seq_len, pad_id(tok))
    return micro_batches(examples, cfg.micro_batch_size, pad_id(tok))


def pad_id(tok: PreTrainedTokenizerBase) -> int:
    for candidate in (tok.pad_token_id, tok.eos_token_id):
        if candidate is not None:
            return candidate
    return 0
