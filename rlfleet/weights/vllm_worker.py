"""rlfleet's methods inside each vLLM worker (`--worker-extension-cls`), reached by
`POST /collective_rpc {"method": "rlfleet_load", "args": [<ticket JSON>]}` on every worker: every
transport's ticket, the filesystem's included, becomes (name, tensor) pairs by its receiver
(`RECEIVE`) and ends in `vllm_reload.reload_in_place`.

Loaded inside vLLM's worker processes: it imports this package's transport modules (torch and
rlfleet's engine packages), never Prefect.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable
from typing import Any

import torch

Weights = Iterable[tuple[str, torch.Tensor]]


class WeightSync:
    """Mixed into vLLM's Worker: `self.device`, `self.rank` and `self.model_runner` are vLLM's."""

    def rlfleet_load(self, ticket_json: str, rank_base: str = "1") -> dict[str, Any]:
        """Load a ticket's weights in place (`vllm_reload.reload_in_place`, for every transport)."""
        from rlfleet.weights.vllm_reload import reload_in_place

        ticket = json.loads(ticket_json)
        if (receive := RECEIVE.get(ticket["transport"])) is None:
            raise ValueError(f"rlfleet_load: unknown transport {ticket['transport']!r}")
        t0 = time.perf_counter()
        device = getattr(self, "device", torch.device("cpu"))
        weights = receive(self, ticket, int(rank_base), device)
        got = time.perf_counter()
        reload_in_place(self.model_runner.model, self.model_config, weights)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return {"step": ticket["step"], "transfer_s": got - t0, "load_s": time.perf_counter() - got}

    def _rlfleet_files(self, path: str):
        """The HF files at `path` as vLLM's loader reads them: what its own `reload_weights` does
        with a `weights_path`, model config included."""
        from vllm.model_executor.model_loader import get_model_loader

        mc = self.model_config
        mc.model, mc.model_weights, mc.revision = path, "", None
        return get_model_loader(self.load_config).get_all_weights(mc, self.model_runner.model)

    def rlfleet_params(self) -> dict[str, list]:
        """Every parameter and buffer of the served model: name -> [shape, dtype, sha1 of its
        bytes]. A load keeps names, shapes and dtypes as vLLM's own loader built them, and the
        bytes too when the weights are the same (tests/archmatrix.py)."""
        import hashlib

        model = self.model_runner.model
        out = {}
        for name, t in [*model.named_parameters(), *model.named_buffers()]:
            data = t.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8)
            out[name] = [
                list(t.shape),
                str(t.dtype).removeprefix("torch."),
                hashlib.sha1(data.numpy()).hexdigest(),
            ]
        return out

    def _rlfleet_group(self, ticket: dict[str, Any], rank_base: int, device: torch.device):
        """This worker's member of the trainer's group; rebuilt when a new trainer names a new one."""
        from rlfleet.weights.nccl import SenderDied, open_group
        from rlfleet.weights.tickets import sender_running

        g = ticket["group"]
        cached = getattr(self, "_rlfleet_pg", None)
        if cached is None or cached[0] != g["id"]:
            if not sender_running(
                ticket
            ):  # its rendezvous store went with it: connecting would wait out the timeout
                raise SenderDied(
                    f"the trainer (pid {g['pid']}) that wrote the step {ticket['step']} ticket exited"
                )
            if cached is not None:
                cached[1].pg.abort()  # the previous trainer's group; its sender is gone
            rank = rank_base + getattr(self, "rank", 0)
            pg = open_group(g["host"], g["port"], rank, g["world"], device, ticket["timeout_s"])
            self._rlfleet_pg = (g["id"], pg)
        return self._rlfleet_pg[1]


def _files(worker: WeightSync, ticket: dict[str, Any], rank_base: int, device: torch.device) -> Weights:
    return worker._rlfleet_files(ticket["path"])  # read lazily, as the load consumes them


def _cuda_ipc(worker: WeightSync, ticket: dict[str, Any], rank_base: int, device: torch.device) -> Weights:
    from rlfleet.weights.cuda_ipc import open_buffers
    from rlfleet.weights.tensors import views

    return views(open_buffers(ticket, device), ticket["layout"])


def _nccl(worker: WeightSync, ticket: dict[str, Any], rank_base: int, device: torch.device) -> Weights:
    from rlfleet.weights.nccl import receive
    from rlfleet.weights.tensors import views

    group = worker._rlfleet_group(ticket, rank_base, device)
    try:
        buckets = receive(ticket, group, device)
    except BaseException:
        worker._rlfleet_pg = None  # aborted or broken: the next ticket builds a new one
        raise
    return views(buckets, ticket["layout"])


# How each transport's ticket becomes (name, tensor) pairs in this worker: the vLLM side of the seam.
RECEIVE: dict[str, Callable[[WeightSync, dict[str, Any], int, torch.device], Weights]] = {
    "filesystem": _files,
    "cuda_ipc": _cuda_ipc,
    "nccl": _nccl,
}
