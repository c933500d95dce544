"""Read an offline wandb run's `run-*.wandb` file: history keys and config, as wandb would sync them.

The file is a LevelDB-style log (a 7-byte `:W&B` header, then 32 KiB blocks of records with a
7-byte header: crc32, length, type) of `wandb_internal_pb2.Record` protobufs; wandb 0.31 has no
Python reader of its own (its core is in Go).
"""

from __future__ import annotations

import json
from pathlib import Path

from wandb.proto import wandb_internal_pb2

BLOCK, HEADER = 32768, 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def records(path: Path) -> list[wandb_internal_pb2.Record]:
    data = path.read_bytes()
    assert data[:4] == b":W&B", f"{path} is not a wandb log"
    out, pending, off = [], b"", HEADER
    while off + HEADER <= len(data):
        if BLOCK - off % BLOCK < HEADER:  # block trailer: padding
            off += BLOCK - off % BLOCK
            continue
        length, kind = int.from_bytes(data[off + 4 : off + 6], "little"), data[off + 6]
        chunk, off = data[off + HEADER : off + HEADER + length], off + HEADER + length
        if kind in (FULL, FIRST):
            pending = chunk
        elif kind in (MIDDLE, LAST):
            pending += chunk
        else:
            off += BLOCK - off % BLOCK if off % BLOCK else 0
            continue
        if kind in (FULL, LAST):
            rec = wandb_internal_pb2.Record()
            rec.ParseFromString(pending)
            out.append(rec)
    return out


def history_and_config(run_dir: Path) -> tuple[list[dict[str, float]], dict[str, object]]:
    """Every history row (key -> value) and the final config of an offline run directory."""
    (log,) = run_dir.glob("run-*.wandb")
    rows, config = [], {}
    for rec in records(log):
        kind = rec.WhichOneof("record_type")
        if kind == "history":
            rows.append({i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in rec.history.item})
        elif kind in ("run", "config"):  # the config comes with the run record, updates later
            items = rec.run.config.update if kind == "run" else rec.config.update
            config |= {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in items}
    return rows, config
