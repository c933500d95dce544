"""The cuda_ipc transport: vLLM maps the trainer's GPU memory instead of reading files.

Every trainer rank keeps two flat buffers on its GPU (one extra copy of the weights in vLLM's
dtype each) and writes step N into buffer N % 2, after the controller acknowledged step N-1
(`tickets.wait_served`): the buffer it overwrites then holds N-2, which no replica needs, and the
other still holds what the replicas serve, so a relaunched replica can load it again. Under FSDP2
each rank already has the full tensors on its own GPU after the export's gather (`sent_state`), so
each fills its own buffers: colocated on N GPUs (config/placement.py), every vLLM worker maps
those of the trainer rank on its GPU. Rank 0 writes the one ticket: per GPU (by UUID) the IPC
handles of its buffers (made once per buffer, gathered from the ranks once), and the layout.
A trainer's first two publishes fill buffers no ticket has named yet, so they wait for nothing:
a relaunched trainer, or a resumed run's, whose replicas were relaunched too, never waits on an
acknowledgement its own buffers cannot need.
"""

from __future__ import annotations

import base64
import pickle
from collections.abc import Iterator, Mapping
from typing import Any

import torch

from rlfleet.config.dtypes import torch_dtype
from rlfleet.config.models import TrainerJobConfig
from rlfleet.config.weights import CudaIpcConfig
from rlfleet.store import RunStore
from rlfleet.trainer.hf_export import sent_state
from rlfleet.trainer.parallel import Parallel
from rlfleet.weights import tensors
from rlfleet.weights.publisher import vllm_dtype
from rlfleet.weights.tickets import ticket_rel, wait_served

SLOTS = CudaIpcConfig.trainer_copies


class IpcPublisher:
    def __init__(self, store: RunStore, par: Parallel, dtype: str, timeout_s: float):
        if par.device.type != "cuda":
            raise ValueError("weights.transport: cuda_ipc needs the trainer on a GPU")
        self.store, self.par, self.dtype, self.timeout_s = store, par, torch_dtype(dtype), timeout_s
        self.layout: list | None = None
        self.slots: list[list[torch.Tensor]] = []
        self.devices: list[list[dict[str, Any]]] = []  # per slot: every rank's GPU and its handles
        self.first_step: int | None = None  # this trainer's first publish

    def _allocate(self, sd: Mapping[str, torch.Tensor]) -> None:
        from torch.multiprocessing.reductions import reduce_tensor

        self.layout = tensors.make_layout(sd, self.dtype)
        sizes = tensors.bucket_sizes(self.layout)
        mine = []  # per slot: this rank's handles
        for _ in range(SLOTS):
            bufs = [torch.empty(n, dtype=self.dtype, device=self.par.device) for n in sizes]
            self.slots.append(bufs)
            mine.append([base64.b64encode(pickle.dumps(reduce_tensor(b)[1])).decode() for b in bufs])
        uuid = str(torch.cuda.get_device_properties(self.par.device).uuid)
        ranks = self.par.gather((uuid, mine))  # once: the buffers live as long as the trainer
        self.devices = [
            [{"gpu": gpu, "handles": handles[slot]} for gpu, handles in ranks] for slot in range(SLOTS)
        ]

    def publish(self, step: int, model: torch.nn.Module) -> None:
        sd = sent_state(model, self.par)
        if self.layout is None:
            self._allocate(sd)
            self.first_step = step
        assert self.first_step is not None
        if step - SLOTS >= self.first_step:  # the buffer we overwrite holds step-2, which we published
            wait_served(self.store, step - 1, self.timeout_s)
        slot = step % SLOTS
        tensors.fill(self.slots[slot], self.layout, sd)
        torch.cuda.synchronize(self.par.device)
        self.par.barrier()  # every rank's buffer is filled before the ticket says so
        if not self.par.is_main:
            return
        ticket: dict[str, Any] = {
            "transport": "cuda_ipc",
            "step": step,
            "slot": slot,
            "devices": self.devices[slot],
            "layout": self.layout,
        }
        self.store.write_json(ticket_rel(step), ticket)

    def serve(self, step: int) -> None:
        """Nothing to do: vLLM reads the buffer when the controller hands it the ticket."""

    def poll(self) -> None:
        """Nothing to answer: a relaunched replica maps the buffer the replicas serve."""

    def close(self) -> None:
        self.slots.clear()


def publisher(cfg: TrainerJobConfig, store: RunStore, par: Parallel) -> IpcPublisher:
    return IpcPublisher(store, par, vllm_dtype(cfg, par), cfg.weights.timeout_s)


def open_buffers(ticket: dict[str, Any], device: torch.device) -> list[torch.Tensor]:
    """The trainer's buffers of `ticket`, mapped into this (vLLM worker) process on `device`."""
    from torch.multiprocessing.reductions import rebuild_cuda_tensor

    uuid = str(torch.cuda.get_device_properties(device).uuid)
    out = []
    for handle in device_handles(ticket, uuid):
        args = list(pickle.loads(base64.b64decode(handle)))
        args[6] = device.index  # reduce_tensor's device slot: ours, in our CUDA_VISIBLE_DEVICES numbering
        out.append(rebuild_cuda_tensor(*args))
    return out


def device_handles(ticket: dict[str, Any], gpu: str) -> list[str]:
    """The handles of the trainer rank's buffers on GPU `gpu` (a UUID): the one a vLLM worker on
    that GPU maps. None there is a placement the controller should have refused."""
    for d in ticket["devices"]:
        if d["gpu"] == gpu:
            return d["handles"]
    have = [d["gpu"] for d in ticket["devices"]]
    raise RuntimeError(
        f"cuda_ipc: no trainer rank holds weights on this vLLM worker's GPU {gpu}; they are on {have}"
    )


def worker_receive(
    worker: Any, ticket: dict[str, Any], rank_base: int, device: torch.device
) -> Iterator[tuple[str, torch.Tensor]]:
    """A vLLM worker's views of the trainer's buffers, by name."""
    return tensors.views(open_buffers(ticket, device), ticket["layout"])
