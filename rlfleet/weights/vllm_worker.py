"""rlfleet's methods inside each vLLM worker (`--worker-extension-cls`), reached by
`POST /collective_rpc {"method": "rlfleet_load", "args": [<ticket JSON>]}` on every worker.

Loaded inside vLLM's worker processes: it imports this package's transport modules (torch and
rlfleet's engine packages), never Prefect.
"""

from __future__ import annotations

import json
import time
from typing import Any

import torch


class WeightSync:
    """Mixed into vLLM's Worker: `self.device`, `self.rank` and `self.model_runner` are vLLM's."""

    def rlfleet_load(self, ticket_json: str, rank_base: str = "1") -> dict[str, Any]:
        ticket = json.loads(ticket_json)
        t0 = time.perf_counter()
        device = getattr(self, "device", torch.device("cpu"))
        if ticket["transport"] == "cuda_ipc":
            from rlfleet.weights.cuda_ipc import open_buffers

            buckets = open_buffers(ticket, device)
        elif ticket["transport"] == "nccl":
            from rlfleet.weights.nccl import receive

            group = self._rlfleet_group(ticket, int(rank_base), device)
            try:
                buckets = receive(ticket, group, device)
            except BaseException:
                self._rlfleet_pg = None  # aborted or broken: the next ticket builds a new one
                raise
        else:
            raise ValueError(f"rlfleet_load: unknown transport {ticket['transport']!r}")
        got = time.perf_counter()
        from vllm.model_executor.model_loader.reload import (
            finalize_layerwise_reload,
            initialize_layerwise_reload,
        )

        from rlfleet.weights.tensors import views

        # vLLM's own weight-update path (what its weight-transfer engines call around load_weights)
        model = self.model_runner.model
        initialize_layerwise_reload(model)
        model.load_weights(views(buckets, ticket["layout"]))
        finalize_layerwise_reload(model, self.model_config)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        del buckets
        return {"step": ticket["step"], "transfer_s": got - t0, "load_s": time.perf_counter() - got}

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
