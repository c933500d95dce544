"""Where a run's processes go on one node: a pure function from (config, visible GPUs, model shape)
to a `Placement`, which every consumer reads (the launch check, the resolved job configs: each
replica's CUDA_VISIBLE_DEVICES and the trainer's torchrun ranks, the weight transport, vLLM's share
of a shared GPU, the SLURM template's GPU count).

Two layouts (`deployment.placement`):
- disaggregated: inference takes the first `num_inference_gpus` visible GPUs (replica i the i-th
  group of `tensor_parallel_size`), the trainer the next `num_train_gpus` (one FSDP2 rank each).
  One visible GPU is shared when each side asks for at most one (one-GPU mode).
- colocated: every one of the first N GPUs holds a replica (or a TP shard of one) and a trainer
  rank (N = num_inference_gpus = num_train_gpus), as RLinf's `actor,rollout: all` and verl.
The rules of one transport (where vLLM and the trainer must run for it) are its registry entry's
(config/weights.py `placement`); this module asks them.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Literal

from safetensors import safe_open

from rlfleet.config.deployment import DeploymentConfig, MultiNodeDeployment, not_shared
from rlfleet.config.loader import ConfigError
from rlfleet.config.models import RLConfig
from rlfleet.config.sizing import ModelShape
from rlfleet.config.weights import placed

Mode = Literal["cpu", "disaggregated", "colocated", "multi_node"]


@dataclass(frozen=True)
class Placement:
    """What was decided: replica i runs on `replicas[i]` (its TP group; CUDA_VISIBLE_DEVICES), trainer
    rank r on `trainer[r]`; no GPUs = CPU (or, on multi_node, the SLURM job's nodes hold them)."""

    mode: Mode
    num_replicas: int
    tensor_parallel_size: int
    replicas: tuple[tuple[str, ...], ...]  # per replica its GPUs; () when inference is on a CPU
    trainer: tuple[str, ...]  # per trainer rank its GPU; () for a CPU trainer
    transport: str  # weights.transport, `auto` placed
    served: tuple[tuple[str, tuple[str, ...]], ...] = ()  # per [[served]] model: (name, its GPUs)
    memory: str = ""  # the memory plan's line (config/memory.py); "" where none was made

    @property
    def inference_gpus(self) -> list[str]:
        return [g for group in self.replicas for g in group]

    @property
    def trainer_gpus(self) -> list[str]:
        return list(self.trainer)

    @property
    def shared(self) -> bool:
        return shares(self.inference_gpus, self.trainer_gpus)

    @property
    def gpus(self) -> list[str]:
        """Every GPU the run holds, once each (what its leases and a SLURM job ask for)."""
        served = [g for _, gpus in self.served for g in gpus]
        return list(dict.fromkeys(self.inference_gpus + self.trainer_gpus + served))

    @property
    def served_gpus(self) -> dict[str, list[str]]:
        return {name: list(gpus) for name, gpus in self.served}

    def describe(self) -> str:
        """One line: what runs where (the flow's log, `configs/placement.json`)."""
        n, tp = self.num_replicas, self.tensor_parallel_size
        which = "replica 0" if n == 1 else f"replicas 0-{n - 1}"
        if self.mode == "multi_node":
            inference = f"{which} per inference node (tp {tp}), started by the SLURM job"
        elif self.replicas:
            inference = f"{which} on GPUs {','.join('+'.join(g) for g in self.replicas)} (tp {tp})"
        else:
            inference = f"{which} on the CPU"
        ranks = len(self.trainer)
        if self.mode == "multi_node":
            trainer = "the SLURM job's train nodes (torchrun)"
        elif ranks:
            kind = "FSDP ranks" if ranks > 1 else "FSDP rank"
            trainer = f"{ranks} {kind} on GPU{'s' if ranks > 1 else ''} {','.join(self.trainer)}"
        else:
            trainer = "the CPU"
        run = list(dict.fromkeys(self.inference_gpus + self.trainer_gpus))  # a served model's are its own
        shared = f"; shared: GPU{'s' if len(run) > 1 else ''} {','.join(run)}" if self.shared else ""
        served = "".join(
            f"; served {name}: {'GPUs ' + ','.join(gpus) if gpus else 'the CPU'}"
            for name, gpus in self.served
        )
        memory = f"; memory: {self.memory}" if self.memory else ""
        return f"{self.mode}: inference: {inference}; trainer: {trainer}{shared}; weights: {self.transport}{served}{memory}"

    def to_json(self) -> str:
        return json.dumps({**asdict(self), "describe": self.describe()}, indent=2)


def shares(inference_gpus: list[str], trainer_gpus: list[str]) -> bool:
    """Whether some GPU holds both vLLM and a trainer rank (vLLM then takes less of it)."""
    return bool(set(inference_gpus) & set(trainer_gpus))


def visible_gpus() -> list[str]:
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        return [d.strip() for d in env.split(",") if d.strip()]
    import torch

    return [str(i) for i in range(torch.cuda.device_count())] if torch.cuda.is_available() else []


def gpus_needed(d: DeploymentConfig | MultiNodeDeployment) -> int:
    """Distinct GPUs of one node the deployment places on (a SLURM job's --gpus-per-node)."""
    if d.type == "multi_node":
        return d.gpus_per_node
    if d.placement == "colocated":
        return d.num_train_gpus
    return d.num_inference_gpus + d.num_train_gpus


def assign_gpus(
    d: DeploymentConfig | MultiNodeDeployment, visible: list[str] | None = None
) -> tuple[list[str], list[str]]:
    """(inference GPU ids, trainer GPU ids) by `deployment.placement`; one visible GPU may be shared
    by both in disaggregated mode (one-GPU mode). A multi-node controller holds none: SLURM gave
    the nodes' GPUs to the replicas and trainer ranks it started."""
    if d.type == "multi_node":
        return [], []
    ni, nt = d.num_inference_gpus, d.num_train_gpus
    if ni == 0 and nt == 0:
        return [], []
    visible = visible_gpus() if visible is None else visible
    where = f"CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', '<unset>')}"
    if d.placement == "colocated":
        if nt <= len(visible):
            return visible[:ni], visible[:nt]
        raise ConfigError(
            f"deployment.placement = colocated puts a vLLM replica (or TP shard) and a trainer rank on each of "
            f"deployment.num_train_gpus = {nt} GPUs but {len(visible)} are visible ({where})"
        )
    if ni + nt <= len(visible):
        return visible[:ni], visible[ni : ni + nt]
    if len(visible) == 1 and ni <= 1 and nt <= 1:
        return visible[:ni], visible[:nt]
    raise ConfigError(
        f"deployment asks for {ni} inference + {nt} trainer GPUs but {len(visible)} are visible "
        f"(deployment.num_inference_gpus, deployment.num_train_gpus; {where}; "
        "deployment.placement = colocated shares them)"
    )


def tp_problem(tp: int, shape: ModelShape | None) -> str | None:
    """vLLM's rule for tensor parallelism: tp divides the attention heads, and divides the KV heads
    or is a multiple of them (vLLM then replicates each KV head). Unknown heads pass."""
    if shape is None or tp == 1 or not shape.heads:
        return None
    if shape.heads % tp:
        return f"inference.tensor_parallel_size ({tp}) must divide the model's num_attention_heads ({shape.heads})"
    kv = shape.kv_heads or shape.heads
    if kv % tp and tp % kv:
        return (
            f"inference.tensor_parallel_size ({tp}) must divide the model's num_key_value_heads ({kv}) "
            "or be a multiple of it"
        )
    return None


def place(cfg: RLConfig, visible: list[str], shape: ModelShape | None) -> Placement:
    """The placement of `cfg` on these visible GPUs, or a ConfigError naming every field at fault."""
    placement, problems = _place(cfg, visible, shape)
    if problems or placement is None:
        raise ConfigError("\n".join(problems))
    return placement


def _place(cfg: RLConfig, visible: list[str], shape: ModelShape | None) -> tuple[Placement | None, list[str]]:
    d, i = cfg.deployment, cfg.inference
    problems = [p for p in [tp_problem(i.tensor_parallel_size, shape)] if p]
    try:
        inf, train = assign_gpus(d, visible)
    except ConfigError as e:
        return None, problems + [str(e)]
    transport = placed(cfg.weights, inf, train)
    problems += [p for p in [transport.placement(inf, train)] if p]
    if i.sleep:
        problems += [p for p in [not_shared("inference.sleep", inf, train)] if p]
    served, more = served_gpus(cfg, visible, set(inf) | set(train))
    problems += more
    tp = i.tensor_parallel_size
    replicas = tuple(tuple(inf[r * tp : (r + 1) * tp]) for r in range(len(inf) // tp))
    if d.type == "multi_node":
        mode: Mode = "multi_node"
    elif not inf and not train:
        mode = "cpu"
    else:
        mode = "colocated" if shares(inf, train) else "disaggregated"
    placement = Placement(mode, i.num_replicas, tp, replicas, tuple(train), transport.transport, served)
    return placement, problems


def served_gpus(
    cfg: RLConfig, visible: list[str], taken: set[str]
) -> tuple[tuple[tuple[str, tuple[str, ...]], ...], list[str]]:
    """Each `[[served]]` model's GPUs: the next free visible ones, in order, after the policy's
    replicas and the trainer's ranks (a frozen model never shares them)."""
    free = [g for g in visible if g not in taken]
    out, problems = [], []
    for k, s in enumerate(cfg.served):
        if s.num_gpus > len(free):
            problems.append(
                f"served.{k}.num_gpus: {s.num_gpus} GPUs for {s.name!r} but {len(free)} visible ones are left "
                "after the policy's and the trainer's"
            )
        out.append((s.name, tuple(free[: s.num_gpus])))
        free = free[s.num_gpus :]
    return tuple(out), problems


def check_gpus(cfg: RLConfig, visible: list[str] | None = None) -> tuple[Placement | None, list[str]]:
    """The launch check of placement, on the GPUs visible here (`gpus_here`): (the placement,
    problems). The config alone cannot tell it: whether vLLM and the trainer share a GPU depends on
    how many are visible, and whether TP fits depends on the model's heads."""
    return _place(cfg, gpus_here(cfg) if visible is None else visible, model_shape(cfg.model.path))


def gpus_here(cfg: RLConfig) -> list[str]:
    """The GPUs visible here, where the run asks for any (none for a CPU run or a multi-node controller)."""
    d = cfg.deployment
    if d.type == "multi_node" or not (
        d.num_inference_gpus or d.num_train_gpus or any(s.num_gpus for s in cfg.served)
    ):
        return []
    return visible_gpus()


def model_shape(path: str) -> ModelShape | None:
    """Layers, widths and attention heads from config.json, parameters from the safetensors headers
    (counted from config.json where there are none); None when there is no readable config.json."""
    try:
        config = json.loads((Path(path) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    text = config.get("text_config") or config
    layers, hidden = text.get("num_hidden_layers"), text.get("hidden_size")
    if not isinstance(layers, int) or not isinstance(hidden, int):
        return None
    heads = text.get("num_attention_heads") or 0
    shape = ModelShape(
        0,
        layers,
        hidden,
        heads,
        text.get("num_key_value_heads") or heads,
        head_dim=text.get("head_dim") or 0,
        intermediate=_mlp_width(text),
        vocab=text.get("vocab_size") or 0,
    )
    params = 0
    for f in Path(path).glob("*.safetensors"):
        try:  # the header only: shapes, no tensors (and no torch in the controller's checks)
            with safe_open(f, framework="numpy") as st:
                params += sum(math.prod(st.get_slice(k).get_shape()) for k in st.keys())  # noqa: SIM118
        except Exception:  # noqa: BLE001 - a file safetensors cannot read (SafetensorError) counts nothing
            continue
    return replace(shape, params=params or config_params(text, shape))


def _experts(text: dict) -> tuple[int, int]:
    """A MoE's experts and each one's width; (0, 0) for a dense MLP."""
    experts = text.get("num_experts") or text.get("num_local_experts") or 0
    width = text.get("moe_intermediate_size") or 0
    return (experts, width) if experts and width else (0, 0)


def _mlp_width(text: dict) -> int:
    """The MLP width one token runs through: a MoE's experts per token x their width (and a shared
    expert's), else intermediate_size."""
    experts, width = _experts(text)
    if experts:
        shared = text.get("shared_expert_intermediate_size") or 0
        return text.get("num_experts_per_tok", 1) * width + shared
    return text.get("intermediate_size") or 0


def config_params(text: dict, shape: ModelShape) -> int:
    """Parameters of a decoder-only transformer from its config (no weights yet: a shape's placement
    checked before `rlfleet model` writes it): embeddings (and an untied head), attention, the
    MLP (every expert of a MoE) and norms; 0 where the config lacks a width."""
    h, v = shape.hidden, shape.vocab
    if not (h and v and shape.heads):
        return 0
    hd = shape.head_dim or h // shape.heads
    attn = h * hd * (2 * shape.heads + 2 * shape.kv_heads)
    experts, width = _experts(text)
    mlp = experts * (3 * h * width + h) if experts else 3 * h * shape.ffn
    head = 0 if text.get("tie_word_embeddings", True) else v * h
    return v * h + head + shape.layers * (attn + mlp + 2 * h) + h
