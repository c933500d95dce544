"""What the test modules share, and probes the tests use and the package does not.

- ports and configs: `free_port`, `rl_config` (the tiny RL job), `example_config` (the tiny SFT job);
- a run as Prefect and its store see it: `flow_run`, `wait_final`, `task_runs`, `task_run_names`,
  `assert_every_step_once`, `assert_no_process_left`; a fault to inject: `KillWhen`;
- probes: a vLLM logprob fingerprint, a dataset's NLL, `sbatch --test-only`, the ranks that wrote
  a DCP checkpoint, random trajectories, a trajectory as the rollout stream buffers it.

Test modules import from here, never from each other. torch, transformers, Prefect and most of
rlfleet are imported inside the functions that use them: conftest imports this module (`free_port`),
and a test that needs none of them should not pay for them.
"""

from __future__ import annotations

import contextvars
import os
import random
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING
from uuid import UUID

from rlfleet.procs import pid_alive

if TYPE_CHECKING:
    import uvicorn
    from transformers import PreTrainedModel

    from rlfleet.config.fleet import FleetConfig
    from rlfleet.config.models import RLConfig, SFTConfig
    from rlfleet.trainer.sft_data import Example

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "tiny"


def read_text(path: Path) -> str | None:
    """The file's text, or None while it does not exist (for `wait_until` on a file another process writes)."""
    try:
        return path.read_text()
    except OSError:
        return None


def free_port() -> int:
    """A loopback port free now, below Linux's ephemeral range (32768-60999): a port the kernel hands
    out for port 0 is also what it gives the suite's outgoing connections as their source ports, and
    one of those took a port a test had picked for a vLLM it started a moment later (EADDRINUSE)."""
    rng = random.Random()  # its own OS-seeded stream: tests that seed `random` still get spread ports
    for _ in range(200):
        port = rng.randrange(20000, 32000)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free loopback port in 20000-32000")


def serve_app(app) -> tuple[str, uvicorn.Server]:
    """An ASGI app on a free loopback port, served by a daemon thread: (its URL, the server; set
    `should_exit` to stop it). Returns once it accepts connections."""
    import uvicorn

    from rlfleet.procs import wait_until

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error"))
    threading.Thread(target=server.run, daemon=True).start()
    wait_until(lambda: server.started, 10, 0.02, "the test server to start")
    return f"http://127.0.0.1:{port}", server


def rl_config(
    model: Path, out: Path, max_steps: int, files: tuple[Path, ...] = (), **overrides: str
) -> RLConfig:
    from rlfleet.config.loader import load
    from rlfleet.config.models import RLConfig

    args = [arg for f in files for arg in ("@", str(f))] + [
        "--model.path",
        str(model),
        "--output-dir",
        str(out),
        "--max-steps",
        str(max_steps),
        "--orchestrator.batch-size",
        "4",
        "--orchestrator.group-size",
        "4",
        "--orchestrator.max-tokens",
        "8",
        "--trainer.lr",
        "1e-2",
        "--trainer.checkpoint-interval",
        "1",
        "--inference.port",
        str(free_port()),
        "--inference.max-model-len",
        "128",
        "--wandb.mode",
        "offline",
        "--tasks.retries",
        "1",
    ]
    for k, v in overrides.items():
        args += [f"--{k}", v]
    return load(RLConfig, args)


def fleet_config(model: Path, port: int, **inference) -> FleetConfig:
    """Fleet "t" of `model`, its replicas from `port` (test_fleet*.py)."""
    from rlfleet.config.fleet import FleetConfig
    from rlfleet.config.inference import InferenceConfig
    from rlfleet.config.model import ModelConfig

    return FleetConfig(
        name="t", model=ModelConfig(path=str(model)), inference=InferenceConfig(port=port, **inference)
    )


def example_config(tiny_model: Path, out: Path, *extra: str) -> SFTConfig:
    """The embedded default (examples/tiny/sft.toml) on the session's tiny model."""
    from rlfleet.config.loader import load
    from rlfleet.config.models import SFTConfig

    return load(
        SFTConfig,
        [
            "@",
            str(EXAMPLE / "sft.toml"),
            "--model.path",
            str(tiny_model),
            "--output-dir",
            str(out),
            "--data.path",
            str(EXAMPLE / "sft_repeat.jsonl"),
            *extra,
        ],
    )


def flow_run(run_id: UUID):
    from prefect import get_client

    with get_client(sync_client=True) as client:
        return client.read_flow_run(run_id)


def wait_final(run_id: UUID, timeout_s: float = 600, after: float = 0.0):
    """The flow run once it is final (and, with `after`, finished later than that time)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        run = flow_run(run_id)
        if run.state.is_final() and (run.end_time is None or run.end_time.timestamp() > after):
            return run
        time.sleep(2)
    raise TimeoutError(f"flow run {run_id} not final after {timeout_s} s: {flow_run(run_id).state}")


def flow_run_logs(*run_ids) -> list:
    """What the Prefect UI shows of these flow runs' logs (log entries, oldest first), once the
    queued ones have been shipped: not the console, whose format depends on what ran before."""
    from prefect import get_client
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId
    from prefect.logging.handlers import APILogWorker

    APILogWorker.drain_all(timeout=10)
    with get_client(sync_client=True) as client:
        return client.read_logs(log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=list(run_ids))))


def task_runs(flow_run_id) -> list:
    """Every task run of a flow run, oldest first."""
    from prefect import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    with get_client(sync_client=True) as client:
        runs = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))
    return sorted(runs, key=lambda t: t.created)


async def task_run_names(flow_run_id) -> set[str]:
    from prefect import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    async with get_client() as client:
        runs = await client.read_task_runs(
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id]))
        )
    return {r.name for r in runs}


def assert_every_step_once(out: Path, max_steps: int) -> None:
    from rlfleet.store import RunStore
    from rlfleet.trainer.checkpoint import optimizer_steps

    store = RunStore(out)
    assert store.complete_steps("rollouts") == list(range(max_steps))
    assert store.complete_steps("batches") == list(range(max_steps))
    for s in range(max_steps):
        assert store.manifest(f"rollouts/step_{s}", verify=True)["policy_step"] == s - 1
        assert (out / f"metrics/step_{s}.json").is_file()
    # optimizer.pt, or dcp/ where the trainer runs under FSDP2 (every GPU run)
    final = optimizer_steps(store, f"checkpoints/step_{max_steps - 1}")
    assert final == {max_steps}, "optimizer steps in the final lineage"


def assert_no_process_left(out: Path) -> None:
    for pidfile in (out / "run").glob("*.pid"):
        assert pid_alive(pidfile) is None, f"{pidfile.name} still running"


class KillWhen(threading.Thread):
    """Once `trigger` exists, SIGKILL the process group a pidfile names; remember when. With
    `then`, the group is frozen (SIGSTOP) at the trigger and killed once `then()` is true, so
    it dies after whatever `then` waits for and before it could finish its own work."""

    def __init__(self, trigger: Path, pidfile: Path, then: Callable[[], bool] | None = None):
        super().__init__(daemon=True)
        self.trigger, self.pidfile, self.then = trigger, pidfile, then
        self.killed_at: float | None = None  # wall clock, comparable with file mtimes
        self.pid: int | None = None
        self.errors: list[str] = []  # what `then` raised
        self.context = contextvars.copy_context()  # Prefect's settings (its API URL) live in contextvars

    def run(self) -> None:
        deadline = time.monotonic() + 600
        while not self.trigger.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        self.pid = pid_alive(self.pidfile)
        if self.pid is None:
            return
        try:
            if self.then is not None:
                os.killpg(self.pid, signal.SIGSTOP)
                until = time.monotonic() + 120  # never leave it frozen: the run would hang
                while not self._then():
                    if time.monotonic() > until:
                        self.errors.append("`then` was not true within 120 s")
                        break
                    time.sleep(0.05)
        finally:
            os.killpg(self.pid, signal.SIGKILL)
            self.killed_at = time.time()

    def _then(self) -> bool:
        try:
            return bool(self.context.run(self.then))
        except Exception as e:  # noqa: BLE001 - a failed look is a "not yet", remembered for the test
            self.errors.append(repr(e))
            return False


def prompt_logprobs(
    url: str, prompt_ids: list[int], timeout_s: float = 60.0, model: str = "policy"
) -> list[float]:
    """The server's logprob of each prompt token after the first: a fingerprint of its weights."""
    import httpx

    from rlfleet.net import tls

    resp = httpx.post(
        f"{url}/v1/completions",
        json={
            "model": model,
            "prompt": prompt_ids,
            "max_tokens": 1,
            "temperature": 0.0,
            "prompt_logprobs": 0,
        },
        timeout=timeout_s,
        verify=tls(),
    )
    resp.raise_for_status()
    entries = resp.json()["choices"][0]["prompt_logprobs"][1:]
    return [entry[str(tok)]["logprob"] for entry, tok in zip(entries, prompt_ids[1:], strict=True)]


def evaluate_nll(
    model: PreTrainedModel, examples: list[Example], pad: int, micro_batch_size: int = 32
) -> float:
    """Token-mean NLL of `model` on `examples` over their loss tokens (no update)."""
    import torch

    from rlfleet.trainer.lm_head import token_logprobs
    from rlfleet.trainer.nll import num_targets, sft_loss
    from rlfleet.trainer.sft_data import micro_batches

    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    batches = micro_batches(examples, micro_batch_size, pad)
    n = num_targets(batches)
    total = 0.0
    with torch.no_grad():
        for mb in batches:
            ids = mb["input_ids"].to(device)
            logits = model(input_ids=ids).logits[:, :-1]
            total += float(sft_loss(token_logprobs(logits, ids[:, 1:]), mb["loss_mask"][:, 1:].to(device), n))
    model.train(was_training)
    return total


def dataset_nll(model_path: str, cfg: SFTConfig, device: str = "cpu") -> float:
    """NLL of the model at `model_path` on the whole configured dataset (for before/after checks)."""
    import torch
    from transformers import AutoTokenizer

    from rlfleet.trainer.sft_data import encode, load_dataset, pad_id
    from rlfleet.trainer.train import load_model

    tok = AutoTokenizer.from_pretrained(model_path)
    ds = load_dataset(cfg.data)
    examples = [encode(tok, row, ds.format, cfg.data.max_seq_len) for row in ds.rows]
    model = load_model(model_path, cfg.model.dtype, torch.device(device))
    return evaluate_nll(model, examples, pad_id(tok), cfg.data.micro_batch_size)


def sbatch_test_only(script: str, env: dict[str, str] | None = None) -> str:
    """`sbatch --test-only`: validates the script and says where it would start; submits nothing."""
    proc = subprocess.run(
        ["sbatch", "--test-only", script], capture_output=True, text=True, env=env, timeout=60
    )
    assert proc.returncode == 0, proc.stderr or proc.stdout
    return (proc.stdout + proc.stderr).strip()


def dcp_ranks(dcp_dir: Path) -> set[int]:
    """The ranks with shard files in a DCP checkpoint (DCP names them `__<rank>_<file>.distcp`)."""
    return {int(p.name.split("_")[2]) for p in Path(dcp_dir).glob("*.distcp")}


def random_records(
    n: int,
    seed: int = 0,
    advantage: Callable[[random.Random, int], float] = lambda rng, i: rng.uniform(-1, 1),
) -> list[dict]:
    """Trajectories of 3-20 tokens over ids 3..127 in groups of 4 (padded micro-batches carry a lot of
    padding); `advantage(rng, i)` gives the i-th its advantage."""
    from rlfleet.orchestrator.rollout import single_turn

    rng = random.Random(seed)
    out = []
    for i in range(n):
        prompt = [1] + [rng.randrange(3, 128) for _ in range(rng.randint(1, 8))]
        completion = [rng.randrange(3, 128) for _ in range(rng.randint(1, 12))]
        logprobs = [-rng.uniform(0.5, 5.0) for _ in completion]
        out.append(
            {"group": i // 4, **single_turn(prompt, completion, logprobs), "advantage": advantage(rng, i)}
        )
    return out


def buffered_groups(store) -> set[str]:
    """The uids of the groups the rollout stream holds in `store`'s buffer (test_stream*.py)."""
    from rlfleet.store import layout

    return {layout.group_uid(p) for p in store.fs.glob(store.path(layout.buffered_group("*")))}


def stream_record(version: int, newest: int | None = None, reward: float = 0.5) -> dict:
    """One sampled trajectory as the rollout stream buffers it, its tokens from weights
    `version` .. `newest` (a load in flight)."""
    from rlfleet.orchestrator.rollout import single_turn

    newest = version if newest is None else newest
    runs = [[version, 2]] + ([[newest, 2]] if newest != version else [])
    return single_turn([1, 5, 6], [7, 8, 9, 10], [-1.0] * 4) | {
        "group": 0,
        "env": "repeat",
        "example_uid": "x",
        "reward": reward,
        "metrics": {},
        "error": None,
        "policy_step": version,
        "policy_step_max": newest,
        "truncated": False,
        "turns": [{"versions": runs}],
        "messages": None,
        "completion": "abcd",
    }
