"""Datasets for environments, loaded with the `datasets` library (which honours its offline cache).

A source is a local `.jsonl`/`.json`/`.parquet`/`.csv` file, a directory written by
`Dataset.save_to_disk`, or a hub dataset id. Rows are read by index, in a per-epoch permutation
that is a function of the seed, so step N always sees the same rows, also after a resume.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

FILE_BUILDERS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}


def load_rows(source: str, split: str) -> Any:
    """A `datasets.Dataset` (imported here: the library costs a second to import)."""
    import datasets

    datasets.disable_progress_bars()
    p = Path(source)
    if p.is_file():
        builder = FILE_BUILDERS.get(p.suffix)
        if builder is None:
            raise ValueError(f"{source}: unknown file type {p.suffix!r}; use one of {sorted(FILE_BUILDERS)}")
        return datasets.load_dataset(builder, data_files=str(p), split="train")
    if p.is_dir():
        ds = datasets.load_from_disk(str(p))
        if isinstance(ds, datasets.DatasetDict):
            if split not in ds:
                raise ValueError(f"{source}: no split {split!r}; it has {sorted(ds)}")
            ds = ds[split]
        return ds
    if source.startswith((".", "/")) or source.endswith(tuple(FILE_BUILDERS)):
        raise ValueError(f"{source}: no such file or directory")
    return datasets.load_dataset(source, split=split)


def stream_indices(num_rows: int, step: int, count: int, seed: int, shuffle: bool) -> list[int]:
    """Rows `step * count .. step * count + count - 1` of an endless stream of epochs."""
    out, orders = [], {}
    for pos in range(step * count, (step + 1) * count):
        epoch, i = divmod(pos, num_rows)
        if epoch not in orders:
            order = list(range(num_rows))
            if shuffle:
                random.Random(f"{seed}/epoch/{epoch}").shuffle(order)
            orders[epoch] = order
        out.append(orders[epoch][i])
    return out
