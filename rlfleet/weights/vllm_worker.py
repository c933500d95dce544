"""rlfleet's methods inside each vLLM worker (`--worker-extension-cls`), reached by
`POST /collective_rpc {"method": "rlfleet_load", "args": [<ticket JSON>]}` on every worker: every
transport's ticket, the filesystem's included, becomes (name, tensor) pairs by its transport's
receiver (the registry's `receiver`, config/weights.py) and ends in `vllm_reload.reload_in_place`.

Loaded inside vLLM's worker processes: it imports this package's transport modules (torch and
rlfleet's engine packages), never Prefect.
"""

from __future__ import annotations

import json
import time
from typing import Any

import torch

from rlfleet.config.weights import transport_config


class WeightSync:
    """Mixed into vLLM's Worker: `self.device`, `self.rank` and `self.model_runner` are vLLM's."""

    def rlfleet_load(self, ticket_json: str, rank_base: str = "1") -> dict[str, Any]:
        """Load a ticket's weights in place (`vllm_reload.reload_in_place`, for every transport)."""
        from rlfleet.weights.vllm_reload import reload_in_place

        ticket = json.loads(ticket_json)
        receive = transport_config(ticket["transport"]).part("receiver")
        t0 = time.perf_counter()
        device = getattr(self, "device", torch.device("cpu"))
        weights = receive(self, ticket, int(rank_base), device)
        got = time.perf_counter()
        reload_in_place(self.model_runner.model, self.model_config, weights)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return {"step": ticket["step"], "transfer_s": got - t0, "load_s": time.perf_counter() - got}

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
