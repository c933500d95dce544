"""The trainer's one checkpoint owner: `CheckpointManager.load(step)`, then `save(step, ...)`.

`checkpoints/step_N/`: the HF model (`model/`, what eval, a relaunched vLLM and a resume's
`from_pretrained` read) and the trainer state: `optimizer.pt`, or under FSDP2 a
torch.distributed.checkpoint (`dcp/`: every rank's shards of the trained parameters and the
optimizer, which a load reshards to any GPU count); the manifest holds the data cursor that came
with batch N. Under LoRA the trainer state holds only what trains, the adapters (`adapter.pt` beside
`optimizer.pt`, or in `dcp/`) and their optimizer state, and a resume puts them onto the base from
`model.path`: `model/` is the merged model (plus PEFT's `adapter/`), for inference only.
Built in a staging dir and published with sha256s: a crash mid-write leaves the previous one the
latest complete one. A checkpoint costs the step a copy to CPU memory (exactly step N's state);
one worker thread writes, publishes and prunes while the next steps train, one write at a time.
A failed write raises in the trainer's thread at its next step, and the trainer dies as after any
other error: the launcher resumes it from the previous complete checkpoint.
"""

from __future__ import annotations

import io
import logging
import os
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch

from rlfleet.store import RunStore, layout
from rlfleet.store import stage as stage_locally
from rlfleet.trainer import hf_export
from rlfleet.trainer.files import latest_checkpoint, prune_steps
from rlfleet.trainer.host_state import host_like
from rlfleet.trainer.lora import peft_model
from rlfleet.trainer.parallel import Parallel
from rlfleet.trainer.train import init_optimizer_state

log = logging.getLogger("rlfleet.checkpoint")


class CheckpointManager:
    """Checkpoints of one trainer's model and optimizer, every `interval` steps and at the last."""

    def __init__(
        self,
        store: RunStore,
        par: Parallel,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        tokenizer_dir: str,
        keep: int,
        interval: int,
    ):
        self.store, self.par, self.model, self.optimizer = store, par, model, optimizer
        self.tokenizer_dir, self.keep, self.interval = tokenizer_dir, keep, interval
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="rlfleet-checkpoint")
        self._pending: tuple[int, Future] | None = None
        self._group = None
        self._host = HostCopy(pinned=par.device.type == "cuda")
        self.lora = peft_model(hf_export.hf_model(model)) is not None
        if par.enabled:  # DCP's collectives run in the worker thread: never on the training group
            import torch.distributed as dist

            self._group = dist.new_group(backend="gloo")

    def load(self, step: int | None) -> int:
        """Checkpoint `step`'s optimizer state (and under DCP its model; else the trainer was built
        from its `model/`), or nothing for None; the step to train next."""
        if step is None:
            return 0
        store, rel = self.store, layout.step_dir(layout.CHECKPOINTS, step)
        if bool((store.manifest(rel) or {}).get("lora")) != self.lora:
            raise ValueError(
                f"{rel} was trained {'with' if not self.lora else 'without'} [trainer.lora] and this "
                f"config {'sets' if self.lora else 'does not set'} it: resume with the run's own setting, "
                "or start a new output_dir"
            )
        lm = hf_export.hf_model(self.model)
        if store.exists(f"{rel}/{layout.OPTIMIZER}"):
            if self.lora:
                adapter = _read(store, f"{rel}/{layout.ADAPTER}", self.par.device)
                lm.load_state_dict(_trainable(lm, adapter), strict=False)
            self.optimizer.load_state_dict(_read(store, f"{rel}/{layout.OPTIMIZER}", self.par.device))
        else:  # into any world size, or no process group; from a verified local copy
            import torch.distributed.checkpoint as dcp
            from torch.distributed.checkpoint.state_dict import set_state_dict

            local = _local_copy(store, rel)
            state = dcp_state(self.model, self.optimizer)
            dcp.load(state, checkpoint_id=str(local / layout.DCP))
            set_state_dict(
                lm,
                self.optimizer,
                model_state_dict=state["model"],
                optim_state_dict=state["optim"],
                options=_trainer_state_options(),
            )
        return step + 1

    def prepare(self) -> float:
        """Make the host buffers of a sharded state at start-up, while vLLM starts; seconds spent.

        Allocating them (5 GB of pinned memory at the 0.5B shape on an H100, 4.2 s) held the first
        checkpoint step as long, and beside the first training steps slowed each of them ~2x. The
        optimizer's state is created first, as its first step would create it."""
        if not self.par.enabled or self._host.allocated:
            return 0.0
        t0 = time.perf_counter()
        init_optimizer_state(self.optimizer)
        self._host.allocate(dcp_state(self.model, self.optimizer))
        return time.perf_counter() - t0

    def save(self, step: int, cursor: dict[str, Any], last: bool = False) -> float | None:
        """Snapshot step `step` and start writing it if a checkpoint is due; the last one is written
        before this returns (the run's result). The seconds the step spent (waiting for the
        previous write, copying), or None when none is due."""
        if not last and (step + 1) % self.interval:
            return None
        t0 = time.perf_counter()
        self.wait()
        t1 = time.perf_counter()
        self._pending = (step, self._pool.submit(self._write, step, self._snapshot(step, cursor)))
        if t1 - t0 > 0.5:
            log.warning(
                "checkpoint %d waited %.1f s for checkpoint writes to catch up: the interval is "
                "shorter than a write; raise trainer.checkpoint_interval",
                step,
                t1 - t0,
            )
        log.info(
            "checkpoint %d copied in %.2f s (after %.2f s waiting for the previous)",
            step,
            time.perf_counter() - t1,
            t1 - t0,
        )
        if last:
            self.wait()
        return time.perf_counter() - t0

    def _snapshot(self, step: int, cursor: dict[str, Any]) -> Callable[[], None]:
        """Copy checkpoint `step`'s state to CPU memory now; the returned function writes and
        publishes it, in the worker thread while training goes on.

        Every collective of the copy happens here, in the trainer's thread: the HF export's gather
        onto rank 0 and each rank's shards into the host buffers (which the next checkpoint reuses,
        so it waits for this write). DCP then writes through a CPU group of its own; its save
        returns on rank 0 once every rank's shards and the metadata are written, which is what
        lets rank 0 publish without another barrier.
        """
        store, par, rel = self.store, self.par, layout.step_dir(layout.CHECKPOINTS, step)
        staged = hf_export.stage(store, rel, par)
        lm = hf_export.hf_model(self.model)
        # rank 0's full copy (the gather is a collective)
        state = hf_export.full_state(self.model, par, cpu=True)
        if par.enabled:
            trainer_state = self._host(dcp_state(self.model, self.optimizer))
        else:
            optim = _cpu_copy(self.optimizer.state_dict())
            adapter = _trainable(lm, state) if self.lora else None  # views of the copy just made

        def write() -> None:
            t0 = time.perf_counter()
            if state is not None:
                hf_export.write_hf(lm, state, staged / layout.CHECKPOINT_MODEL, self.tokenizer_dir)
            t1 = time.perf_counter()
            if par.enabled:
                import torch.distributed.checkpoint as dcp

                dcp.save(
                    trainer_state, storage_writer=_dcp_writer(staged / layout.DCP), process_group=self._group
                )
                if not par.is_main:
                    return
            else:
                torch.save(optim, staged / layout.OPTIMIZER)
                if adapter is not None:
                    torch.save(adapter, staged / layout.ADAPTER)
            t2 = time.perf_counter()
            store.publish_dir(staged, rel, {"step": step, "cursor": cursor, "lora": self.lora})
            log.info(
                "checkpoint %d: HF export %.2f s, trainer state %.2f s, checksums and publish %.2f s",
                step,
                t1 - t0,
                t2 - t1,
                time.perf_counter() - t2,
            )

        return write

    def _write(self, step: int, write: Callable[[], Any]) -> None:
        t0 = time.perf_counter()
        write()
        if self.par.is_main:
            prune_checkpoints(self.store, self.keep, written=step)
        log.info("checkpoint %d written in %.2f s (in the background)", step, time.perf_counter() - t0)

    def check(self) -> None:
        """Raise here, in the trainer's thread, if the last write failed."""
        if self._pending is not None and self._pending[1].done():
            self.wait()

    def wait(self) -> None:
        if self._pending is None:
            return
        step, future = self._pending
        self._pending = None
        try:
            future.result()
        except Exception as e:
            raise RuntimeError(f"writing checkpoint {step} failed: {e}") from e

    def close(self, failed: bool = False) -> None:
        """Finish the write in flight (a finished step's state is worth keeping even when the trainer
        is failing; then its error is logged, not raised over the one that ends the trainer)."""
        try:
            self.wait()
        except Exception:
            if not failed:
                raise
            log.exception("the checkpoint in flight was lost")
        finally:
            self._pool.shutdown(wait=False)


def prune_checkpoints(store: RunStore, keep: int, written: int | None = None) -> list[int]:
    """Keep the newest `keep` complete checkpoints (0 = all), and always the one a resume would use.

    The resume checkpoint is the newest that verifies; if the newest ones are corrupt it is older
    than the `keep` newest and survives anyway. `written` is a checkpoint the caller has just
    published (its files hashed as they were written): when it is the newest, it is the resume
    checkpoint, and nothing is read back to find that (re-hashing 6.7 GB took 7.5 s on an H100 host).
    """
    if keep <= 0:
        return []
    steps = store.complete_steps(layout.CHECKPOINTS)
    if len(steps) <= keep:
        return prune_steps(store, layout.CHECKPOINTS, keep)
    if written is not None and written == steps[-1]:
        return prune_steps(store, layout.CHECKPOINTS, keep, protect=written)
    resume = latest_checkpoint(store)
    return prune_steps(store, layout.CHECKPOINTS, keep, protect=None if resume is None else resume["step"])


class HostCopy:
    """Host memory for a sharded trainer state (each rank's shards of the model and optimizer),
    made once (at start-up: `CheckpointManager.prepare`) and refilled at every checkpoint, as
    torchtitan's async checkpoints do; `pinned` on a GPU, where the copy is a DMA. Allocating it
    afresh for every checkpoint (5 GB of pinned memory at the 0.5B shape) held each checkpoint step
    ~2 s longer on an H100 than the copy itself."""

    def __init__(self, pinned: bool):
        self.pinned = pinned
        self._buffers: dict[str, Any] | None = None

    @property
    def allocated(self) -> bool:
        return self._buffers is not None

    def allocate(self, state: dict[str, Any]) -> None:
        """Buffers shaped like `state`, in few allocations (host_state.py says why)."""
        self._buffers = host_like(state, self.pinned)

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


def _cpu_copy(obj: Any) -> Any:
    """A deep copy of a (nested) state dict with every tensor copied to CPU memory."""
    from torch.utils._pytree import tree_map

    return tree_map(lambda x: x.detach().to("cpu", copy=True) if isinstance(x, torch.Tensor) else x, obj)


def _trainer_state_options() -> Any:
    """The trained parameters only: frozen ones (a LoRA base) come from `model.path` on a resume.
    Full fine-tuning freezes nothing, so there it is the whole model."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(ignore_frozen_params=True, strict=False)


def _trainable(lm: torch.nn.Module, sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The entries of `sd` that are `lm`'s trained parameters; all of them must be there."""
    names = [n for n, p in lm.named_parameters() if p.requires_grad]
    if missing := [n for n in names if n not in sd]:
        raise ValueError(f"the checkpoint lacks {len(missing)} trained parameters: {missing[:4]}")
    return {n: sd[n] for n in names}


def _read(store: RunStore, rel: str, device: torch.device | str = "cpu") -> dict[str, Any]:
    return torch.load(io.BytesIO(store.read_bytes(rel)), map_location=device, weights_only=True)


def _local_copy(store: RunStore, rel: str) -> Path:
    """Checkpoint `rel` on this machine: in place, or a verified copy of a remote store's."""
    return store.local_path(rel) if store.is_local else stage_locally(store, rel, keep=1)


def optimizer_steps(store: RunStore, rel: str) -> set[int]:
    """The optimizer step counts in checkpoint `rel` (one per trained tensor; a checkpoint of step N
    has taken N + 1), read from `optimizer.pt` or from the `optim.state.*.step` entries of `dcp/`,
    without a model or a process group: what a soak or an audit checks of a checkpoint."""
    if store.exists(f"{rel}/{layout.OPTIMIZER}"):
        opt = _read(store, f"{rel}/{layout.OPTIMIZER}")
        return {int(v["step"]) for v in opt["state"].values()}
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    path = str(_local_copy(store, rel) / layout.DCP)
    meta = dcp.FileSystemReader(path).read_metadata().state_dict_metadata
    steps = {
        k: torch.empty(m.size, dtype=m.properties.dtype)
        for k, m in meta.items()
        if k.startswith("optim.state.") and k.endswith(".step") and isinstance(m, TensorStorageMetadata)
    }
    if not steps:
        raise ValueError(f"{rel}: no optimizer state in optimizer.pt or dcp/")
    dcp.load(steps, checkpoint_id=path)
    return {int(t) for t in steps.values()}


def dcp_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_sd, optim_sd = get_state_dict(
        hf_export.hf_model(model), optimizer, options=_trainer_state_options()
    )
    return {"model": model_sd, "optim": optim_sd}
