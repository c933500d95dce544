"""Who takes a GPU run's lease, and when its processes start (runs/early.py, workers/leases.py).

`rlfleet rl` starts vLLM and the trainer before Prefect's temporary server and the flow. On GPUs
their `gpu-<id>` slots bind only on a Prefect API that runs share: there the lease comes first,
and the flow, which leases the run's GPUs again, must not ask a second time (a 1-slot limit would
wait for itself). No GPU here: the placement names GPUs 4 and 5, and the processes are recorded
instead of started.
"""

from __future__ import annotations

import pytest
from prefect.settings import PREFECT_API_URL, temporary_settings

from rlfleet.config.loader import load
from rlfleet.config.models import RLConfig
from rlfleet.inference.pool import InferencePool
from rlfleet.runs.configs import resolve
from rlfleet.runs.early import early_start
from rlfleet.trainer.launch import TrainerProcess
from rlfleet.workers import leases
from tests.helpers import free_port

GPUS = ["4", "5"]


@pytest.fixture
def gpu_run(tiny_model, tmp_path, monkeypatch) -> tuple[RLConfig, list[tuple[str, object]]]:
    """A one-replica, one-rank run on GPUs 4 and 5; `events` records what starts, in order."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", ",".join(GPUS))
    cfg = load(
        RLConfig,
        ["--model.path", str(tiny_model), "--output-dir", str(tmp_path / "out")]
        + ["--inference.port", str(free_port())]
        + ["--deployment.num-inference-gpus", "1", "--deployment.num-train-gpus", "1"],
    )
    events: list[tuple[str, object]] = []
    monkeypatch.setattr(InferencePool, "start", lambda self: events.append(("vllm", self.cfg.gpu_ids)))
    monkeypatch.setattr(TrainerProcess, "ensure", lambda self: events.append(("trainer", self.cfg.gpu_ids)))
    monkeypatch.setattr(TrainerProcess, "stop", lambda self: None)
    return cfg, events


def test_a_gpu_run_without_a_shared_api_starts_before_its_lease(gpu_run, monkeypatch):
    """No PREFECT_API_URL: only the flow's own temporary server will hold the slots, so vLLM and
    the trainer start at once; the flow leases the GPUs afterwards, once."""
    cfg, events = gpu_run
    real_lease = leases.gpu_lease

    def recorded(gpus, timeout_s=None):
        events.append(("lease", sorted(gpus)))
        return real_lease([], timeout_s)  # nothing to hold without a server

    monkeypatch.setattr(leases, "gpu_lease", recorded)
    with temporary_settings(restore_defaults={PREFECT_API_URL}), early_start(cfg):
        assert events == [("vllm", ["4"]), ("trainer", ["5"])]
        with leases.run_lease(cfg.output_dir, resolve(cfg, ports=False)[1].gpus):  # the flow's
            assert events[2:] == [("lease", GPUS)]


def test_a_gpu_run_on_a_shared_api_leases_first_and_once(gpu_run, prefect_api, monkeypatch):
    """PREFECT_API_URL set: the run's slots are held before vLLM starts, the flow's own lease of
    the same GPUs returns at once (the run holds them), and they are free after the run."""
    from prefect.client.orchestration import get_client

    cfg, events = gpu_run
    leases.ensure_gpu_limits(GPUS)

    def held() -> list[int]:
        with get_client(sync_client=True) as client:
            return [client.read_global_concurrency_limit_by_name(f"gpu-{g}").active_slots for g in GPUS]

    recorded = InferencePool.start
    monkeypatch.setattr(
        InferencePool, "start", lambda self: (recorded(self), events.append(("slots", held())))
    )
    with early_start(cfg):
        assert events == [("vllm", ["4"]), ("slots", [1, 1]), ("trainer", ["5"])]
        # timeout: a safety net; a second ask of a 1-slot limit would wait for itself
        with leases.run_lease(cfg.output_dir, resolve(cfg, ports=False)[1].gpus, timeout_s=60):
            assert held() == [1, 1]
        assert held() == [1, 1]  # the flow's `with` gave back nothing the run holds
    assert held() == [0, 0]
