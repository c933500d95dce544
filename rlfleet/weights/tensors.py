"""What the trainer sends (`sent_tensors`, for every transport), and parameters as one flat layout:
what the cuda_ipc and nccl transports move instead of files.

A layout is a list of `[name, bucket, offset, shape]` in elements of one dtype (vLLM's); buckets
bound the size of one contiguous buffer. The trainer fills buffers from its state dict, a vLLM
worker reads views of them back by name and hands them to `model.load_weights`.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping

import torch

from rlfleet.trainer.hf_export import hf_model
from rlfleet.trainer.lora import base_model, merged_tensors, peft_model

BUCKET_BYTES = 1 << 30


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


def full_state_dict(model: torch.nn.Module, sharded: bool) -> Mapping[str, torch.Tensor]:
    """`sent_tensors` as full tensors on the trainer's device (gathered when FSDP-sharded)."""
    lm = hf_model(model)
    if sharded:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        sd = get_model_state_dict(lm, options=StateDictOptions(full_state_dict=True))
    else:
        sd = dict(lm.state_dict())
    return sent_tensors(lm, sd)


def make_layout(sd: Mapping[str, torch.Tensor], dtype: torch.dtype, bucket_bytes: int = BUCKET_BYTES) -> list:
    cap = max(bucket_bytes * 8 // torch.finfo(dtype).bits, 1)
    layout, bucket, offset = [], 0, 0
    for name, t in sd.items():
        n = t.numel()
        if offset and offset + n > cap:
            bucket, offset = bucket + 1, 0
        layout.append([name, bucket, offset, list(t.shape)])
        offset += n
    return layout


def bucket_sizes(layout: list) -> list[int]:
    sizes: dict[int, int] = {}
    for _, b, off, shape in layout:
        sizes[b] = max(sizes.get(b, 0), off + math.prod(shape))
    return [sizes[b] for b in range(len(sizes))]


def fill(buckets: list[torch.Tensor], layout: list, sd: Mapping[str, torch.Tensor]) -> None:
    with torch.no_grad():
        for name, b, off, shape in layout:
            buckets[b][off : off + math.prod(shape)].copy_(sd[name].reshape(-1))


def views(buckets: list[torch.Tensor], layout: list) -> Iterator[tuple[str, torch.Tensor]]:
    for name, b, off, shape in layout:
        yield name, buckets[b][off : off + math.prod(shape)].view(shape)
