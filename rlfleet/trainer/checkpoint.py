"""Trainer checkpoints and weight snapshots as store artifacts.

`checkpoints/step_N/`: model (HF safetensors), optimizer state, and `state.json` with the step and
the orchestrator cursor that came with batch N, so a resumed run continues with the exact data
it would have seen. `weights/step_N/`: an HF model directory vLLM reloads from.
Both are built in a staging dir and published with a manifest, so a crash mid-write leaves the
previous checkpoint as the latest complete one.
"""

from __future__ import annotations

import io
import logging
import shutil
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel

from rlfleet.store import CorruptArtifact, RunStore, step_dir

log = logging.getLogger("rlfleet.checkpoint")

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "generation_config.json",
)


def _save_model(model: PreTrainedModel, out: Path, tokenizer_dir: str | None) -> None:
    model.save_pretrained(out, safe_serialization=True)
    if tokenizer_dir:
        for name in TOKENIZER_FILES:
            src = Path(tokenizer_dir) / name
            if src.is_file():
                shutil.copy2(src, out / name)


def publish_weights(store: RunStore, step: int, model: PreTrainedModel, tokenizer_dir: str) -> dict[str, Any]:
    rel = step_dir("weights", step)
    stage = store.staging_dir(rel)
    _save_model(model, stage, tokenizer_dir)
    return store.publish_dir(stage, rel, {"step": step})


def prune_weights(store: RunStore, keep: int) -> None:
    steps = store.complete_steps("weights")
    for s in steps[: max(len(steps) - keep, 0)]:
        store.remove(step_dir("weights", s))


def save_checkpoint(
    store: RunStore,
    step: int,
    model: PreTrainedModel,
    optimizer: torch.optim.Optimizer,
    cursor: dict[str, Any],
    tokenizer_dir: str,
) -> dict[str, Any]:
    rel = step_dir("checkpoints", step)
    stage = store.staging_dir(rel)
    _save_model(model, stage / "model", tokenizer_dir)
    torch.save(optimizer.state_dict(), stage / "optimizer.pt")
    return store.publish_dir(stage, rel, {"step": step, "cursor": cursor})


def latest_checkpoint(store: RunStore) -> dict[str, Any] | None:
    """The manifest of the newest checkpoint whose files all verify, or None."""
    for step in reversed(store.complete_steps("checkpoints")):
        try:
            manifest = store.manifest(step_dir("checkpoints", step), verify=True)
        except CorruptArtifact as e:
            log.warning("checkpoint step %d is corrupt (%s); falling back to the previous one", step, e)
            continue
        if manifest is not None:
            return manifest
    return None


def checkpoint_model_path(store: RunStore, step: int) -> str:
    """A path `from_pretrained` can read; remote checkpoints are copied to a local cache first."""
    rel = f"{step_dir('checkpoints', step)}/model"
    if store.is_local:
        return str(store.local_path(rel))
    local = Path(store.staging_dir(rel))
    store.fs.get(store.path(rel) + "/", str(local), recursive=True)
    return str(local)


def load_optimizer_state(
    store: RunStore, step: int, optimizer: torch.optim.Optimizer, device: torch.device
) -> None:
    data = store.read_bytes(f"{step_dir('checkpoints', step)}/optimizer.pt")
    optimizer.load_state_dict(torch.load(io.BytesIO(data), map_location=device, weights_only=True))
