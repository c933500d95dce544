"""The trainer's model as an HF directory (`from_pretrained` and vLLM read it): a checkpoint's
`model/` and the filesystem transport's `weights/step_N`. Under FSDP2 the state is gathered tensor
by tensor onto rank 0's CPU: no rank holds a full copy on its GPU, the other ranks none at all.
Under LoRA the directory is the merged model, with PEFT's adapter directory in `adapter/`."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import torch

from rlfleet.store import RunStore
from rlfleet.trainer.parallel import Parallel

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "generation_config.json",
)


def hf_model(model: torch.nn.Module) -> torch.nn.Module:
    """The HF model a trainer Policy wraps (under LoRA the PeftModel around it)."""
    return getattr(model, "lm", model)


def stage(store: RunStore, rel: str, par: Parallel | None) -> Path:
    """One staging dir for all ranks (rank 0 makes it); shared with the others through the group."""
    if par is None or not par.enabled:
        return store.staging_dir(rel)
    return Path(par.broadcast(str(store.staging_dir(rel)) if par.is_main else None))


def publish(
    store: RunStore, staged: Path, rel: str, meta: dict[str, Any], par: Parallel | None
) -> dict[str, Any]:
    """Publish `staged` as `rel` once every rank's files are in; its manifest on every rank."""
    if par is None or not par.enabled:
        return store.publish_dir(staged, rel, meta)
    par.barrier()
    return par.broadcast(store.publish_dir(staged, rel, meta) if par.is_main else None)


def gather(model: torch.nn.Module, par: Parallel | None) -> dict[str, torch.Tensor] | None:
    """The HF model's full state dict as CPU copies on rank 0 (None on the other ranks)."""
    lm = hf_model(model)
    if par is None or not par.enabled:
        return {k: v.detach().to("cpu", copy=True) for k, v in lm.state_dict().items()}
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    sd = get_model_state_dict(lm, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if not par.is_main:
        return None
    # on a CPU mesh of one rank the "offloaded" tensors can be the parameters themselves
    return {k: v.clone() if par.device.type == "cpu" else v for k, v in sd.items()}


def write_hf(
    lm: torch.nn.Module, state: dict[str, torch.Tensor], out: Path, tokenizer_dir: str | None
) -> None:
    """An HF model directory from `lm`'s full CPU state dict, with the tokenizer files of
    `tokenizer_dir`. Under LoRA the model is the merged one (what vLLM and `from_pretrained` load)
    and `adapter/` is PEFT's adapter directory (`PeftModel.from_pretrained(base, out / "adapter")`)."""
    from safetensors.torch import save_file

    from rlfleet.trainer.lora import base_model, peft_model, save_adapter
    from rlfleet.weights.tensors import sent_tensors

    sent = sent_tensors(lm, state)  # what every transport sends (a tied head is not; LoRA merged)
    out.mkdir(parents=True, exist_ok=True)
    save_file(
        {k: v.contiguous() for k, v in sent.items()},
        str(out / "model.safetensors"),
        metadata={"format": "pt"},
    )
    hf = base_model(lm)
    hf.config.save_pretrained(out)
    if hf.generation_config is not None:
        hf.generation_config.save_pretrained(out)
    for name in TOKENIZER_FILES:
        src = Path(tokenizer_dir or "") / name
        if tokenizer_dir and src.is_file():
            shutil.copy2(src, out / name)
    if (peft := peft_model(lm)) is not None:
        save_adapter(peft, state, out / "adapter")
