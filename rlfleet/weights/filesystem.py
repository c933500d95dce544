"""The filesystem transport: `weights/step_N` as an HF model directory that vLLM reloads in place,
reading the files with its own loader. The controller's side (which directory a load names) is
`tickets.newest_weights`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from rlfleet.config.models import TrainerJobConfig
from rlfleet.store import RunStore, layout
from rlfleet.trainer import hf_export
from rlfleet.trainer.files import prune_steps
from rlfleet.trainer.parallel import Parallel
from rlfleet.weights.tickets import served_step


def publish_weights(
    store: RunStore, step: int, model: torch.nn.Module, tokenizer_dir: str, par: Parallel | None = None
) -> dict[str, Any]:
    """`weights/step_N`: the model as an HF directory (gathered on rank 0 when sharded)."""
    rel = layout.step_dir(layout.WEIGHTS, step)
    staged = hf_export.stage(store, rel, par)
    if (state := hf_export.full_state(model, par, cpu=True)) is not None:
        hf_export.write_hf(hf_export.hf_model(model), state, staged, tokenizer_dir)
    return hf_export.publish(store, staged, rel, {"step": step}, par)


class FilesystemPublisher:
    def __init__(self, store: RunStore, par: Parallel, tokenizer_dir: str, keep: int):
        self.store, self.par, self.tokenizer_dir, self.keep = store, par, tokenizer_dir, keep

    def publish(self, step: int, model: torch.nn.Module) -> None:
        publish_weights(self.store, step, model, self.tokenizer_dir, self.par)
        if self.par.is_main:
            # the newest `keep` snapshots, and every one from the served step on: a replica that
            # holds or loads it relaunches from its files (keep_weights = 1 pruned them under it)
            prune_steps(self.store, layout.WEIGHTS, self.keep, held=served_step(self.store))

    def serve(self, step: int) -> None:
        """Nothing to hand over: the replicas read the files when the controller asks them to."""

    def poll(self) -> None:
        """Nothing to answer: a relaunched replica reads the files."""

    def close(self) -> None:
        pass


def publisher(cfg: TrainerJobConfig, store: RunStore, par: Parallel) -> FilesystemPublisher:
    return FilesystemPublisher(store, par, cfg.model.path, cfg.trainer.keep_weights)


def worker_receive(
    worker: Any, ticket: dict[str, Any], rank_base: int, device: torch.device
) -> Iterable[tuple[str, torch.Tensor]]:
    """The HF files of `ticket` as vLLM's loader reads them, lazily as the load consumes them: what
    its own `reload_weights` does with a `weights_path`, model config included."""
    from vllm.model_executor.model_loader import get_model_loader

    mc = worker.model_config
    mc.model, mc.model_weights, mc.revision = ticket["path"], "", None
    return get_model_loader(worker.load_config).get_all_weights(mc, worker.model_runner.model)
