"""Preflight: everything that can be checked before a process starts is checked here, at once."""

from __future__ import annotations

import importlib.util
import os
import re
import socket
from pathlib import Path
from urllib.parse import urlsplit

from rlfleet.config.loader import ConfigError
from rlfleet.config.lora import PEFT_MISSING
from rlfleet.config.models import InferenceConfig, ModelConfig, TrainerConfig

MODEL_FILES = ("config.json", "tokenizer_config.json")


HUB_ID = re.compile(r"[\w.-]+/[\w.-]+(@[\w./-]+)?")
HUB_FILES = ["*.json", "*.safetensors", "*.jinja", "*.txt", "*.model", "*.tiktoken"]


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


def check_lora(trainer: TrainerConfig) -> list[str]:
    """`[trainer.lora]` needs the optional peft (whether its targets exist, the trainer says: the
    model's layers are known only once it is built)."""
    if trainer.lora is None or importlib.util.find_spec("peft") is not None:
        return []
    return [PEFT_MISSING]


def check_output_dir(output_dir: str) -> list[str]:
    if "://" in output_dir and not output_dir.startswith("file://"):
        return check_remote_output_dir(output_dir)
    p = Path(output_dir.removeprefix("file://")).resolve()
    if p.exists() and not p.is_dir():
        return [f"output_dir: {p} exists and is not a directory"]
    parent = p
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        return [f"output_dir: {parent} is a file, not a directory"]
    if not os.access(parent, os.W_OK):
        return [f"output_dir: {parent} is not writable"]
    return []


def check_remote_output_dir(url: str) -> list[str]:
    """An object-store output_dir: credentials come from the environment, and it must be writable.

    One tiny object is written and deleted, so a wrong endpoint, bucket or key fails here and not
    after vLLM has taken a minute to start.
    """
    if "@" in urlsplit(url).netloc:
        return [
            "output_dir: credentials do not belong in the URL (they would be written into configs and "
            "logs); set AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY / AWS_ENDPOINT_URL instead"
        ]
    from rlfleet.store import run_store

    try:
        store = run_store(url)
        store.write_bytes(".rlfleet-probe", b"")
        store.fs.rm(store.path(".rlfleet-probe"))
    except Exception as e:  # any failure is the user's to fix; name it without the request details
        return [f"output_dir: cannot write to {url}: {type(e).__name__}: {str(e)[:300]}"]
    return []


def port_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def check_ports(inference: InferenceConfig) -> list[str]:
    if inference.urls:  # external replicas: their nodes own the ports
        return []
    busy = [
        inference.port + r
        for r in range(inference.num_replicas)
        if not port_free(inference.host, inference.port + r)
    ]
    return [f"inference.port: port(s) {busy} on {inference.host} are in use"] if busy else []


def raise_if(problems: list[str]) -> None:
    if problems:
        raise ConfigError("cannot start:\n" + "\n".join(f"  {p}" for p in problems))
