"""The trainer's model as Hugging Face tensors: what every weight transport sends (`sent_tensors`,
gathered by `full_state`) and the HF directory that `from_pretrained` and vLLM read (`write_hf`: a
checkpoint's `model/` and the filesystem transport's `weights/step_N`). Under FSDP2 a directory's
state is gathered tensor by tensor onto rank 0's CPU: no rank holds a full copy on its GPU, the
other ranks none at all. Under LoRA the directory is the merged model, with PEFT's adapter
directory in `adapter/`."""

from __future__ import annotations

import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from rlfleet.store import RunStore
from rlfleet.trainer.lora import base_model, merged_tensors, peft_model, save_adapter
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


def full_state(model: torch.nn.Module, par: Parallel | None, cpu: bool) -> dict[str, torch.Tensor] | None:
    """The HF model's full state dict, gathered when FSDP-sharded (a collective: every rank calls it).
    cpu: CPU copies on rank 0 and None on the other ranks (files); else full tensors on every rank,
    on the trainer's device (the transports that fill GPU buffers)."""
    lm = hf_model(model)
    if par is None or not par.enabled:
        sd = lm.state_dict()
        return {k: v.detach().to("cpu", copy=True) for k, v in sd.items()} if cpu else dict(sd)
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    sd = get_model_state_dict(lm, options=StateDictOptions(full_state_dict=True, cpu_offload=cpu))
    if not cpu:
        return sd
    if not par.is_main:
        return None
    # on a CPU mesh of one rank the "offloaded" tensors can be the parameters themselves
    return {k: v.clone() if par.device.type == "cpu" else v for k, v in sd.items()}


def sent_tensors(lm: torch.nn.Module, sd: Mapping[str, torch.Tensor]) -> Mapping[str, torch.Tensor]:
    """What every transport sends of the trainer's model `lm` from its state dict `sd` (files and
    broadcasts): always the base model's tensors under transformers' names.

    - transformers' names and layouts: vLLM's `load_weights` maps and fuses them (q/k/v, gate/up).
      MoE experts go as transformers holds them, fused [experts, 2 x inter, hidden] gate|up and
      [experts, hidden, inter] down: vLLM's loader takes them as they are, `from_pretrained` too.
    - Persistent buffers are checkpoint content and go (DeepSeek-style routers keep a bias as one);
      rotary `inv_freq` is non-persistent, never in a state dict, and vLLM derives its own
      `cos_sin_cache` (`vllm_reload` keeps vLLM from warning that it was not loaded).
    - A tied LM head (`tie_word_embeddings`) is not sent: vLLM ties it to the embedding itself and
      skips the name. The trainer must hold one tensor for both, else the served head would silently
      not be the trained one.
    - Under LoRA (`lm` a PeftModel), each adapted weight goes merged, W + (alpha / r) B A, under the
      base's name, computed when read (trainer/lora.py `merged_tensors`); adapters never go.
    - The trainer's dtype (fp32 masters stay fp32 here): a file keeps it and vLLM's loader casts, a
      cuda_ipc/nccl layout casts to vLLM's dtype as it fills (`fill`); both round to nearest.
    """
    hf = base_model(lm)
    skip = set()
    if getattr(getattr(hf, "config", None), "tie_word_embeddings", False):
        head, embed = hf.get_output_embeddings(), hf.get_input_embeddings()
        if head is not None and head.weight is not embed.weight:
            raise ValueError("tie_word_embeddings is set but the trainer's LM head is not its embedding")
        skip.add("lm_head.weight")
    if (peft := peft_model(lm)) is not None:
        return merged_tensors(peft, sd, skip)
    return {k: v for k, v in sd.items() if k not in skip}


def sent_state(model: torch.nn.Module, par: Parallel | None) -> Mapping[str, torch.Tensor]:
    """`sent_tensors` as full tensors on the trainer's device, on every rank (cuda_ipc, nccl)."""
    state = full_state(model, par, cpu=False)
    assert state is not None
    return sent_tensors(hf_model(model), state)


def write_hf(
    lm: torch.nn.Module, state: dict[str, torch.Tensor], out: Path, tokenizer_dir: str | None
) -> None:
    """An HF model directory from `lm`'s full CPU state dict, with the tokenizer files of
    `tokenizer_dir`. Under LoRA the model is the merged one (what vLLM and `from_pretrained` load)
    and `adapter/` is PEFT's adapter directory (`PeftModel.from_pretrained(base, out / "adapter")`)."""
    from safetensors.torch import save_file

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
