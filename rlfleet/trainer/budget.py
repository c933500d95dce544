"""A GPU trainer's micro-batches by tokens, sized at its first batch (config/sizing.py says why
the trainer, not the orchestrator, decides): a probe of the memory a row costs beside vLLM, as many
rows' worth of tokens as fit without activation checkpointing (at most the cap), checkpointing
(selective, then full) only when not one row fits without it, a refusal naming the field when one
row does not fit even with full checkpointing."""

from __future__ import annotations

import logging
from typing import Any

import torch

from rlfleet.config.dtypes import torch_dtype
from rlfleet.config.models import TrainerJobConfig
from rlfleet.config.sizing import GIB, Sizing, row_groups, size_micro_batch
from rlfleet.errors import DeterministicError
from rlfleet.microbatches import flat_rows, regroup_rows
from rlfleet.trainer.parallel import Parallel, apply_activation_checkpointing
from rlfleet.trainer.train import Policy, free_memory, init_optimizer_state, probe_row

log = logging.getLogger("rlfleet.trainer")


# The probe's short row: its cost per token, scaled to a full row, decides activation
# checkpointing before a full row (which might not fit) runs.
SHORT_ROW = 1024
# GPU memory a process beside this trainer takes while it trains: a fleet's next warm trainer,
# compiling on the same GPU (fleet/warm.py). The sizing leaves it free.
_beside_bytes = 0


def leave_free(nbytes: int) -> None:
    """Size micro-batches leaving `nbytes` of the GPU to a process that allocates them later."""
    global _beside_bytes
    _beside_bytes = nbytes


class TokenBudget:
    """A GPU trainer's micro-batches by tokens (config/sizing.py says why the trainer does it).

    At the first batch of packed rows it fixes a micro-batch's tokens (`size`). Then, under varlen
    attention, each step's samples are repacked into one flat row a micro-batch (no padding,
    microbatches.py `flat_rows`); under eager attention (Gemma-2) whole rows are regrouped. A CPU
    trainer, unpacked sequences and sources that do not ask (SFT) keep the micro-batches they are
    given."""

    def __init__(
        self, cfg: TrainerJobConfig, par: Parallel, policy: Policy, optimizer: torch.optim.Optimizer
    ):
        self.cfg, self.par, self.policy, self.optimizer = cfg, par, policy, optimizer
        self.checkpointing = cfg.trainer.activation_checkpointing
        self.sizing: Sizing | None = None

    def micro_batches(
        self, micro: list[dict[str, torch.Tensor]], by_tokens: bool
    ) -> list[dict[str, torch.Tensor]]:
        """`micro` regrouped by tokens when `by_tokens` (a source's packed rows) on a GPU; else as given."""
        if not by_tokens or self.par.device.type != "cuda" or not micro or "position_ids" not in micro[0]:
            return micro
        width = micro[0]["input_ids"].shape[1]
        if self.sizing is None or self.sizing.row_tokens != width:
            self.sizing = self.size(width)
            torch.cuda.reset_peak_memory_stats(self.par.device)  # the steps' peaks, not the probe's
        if self.policy.varlen:  # no row width to keep: samples repacked into one row a micro-batch
            return flat_rows(micro, self.sizing.tokens, self.par.world)
        total = sum(len(m["input_ids"]) for m in micro)
        return regroup_rows(micro, row_groups(total, self.sizing.rows, self.par.world))

    def metrics(self, micro_batches: int) -> dict[str, Any]:
        """The step's micro-batching and the GPU's peak (what the sizing has to hold)."""
        if self.sizing is None:
            return {}
        peak = torch.cuda.max_memory_allocated(self.par.device)
        torch.cuda.reset_peak_memory_stats(self.par.device)
        return {
            "micro_batches": micro_batches,
            "micro_batch_tokens": self.sizing.tokens,
            "activation_checkpointing": self.checkpointing,
            "peak_memory_gib": round(peak / GIB, 2),
        }

    def size(self, width: int) -> Sizing:
        """Probe rows of `width` tokens and decide (the RNG is left as it was, gradients dropped).

        Fastest first: without activation checkpointing as many rows as fit (at most the cap), even
        if fewer than asked, since recomputing every layer costs ~1/3 more compute; only where not
        one row fits, selective checkpointing, then full; refused where one row does not fit even
        then."""
        par, policy, requested = self.par, self.policy, self.cfg.trainer.micro_batch_tokens
        init_optimizer_state(self.optimizer)  # as the first step would; checkpoint buffers may have already
        later = transport_bytes(self.cfg, policy) + _beside_bytes
        short = min(width, SHORT_ROW)
        with torch.random.fork_rng(devices=[par.device] if par.device.type == "cuda" else []):
            while True:
                policy.zero_grad(set_to_none=True)
                probe_row(policy, par, short, sync=False)  # a step's gradients, held from here on
                free = free_memory(par.device)
                fixed, per_token = self._line(short, width)
                guess = fixed + per_token * width
                guess, fixed, neg_free = par.max([float(guess), float(fixed), float(-free)])
                free, fixed = int(-neg_free), int(fixed)
                escalate = self.checkpointing != "full"
                if escalate and not size_micro_batch(free, int(guess), width, later, requested, fixed).fits:
                    self._checkpoint(f"{guess / GIB:.1f} GiB predicted a row of {width} tokens")
                    continue
                row = self._row(width, free)
                sizing = size_micro_batch(free, row, width, later, requested, fixed)
                if sizing.fits or not escalate:
                    break
                self._checkpoint(f"{row / GIB:.1f} GiB measured a row of {width} tokens")
        policy.zero_grad(set_to_none=True)
        if not sizing.fits:
            raise DeterministicError(too_big(sizing, self.checkpointing))
        if par.is_main:
            log.info(
                "micro-batches: %s; activation checkpointing %s; %s",
                "trainer.micro_batch_tokens as a cap" if requested else "sized to the free memory",
                self.checkpointing,
                sizing.line(),
            )
        return sizing

    def _line(self, short: int, width: int) -> tuple[int, float]:
        """(bytes once a micro-batch, bytes a token) from two short rows: a line through their
        peaks (the gathered parameters and workspaces do not grow with tokens; activations do)."""
        one = probe_row(self.policy, self.par, short, sync=False)
        if 2 * short > width:  # a small row: scaled whole, all of it per token
            return 0, one / short
        two = probe_row(self.policy, self.par, 2 * short, sync=False)
        per_token = max(0.0, (two - one) / short)
        return max(0, int(one - per_token * short)), per_token

    def _row(self, width: int, free: int) -> int:
        """A full row's measured peak (the step's last micro-batch: gradients reduced), the largest
        over the ranks; one that runs out of memory on a single rank reads as not fitting."""
        try:
            row = probe_row(self.policy, self.par, width, sync=True)
        except torch.OutOfMemoryError:
            if self.par.world > 1:
                raise
            self.policy.zero_grad(set_to_none=True)
            torch.cuda.empty_cache()
            row = free + 1
        return int(self.par.max([float(row)])[0])

    def _checkpoint(self, why: str) -> None:
        """The next mode that saves more memory: selective (keeps the matmul and attention outputs),
        then full."""
        self.checkpointing = "selective" if self.checkpointing == "none" else "full"
        apply_activation_checkpointing(self.policy, self.checkpointing)
        if self.par.is_main:
            log.info("activation checkpointing turned on (%s): %s, more than fits", self.checkpointing, why)


def transport_bytes(cfg: TrainerJobConfig, policy: Policy) -> int:
    """GPU memory the weight transport allocates at its first publish, after step 0's training:
    cuda_ipc's two slots, nccl's buckets, each a copy of the weights in vLLM's dtype."""
    copies = cfg.weights.trainer_copies
    dtype = torch_dtype(cfg.inference.vllm_dtype(cfg.model.dtype, True))
    return copies * sum(p.numel() for p in policy.parameters()) * dtype.itemsize


def too_big(sizing: Sizing, checkpointing: str) -> str:
    """Why the trainer refuses to start training: not one row fits; what to change."""
    return (
        f"orchestrator.seq_len: one packed row of {sizing.row_tokens} tokens does not fit the trainer's free "
        f"memory with activation checkpointing {checkpointing}: {sizing.line()}; lower "
        "inference.max_model_len, give vLLM less of a shared GPU (inference.gpu_memory_utilization), "
        "train LoRA adapters ([trainer.lora]) or add trainer GPUs"
    )
