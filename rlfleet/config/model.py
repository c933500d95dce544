"""`[model]`: the policy the trainer trains and vLLM serves, and the launch check that it is there."""

from __future__ import annotations

import json
import re
from pathlib import Path

from pydantic import Field

from rlfleet.config.base import NonEmptyStr, Strict
from rlfleet.config.dtypes import Dtype

MODEL_FILES = ("config.json", "tokenizer_config.json")
HUB_ID = re.compile(r"[\w.-]+/[\w.-]+(@[\w./-]+)?")
HUB_FILES = ["*.json", "*.safetensors", "*.jinja", "*.txt", "*.model", "*.tiktoken"]


class ModelConfig(Strict):
    """The policy: what the trainer trains and vLLM serves."""

    path: NonEmptyStr = Field(
        description="A local HF model directory (config.json, safetensors, tokenizer) or a hub id "
        "(`org/name`, `org/name@revision`), resolved to its local snapshot at preflight."
    )
    dtype: Dtype = Field(
        "float32", description="The trainer's weights (and optimizer masters); vLLM's on a CPU."
    )


def resolve_hub_id(path: str) -> str:
    """The local snapshot of a hub model id (`org/name` or `org/name@revision`), through
    huggingface_hub: its cache first, a download only where the hub is reachable and
    HF_HUB_OFFLINE is unset."""
    from huggingface_hub import snapshot_download

    repo, _, revision = path.partition("@")
    return snapshot_download(repo, revision=revision or None, allow_patterns=HUB_FILES)


def check_model(model: ModelConfig) -> list[str]:
    """A local HF directory, or a hub id: then `model.path` is rewritten to its local snapshot, so
    every sub-config, process and checkpoint after preflight sees a directory."""
    p = Path(model.path)
    if not p.is_dir() and HUB_ID.fullmatch(model.path) and not model.path.startswith((".", "/")):
        try:
            model.path = resolve_hub_id(model.path)
        except Exception as e:  # not cached offline, unknown repo, no network: the user's to fix
            return [f"model.path: {model.path} is not a local directory nor a model in the hub cache: {e}"]
        p = Path(model.path)
    if not p.is_dir():
        return [f"model.path: {p} is not a directory (make one with `rlfleet model tiny --out {p}`)"]
    missing = [f for f in MODEL_FILES if not (p / f).is_file()]
    if not any(p.glob("*.safetensors")):
        missing.append("*.safetensors")
    return [f"model.path: {p} lacks {', '.join(missing)}"] if missing else []


def check_positions(model: ModelConfig, tokens: int, field: str) -> list[str]:
    """`field`'s sequences of `tokens` fit the model's positions (config.json's
    max_position_embeddings); a model without the key, or not there yet, leaves it to check_model."""
    try:
        max_pos = json.loads((Path(model.path) / "config.json").read_text()).get("max_position_embeddings")
    except (OSError, ValueError):
        return []
    return [f"{field}: {tokens} > the model's {max_pos} positions"] if max_pos and tokens > max_pos else []
