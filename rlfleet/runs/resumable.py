"""The launch check of a rerun: the run store's checkpoint must be one this config can resume.

A rerun resumes from the newest checkpoint in `output_dir` (trainer/resume.py). A config whose
model has another shape than that checkpoint's, or that trains LoRA adapters where the checkpoint
has none (or the reverse), would fail inside the trainer, minutes in, with a shape or key error
from torch. Here it is refused before anything starts, naming what differs and the two ways on that
lose nothing: the config the run started with, or another output_dir.
"""

from __future__ import annotations

import json
from pathlib import Path

from rlfleet.config.models import RLConfig
from rlfleet.store import CorruptArtifact, layout, run_store

# what makes a checkpoint's tensors another model's: its architecture and every shape
SHAPE = (
    "model_type",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "vocab_size",
    "num_experts",
    "tie_word_embeddings",
)


def check_resumable(cfg: RLConfig) -> list[str]:
    store = run_store(cfg.output_dir)
    steps = store.complete_steps(layout.CHECKPOINTS)
    if not steps:
        return []  # a fresh run, or one that resumes from the base model
    rel = layout.step_dir(layout.CHECKPOINTS, steps[-1])
    try:
        manifest = store.manifest(rel) or {}
        theirs = json.loads(store.read_bytes(f"{rel}/{layout.CHECKPOINT_MODEL}/config.json"))
        ours = json.loads((Path(cfg.model.path) / "config.json").read_text())
    except (OSError, ValueError, CorruptArtifact):
        return []  # unreadable here: the resume's own verification names it (files.latest_checkpoint)
    way_on = (
        f"rerun with the config it was started with ({store.uri(layout.config('rl'))}), or give this "
        f"config another output_dir; nothing in {store.url} is changed"
    )
    problems = []
    if diff := {k: (theirs.get(k), ours.get(k)) for k in SHAPE if theirs.get(k) != ours.get(k)}:
        said = ", ".join(f"{k} {a} there, {b} here" for k, (a, b) in diff.items())
        problems.append(
            f"model.path: {cfg.model.path} is not the model of the run in {store.url} "
            f"(checkpoint {steps[-1]}: {said}); {way_on}"
        )
    if bool(manifest.get("lora")) != bool(cfg.trainer.lora):
        had = "LoRA adapters" if manifest.get("lora") else "the full model"
        problems.append(
            f"trainer.lora: the run in {store.url} trained {had} (checkpoint {steps[-1]}), this config "
            f"{'the full model' if manifest.get('lora') else 'LoRA adapters'}; {way_on}"
        )
    return problems
