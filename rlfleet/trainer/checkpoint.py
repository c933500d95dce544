"""Trainer checkpoints and weight snapshots as store artifacts.

`checkpoints/step_N/`: model (HF safetensors) and optimizer state; its manifest holds the step and
the orchestrator cursor that came with batch N, so a resumed run continues with the exact data
it would have seen. `weights/step_N/`: an HF model directory vLLM reloads from.
Both are built in a staging dir and published with a manifest, so a crash mid-write leaves the
previous checkpoint as the latest complete one. A checkpoint is snapshotted to CPU memory first
and written after (`snapshot_checkpoint`), so the trainer can write it in the background.

Under FSDP2 (`par.enabled`) the trainer state is a torch.distributed.checkpoint (`dcp/`): every rank
writes its own shards, and a later load reshards to whatever GPU count resumes it. The HF export
(`model/`, `weights/step_N`) is gathered tensor by tensor onto rank 0's CPU, so no rank ever
holds a full copy on its GPU and the other ranks hold none at all.
"""

from __future__ import annotations

import io
import logging
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel

from rlfleet.store import RunStore, step_dir
from rlfleet.store import stage as stage_locally
from rlfleet.trainer.files import latest_checkpoint
from rlfleet.trainer.parallel import Parallel

log = logging.getLogger("rlfleet.checkpoint")

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "generation_config.json",
)


def hf_model(model: torch.nn.Module) -> PreTrainedModel:
    return getattr(model, "lm", model)  # a trainer Policy wraps the HF model


def _save_model(
    model: torch.nn.Module, out: Path, tokenizer_dir: str | None, par: Parallel | None = None
) -> None:
    state = _hf_state(model, par)
    if state is not None:
        _write_hf(hf_model(model), state, out, tokenizer_dir)


def _copy_tokenizer(tokenizer_dir: str | None, out: Path) -> None:
    for name in TOKENIZER_FILES:
        src = Path(tokenizer_dir or "") / name
        if tokenizer_dir and src.is_file():
            shutil.copy2(src, out / name)


def _stage(store: RunStore, rel: str, par: Parallel | None) -> Path:
    """One staging dir for all ranks (rank 0 makes it); shared with the others through the group."""
    if par is None or not par.enabled:
        return store.staging_dir(rel)
    return Path(par.broadcast(str(store.staging_dir(rel)) if par.is_main else None))


def _publish(
    store: RunStore, stage: Path, rel: str, meta: dict[str, Any], par: Parallel | None
) -> dict[str, Any]:
    if par is None or not par.enabled:
        return store.publish_dir(stage, rel, meta)
    par.barrier()  # every rank's files are in
    manifest = par.broadcast(store.publish_dir(stage, rel, meta) if par.is_main else None)
    return manifest


def publish_weights(
    store: RunStore, step: int, model: torch.nn.Module, tokenizer_dir: str, par: Parallel | None = None
) -> dict[str, Any]:
    rel = step_dir("weights", step)
    stage = _stage(store, rel, par)
    _save_model(model, stage, tokenizer_dir, par)
    return _publish(store, stage, rel, {"step": step}, par)


def prune_weights(store: RunStore, keep: int) -> list[int]:
    """Keep the newest `keep` complete weight snapshots; called after a newer one is published."""
    return _prune(store, "weights", keep, protect=None)


def prune_checkpoints(store: RunStore, keep: int, written: int | None = None) -> list[int]:
    """Keep the newest `keep` complete checkpoints (0 = all), and always the one a resume would use.

    The resume checkpoint is the newest that verifies; if the newest ones are corrupt it is older
    than the `keep` newest and survives anyway. `written` is a checkpoint the caller has just
    published (its files hashed as they were written): when it is the newest, it is the resume
    checkpoint, and nothing is read back to find that (re-hashing 6.7 GB took 7.5 s on an H100 host).
    """
    if keep <= 0:
        return []
    steps = store.complete_steps("checkpoints")
    if len(steps) <= keep:
        return _prune(store, "checkpoints", keep, protect=None)
    if written is not None and written == steps[-1]:
        return _prune(store, "checkpoints", keep, protect=written)
    resume = latest_checkpoint(store)
    return _prune(store, "checkpoints", keep, protect=None if resume is None else resume["step"])


def _prune(store: RunStore, kind: str, keep: int, protect: int | None) -> list[int]:
    """Remove complete `kind` steps older than the newest `keep`, except `protect`, plus leftovers of
    cut uploads (no manifest) older than the oldest kept: the trainer never writes those again."""
    steps = store.complete_steps(kind)
    kept = steps[-keep:] if keep > 0 else steps
    if not kept:
        return []
    gone = [s for s in steps if s not in kept and s != protect]
    gone += [s for s in store.step_dirs(kind) if s < kept[0] and s not in steps]
    for s in gone:
        store.remove(step_dir(kind, s))
    return sorted(gone)


def snapshot_checkpoint(
    store: RunStore,
    step: int,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    cursor: dict[str, Any],
    tokenizer_dir: str,
    par: Parallel | None = None,
    group: Any = None,
    host: HostCopy | None = None,
) -> Callable[[], dict[str, Any] | None]:
    """Copy checkpoint `step`'s state to CPU memory now; the returned function writes and publishes
    it, and may run in another thread while training goes on (`trainer/checkpointer.py`).

    Every collective of the copy happens here, in the caller's thread: the HF export's gather onto
    rank 0 and each rank's shards into `host` (its buffers are reused by the next checkpoint, so
    that one must wait for this write). DCP then writes through `group` (a CPU group of its own,
    see `Checkpointer`); its save returns on rank 0 once every rank's shards and the metadata are
    written, which is what lets rank 0 publish without another barrier.
    """
    rel = step_dir("checkpoints", step)
    stage = _stage(store, rel, par)
    lm = hf_model(model)
    state = _hf_state(model, par)  # rank 0's full copy (the gather is a collective)
    sharded = par is not None and par.enabled
    if sharded:
        trainer_state = (host or HostCopy(pinned=False))(dcp_state(model, optimizer))
        optim = None
    else:
        optim = _cpu_copy(optimizer.state_dict())

    def write() -> dict[str, Any] | None:
        t0 = time.perf_counter()
        if state is not None:
            _write_hf(lm, state, stage / "model", tokenizer_dir)
        t1 = time.perf_counter()
        if sharded:
            import torch.distributed.checkpoint as dcp

            dcp.save(trainer_state, storage_writer=_dcp_writer(stage / "dcp"), process_group=group)
            if not par.is_main:
                return None
        else:
            torch.save(optim, stage / "optimizer.pt")
        t2 = time.perf_counter()
        manifest = store.publish_dir(stage, rel, {"step": step, "cursor": cursor})
        log.info(
            "checkpoint %d: HF export %.2f s, trainer state %.2f s, checksums and publish %.2f s",
            step,
            t1 - t0,
            t2 - t1,
            time.perf_counter() - t2,
        )
        return manifest

    return write


class HostCopy:
    """Host memory for a sharded trainer state (each rank's shards of the model and optimizer),
    allocated at the first checkpoint and refilled at every later one, as torchtitan's async
    checkpoints do; `pinned` on a GPU, where the copy is a DMA. Allocating it afresh for every
    checkpoint (5 GB of pinned memory at the 0.5B shape) held each checkpoint step ~2 s longer on an
    H100 than the copy itself; allocated within the first checkpoint step, 4.2 s."""

    def __init__(self, pinned: bool):
        self.pinned = pinned
        self._buffers: dict[str, Any] | None = None

    @property
    def allocated(self) -> bool:
        return self._buffers is not None

    def allocate(self, state: dict[str, Any]) -> None:
        """Buffers shaped like `state` (any thread: it reads shapes, and copies nothing that matters)."""
        from torch.distributed._state_dict_utils import _create_cpu_state_dict

        self._buffers = _create_cpu_state_dict(state, pin_memory=self.pinned)

    def __call__(self, state: dict[str, Any]) -> dict[str, Any]:
        """`state` with every tensor replaced by its copy in the buffers (other values as they are)."""
        from torch.distributed._state_dict_utils import _copy_state_dict

        if self._buffers is None:
            self.allocate(state)
        copied = _copy_state_dict(state, self._buffers, non_blocking=self.pinned)
        if self.pinned:
            torch.cuda.synchronize()
        return copied


def _dcp_writer(path: Path) -> Any:
    """DCP's file writer, a few threads (so a few files) per rank, without an fsync per file: the
    manifest's sha256s, verified before a resume uses a checkpoint, catch what a machine crash
    left unwritten, and the resume falls back to the previous checkpoint."""
    from torch.distributed.checkpoint import FileSystemWriter

    return FileSystemWriter(path, sync_files=False, thread_count=min(4, os.cpu_count() or 1))


def _hf_state(model: torch.nn.Module, par: Parallel | None) -> dict[str, torch.Tensor] | None:
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


def _write_hf(
    lm: PreTrainedModel, state: dict[str, torch.Tensor], out: Path, tokenizer_dir: str | None
) -> None:
    """An HF model directory (`from_pretrained` and vLLM read it) from a CPU state dict."""
    from safetensors.torch import save_file

    from rlfleet.weights.tensors import sent_tensors

    state = sent_tensors(lm, state)  # what every transport sends (a tied head is not)
    out.mkdir(parents=True, exist_ok=True)
    save_file(
        {k: v.contiguous() for k, v in state.items()},
        str(out / "model.safetensors"),
        metadata={"format": "pt"},
    )
    lm.config.save_pretrained(out)
    if lm.generation_config is not None:
        lm.generation_config.save_pretrained(out)
    _copy_tokenizer(tokenizer_dir, out)


def _cpu_copy(obj: Any) -> Any:
    """A deep copy of a (nested) state dict with every tensor copied to CPU memory."""
    from torch.utils._pytree import tree_map

    return tree_map(lambda x: x.detach().to("cpu", copy=True) if isinstance(x, torch.Tensor) else x, obj)


def dcp_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_sd, optim_sd = get_state_dict(hf_model(model), optimizer)
    return {"model": model_sd, "optim": optim_sd}


def load_dcp(model: torch.nn.Module, optimizer: torch.optim.Optimizer, path: str) -> None:
    """Load a `dcp/` checkpoint into this process's sharding (any world size, or no process group)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import set_state_dict

    state = dcp_state(model, optimizer)
    dcp.load(state, checkpoint_id=path)
    set_state_dict(
        hf_model(model), optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"]
    )


def load_trainer_state(
    store: RunStore, step: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer, device: torch.device
) -> None:
    """Optimizer (and, for DCP, model) state of checkpoint `step`, whichever format it was saved in."""
    rel = step_dir("checkpoints", step)
    if store.exists(f"{rel}/optimizer.pt"):
        load_optimizer_state(store, step, optimizer, device)
        return
    local = store.local_path(rel) if store.is_local else stage_locally(store, rel, keep=1)  # verified copy
    load_dcp(model, optimizer, str(local / "dcp"))


def load_optimizer_state(
    store: RunStore, step: int, optimizer: torch.optim.Optimizer, device: torch.device
) -> None:
    data = store.read_bytes(f"{step_dir('checkpoints', step)}/optimizer.pt")
    optimizer.load_state_dict(torch.load(io.BytesIO(data), map_location=device, weights_only=True))
