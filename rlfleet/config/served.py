"""`[[served]]`: frozen models a run serves beside its policy (teachers, judges), and the launch
check that a teacher's tokenizer is the policy's.

A served model is started, health-checked and relaunched like the policy's replicas (one more
`InferencePool`, rlfleet/inference/pool.py) but never loads a step's weights. Distillation compares
the teacher's logprob of the student's own token ids, so both must read ids the same way: the
vocabulary, the special tokens and the chat template must be equal, refused before anything starts.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import Field, field_validator

from rlfleet.config.base import NonEmptyStr, Strict

POLICY = "policy"  # the policy's served name (rlfleet/inference/server.py): no served model takes it


class ServedModelConfig(Strict):
    """One frozen model served by its own vLLM replicas, named for `judge()` and `loss.distill`."""

    name: NonEmptyStr = Field(
        description="What rewards (`judge(name, ...)`) and `loss.distill.teacher` call it; vLLM's served name."
    )
    path: NonEmptyStr = Field(description="A local HF model directory (config.json, safetensors, tokenizer).")
    num_replicas: int = Field(1, ge=1, description="Its vLLM servers; each relaunched alone when it dies.")
    tensor_parallel_size: int = Field(1, ge=1, description="GPUs per replica.")
    num_gpus: int = Field(
        0,
        ge=0,
        description="0: on the CPU; else num_replicas x tensor_parallel_size GPUs, placed after the "
        "policy's and the trainer's (config/placement.py).",
    )
    port: int | None = Field(
        None,
        ge=1024,
        le=65535,
        description="Port of its replica 0 (replica i: port + i); unset = the port after the previous "
        "model's last replica (the policy's first).",
    )
    max_model_len: int | None = Field(
        None,
        ge=16,
        description="vLLM's context; unset = inference.max_model_len + 1 (a teacher scores a whole "
        "trajectory and vLLM samples one token after it).",
    )
    gpu_memory_utilization: float | None = Field(
        None, gt=0.0, le=1.0, description="vLLM's share of its GPUs; unset = 0.9."
    )
    extra_args: list[str] = Field(
        default_factory=list, description="More vLLM command-line arguments, appended last."
    )

    @field_validator("name")
    @classmethod
    def _not_policy(cls, v: str) -> str:
        if v == POLICY or not v.replace("-", "_").isidentifier():
            raise ValueError(f"{v!r}: a served model's name is a plain identifier other than {POLICY!r}")
        return v

    @property
    def workers(self) -> int:
        return self.num_replicas * self.tensor_parallel_size


def check_served_gpus(served: list[ServedModelConfig]) -> None:
    """A model on GPUs takes exactly a GPU per TP shard of each replica."""
    for i, s in enumerate(served):
        if s.num_gpus and s.num_gpus != s.workers:
            raise ValueError(
                f"served.{i}.num_gpus ({s.num_gpus}) must be 0 (CPU) or num_replicas x "
                f"tensor_parallel_size ({s.num_replicas} x {s.tensor_parallel_size})"
            )


def served_ports(served: list[ServedModelConfig], first_free: int) -> list[int]:
    """Each model's replica-0 port: its own, or the one after the previous model's replicas."""
    out = []
    for s in served:
        port = s.port if s.port is not None else first_free
        out.append(port)
        first_free = port + s.num_replicas
    return out


# -- the launch check: a teacher reads token ids as the policy does ------------------------------
SPECIAL_KEYS = ("bos_token", "eos_token", "pad_token", "unk_token", "additional_special_tokens")


def tokenizer_identity(path: str | Path) -> dict[str, Any]:
    """What decides how a model reads ids, from its files (no transformers import in preflight):
    `vocab` (tokenizer.json's model vocabulary and added tokens), `special_tokens`
    (tokenizer_config.json) and `chat_template` (its own file or the config's key)."""
    p = Path(path)
    tok = json.loads((p / "tokenizer.json").read_text()) if (p / "tokenizer.json").is_file() else {}
    conf = (
        json.loads((p / "tokenizer_config.json").read_text())
        if (p / "tokenizer_config.json").is_file()
        else {}
    )
    vocab = tok.get("model", {}).get("vocab")
    added = sorted((t["id"], t["content"]) for t in tok.get("added_tokens", []))
    template = conf.get("chat_template")
    if (p / "chat_template.jinja").is_file():
        template = (p / "chat_template.jinja").read_text()
    special = {k: conf.get(k) for k in SPECIAL_KEYS} | {"extra": conf.get("extra_special_tokens")}
    return {"vocab": [vocab, added], "special_tokens": special, "chat_template": template}


def check_teacher_tokenizer(policy_path: str, teacher: ServedModelConfig, field: str) -> list[str]:
    """The launch check of `loss.distill.teacher`: its tokenizer reads ids as the policy's does,
    or a problem naming the fields that differ."""
    try:
        mine, theirs = tokenizer_identity(policy_path), tokenizer_identity(teacher.path)
    except (OSError, ValueError) as e:
        return [f"{field}: cannot read the tokenizers of model.path and {teacher.path}: {e}"]
    differ = [k for k in mine if mine[k] != theirs[k]]
    if not differ:
        return []
    return [
        f"{field}: the teacher {teacher.name!r} ({teacher.path}) and the policy (model.path = {policy_path}) "
        f"tokenize differently ({', '.join(differ)} differ): distillation compares logprobs of the same ids"
    ]
