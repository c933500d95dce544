"""Checkpoints written in the background, so a checkpoint step costs the trainer a copy, not a write.

The state is copied to CPU memory in the trainer's thread, between two optimizer steps, so it is
exactly step N's; one worker thread then writes the files, publishes the manifest and prunes old
checkpoints while the next steps train. One checkpoint is in flight at a time: the next one, the
last step's and the end of the run wait for it. A write that fails raises in the trainer's thread
at its next step, and the trainer dies as after any other error: the controller relaunches it from
the previous complete checkpoint and the relaunch is recorded. A trainer killed mid-write leaves an
unpublished staging dir, which a resume ignores and pruning removes.
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import torch

from rlfleet.store import RunStore
from rlfleet.trainer.checkpoint import HostCopy, dcp_state, prune_checkpoints, snapshot_checkpoint
from rlfleet.trainer.parallel import Parallel
from rlfleet.trainer.train import init_optimizer_state

log = logging.getLogger("rlfleet.checkpoint")


class Checkpointer:
    def __init__(self, store: RunStore, tokenizer_dir: str, keep: int, par: Parallel):
        self.store, self.tokenizer_dir, self.keep, self.par = store, tokenizer_dir, keep, par
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="rlfleet-checkpoint")
        self._pending: tuple[int, Future] | None = None
        self._group = None
        self._host = HostCopy(pinned=par.device.type == "cuda")
        if par.enabled:  # DCP's collectives run in the worker thread: never on the training group
            import torch.distributed as dist

            self._group = dist.new_group(backend="gloo")

    def prepare(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> float:
        """Make the host buffers of a sharded state at start-up, while vLLM starts; seconds spent.

        Allocating them (5 GB of pinned memory at the 0.5B shape on an H100, 4.2 s) held the first
        checkpoint step as long, and beside the first training steps slowed each of them ~2x. The
        optimizer's state is created first, as its first step would create it."""
        if not self.par.enabled or self._host.allocated:
            return 0.0
        t0 = time.perf_counter()
        init_optimizer_state(optimizer)
        self._host.allocate(dcp_state(model, optimizer))
        return time.perf_counter() - t0

    def save(
        self, step: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer, cursor: dict[str, Any]
    ) -> float:
        """Snapshot step `step` and start writing it; the seconds the caller spent (waiting for the
        previous write, then copying)."""
        t0 = time.perf_counter()
        self.wait()
        t1 = time.perf_counter()
        write = snapshot_checkpoint(
            self.store, step, model, optimizer, cursor, self.tokenizer_dir, self.par, self._group, self._host
        )
        self._pending = (step, self._pool.submit(self._write, step, write))
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
        return time.perf_counter() - t0

    def _write(self, step: int, write: Any) -> None:
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
