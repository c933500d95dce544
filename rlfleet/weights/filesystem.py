"""The filesystem transport: `weights/step_N` as an HF model directory that vLLM reloads in place.

Also the fallback every transport shares: a resumed run and a relaunched replica load the newest
verified weights on disk (`weights/step_N` or a checkpoint's `model/`).
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from rlfleet.store import CorruptArtifact, RunStore, stage, step_dir
from rlfleet.trainer import hf_export
from rlfleet.trainer.files import prune_steps
from rlfleet.trainer.parallel import Parallel

log = logging.getLogger("rlfleet.weights")


def publish_weights(
    store: RunStore, step: int, model: torch.nn.Module, tokenizer_dir: str, par: Parallel | None = None
) -> dict[str, Any]:
    """`weights/step_N`: the model as an HF directory (gathered on rank 0 when sharded)."""
    rel = step_dir("weights", step)
    staged = hf_export.stage(store, rel, par)
    if (state := hf_export.gather(model, par)) is not None:
        hf_export.write_hf(hf_export.hf_model(model), state, staged, tokenizer_dir)
    return hf_export.publish(store, staged, rel, {"step": step}, par)


class FilesystemPublisher:
    def __init__(self, store: RunStore, par: Parallel, tokenizer_dir: str, keep: int):
        self.store, self.par, self.tokenizer_dir, self.keep = store, par, tokenizer_dir, keep

    def publish(self, step: int, model: torch.nn.Module) -> None:
        publish_weights(self.store, step, model, self.tokenizer_dir, self.par)
        if self.par.is_main:
            prune_steps(self.store, "weights", self.keep)  # the newest `keep` snapshots

    def serve(self, step: int) -> None:
        """Nothing to hand over: the replicas read the files when the controller asks them to."""

    def poll(self) -> None:
        """Nothing to answer: a relaunched replica reads the files."""

    def close(self) -> None:
        pass


WEIGHTS_CACHED = 2  # staged snapshots a node keeps: the one served and the one replacing it


def newest_weights(store: RunStore, step: int, checksum: bool = True) -> tuple[int, str]:
    """(step, local path) of verified weights for `step`, else of the newest verified ones before it.

    Weights come from `weights/step_N` or a checkpoint's `model/`; a missing, truncated or corrupt
    snapshot is skipped with a warning naming it, so vLLM never loads a half-written file. From a
    remote store they are staged to this node's local cache first (checked against the manifest).
    checksum=False checks a local snapshot's manifest and file sizes only: the broadcast's hot path,
    reading what this run's trainer published (and hashed) moments ago. A resume re-hashes it all.
    """
    candidates = sorted(
        {s for kind in ("weights", "checkpoints") for s in store.complete_steps(kind) if s <= step},
        reverse=True,
    )
    for s in candidates:
        for rel, sub in ((step_dir("weights", s), ""), (step_dir("checkpoints", s), "model")):
            try:
                local = stage(store, rel, keep=WEIGHTS_CACHED, checksum=checksum)
            except FileNotFoundError:
                continue
            except CorruptArtifact as e:
                log.warning("weights in %s are corrupt (%s); trying an older snapshot", rel, e)
                continue
            if s != step:
                log.warning("no complete weights for step %d; using step %d's", step, s)
            return s, str(local / sub) if sub else str(local)
    raise FileNotFoundError(f"no complete weights for step <= {step} in {store.url}")
