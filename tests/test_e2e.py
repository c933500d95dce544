"""End to end: real vLLM (CPU build) + the long-lived trainer + flow `rl` on a real Prefect API."""

from __future__ import annotations

import asyncio
import copy
import json
import os
import threading
import tomllib
from pathlib import Path

import pytest
import torch

from rlfleet.orchestrator.rollout import read_rollout, staleness
from rlfleet.orchestrator.sampler import Sample, Sampler
from rlfleet.store import RunStore
from rlfleet.store.records import (
    BatchManifest,
    RolloutManifest,
    StepRecord,
    TrainerMetrics,
    read_metrics,
    read_rollout_manifest,
)
from tests.helpers import free_port, prompt_logprobs, rl_config, task_run_names, task_runs
from tests.wandb_log import history_and_config

pytestmark = pytest.mark.e2e


def assert_readable_in_prefect(state, out: Path, summary: dict) -> None:
    """Run name, tags and final message tell runs apart; the graph's edges are the step's real
    dependencies; wandb has one key per metric, the Prefect run in its config, no wandb/wandb."""
    from prefect import get_client

    run_id = state.state_details.flow_run_id
    with get_client(sync_client=True) as client:
        run = client.read_flow_run(run_id)
    first, last = summary["first3_mean_reward"], summary["last3_mean_reward"]
    assert (
        run.name == "run" and state.message == f"reward {first:.3f} -> {last:.3f} in 2 steps; recoveries: 0"
    )
    assert {"env:repeat", "model:tiny", "deployment:single_node", "weights:filesystem"} <= set(run.tags)

    runs = task_runs(run_id)
    by_id = {r.id: r.name for r in runs}
    edges = {
        r.name: sorted(by_id.get(i.id, "?") for inputs in r.task_inputs.values() for i in inputs)
        for r in runs
    }
    assert edges == {
        "start_trainer": [],
        "launch_inference_pool": [],
        "rollout-0": ["launch_inference_pool"],
        "train-0": ["rollout-0"],
        "broadcast_weights-0": ["train-0"],
        "rollout-1": ["broadcast_weights-0"],
        "train-1": ["rollout-1"],
        "broadcast_weights-1": ["train-1"],
    }

    wandb_dir = Path(summary["wandb"])
    assert wandb_dir.parent == out / "wandb" and not (out / "wandb" / "wandb").exists()
    rows, config = history_and_config(wandb_dir)
    assert [r["_step"] for r in rows] == [0, 1]
    logged = {k for row in rows for k in row if not k.startswith("_")}
    assert all(k.split("/")[0] in {"train", "rollout", "timing", "eval"} for k in logged), logged
    assert {
        "train/loss",
        "train/grad_norm",
        "train/lr",
        "rollout/mean_reward",
        "timing/step_seconds",
    } <= logged
    assert not {"train/mean_reward", "train/step_seconds", "train/max_staleness"} & logged  # no twins
    assert config["prefect_flow_run_id"] == str(run_id)
    assert config["prefect_flow_run_url"].endswith(f"/runs/flow-run/{run_id}")  # the UI's route


# Non-default algorithm options ride along in the resume test: Dr.GRPO (constant normaliser, mean-only
# advantages), a KL penalty (the trainer loads a frozen reference) and warm-up + cosine lr, which the
# relaunched trainer continues; none of them changes what the test asserts.
ALGORITHM = {
    "loss.type": "dr_grpo",
    "advantage.std-normalize": "false",
    "loss.kl-coef": "0.05",
    "trainer.lr-schedule.warmup-steps": "1",
    "trainer.lr-schedule.decay": "cosine",
}
# DAPO's batch shaping rides along in the resumed, async part (its soft punishment takes rewards
# below 0, which the first part asserts against); the steps' counts are checked there.
SHAPING = {
    "orchestrator.shaping.dynamic-sampling": "true",
    "orchestrator.shaping.max-refill": "4",
    "orchestrator.shaping.overlong": "soft",
    "orchestrator.shaping.overlong-buffer": "4",
}


def test_rl_run_trains_broadcasts_and_resumes(tiny_model, prefect_api, tmp_path):
    from rlfleet.flows.rl import rl

    out = tmp_path / "run"
    store = RunStore(out)

    state = rl(config=rl_config(tiny_model, out, max_steps=2, **ALGORITHM), return_state=True)
    assert state.is_completed(), state
    summary = json.loads((out / "summary.json").read_text())
    assert [s["step"] for s in summary["steps"]] == [0, 1]
    assert all(0.0 <= s["mean_reward"] <= 1.0 and s["step_seconds"] > 0 for s in summary["steps"])
    assert Path(summary["config"]).name == "rl.toml"
    assert (out / "reward_curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    for name in ("rl", "trainer", "inference"):
        assert (out / "configs" / f"{name}.toml").is_file()
    assert not (out / "configs" / "orchestrator.toml").exists(), "nothing reads an orchestrator config"
    assert store.complete_steps("checkpoints") == [0, 1]
    assert store.manifest("batches/step_1", verify=True)["num_loss_tokens"] > 0
    # each record the processes exchange fills its schema (store/records.py): what readers index is there
    assert BatchManifest.__required_keys__ <= store.manifest("batches/step_1").keys()
    assert RolloutManifest.__required_keys__ <= read_rollout_manifest(store, 1).keys()
    for s in (0, 1):
        assert TrainerMetrics.__required_keys__ <= read_metrics(store, s).keys()
        assert StepRecord.__required_keys__ <= summary["steps"][s].keys()
    assert (out / "logs" / "inference" / "replica_0.log").stat().st_size > 0
    assert not list((out / "run").glob("*.pid")), "child processes left pidfiles behind"
    assert_readable_in_prefect(state, out, summary)
    first_names = asyncio.run(task_run_names(state.state_details.flow_run_id))
    assert {
        "launch_inference_pool",
        "rollout-0",
        "train-1",
        "broadcast_weights-1",
    } <= first_names

    done = {s: (out / f"rollouts/step_{s}/manifest.json").read_bytes() for s in (0, 1)}
    metrics_before = {s: (out / f"metrics/step_{s}.json").read_bytes() for s in (0, 1)}

    # Same output_dir, more steps, now async (k=1): resumes at step 2, leaves steps 0-1 untouched.
    resumed = {"orchestrator.max-async-level": "1", **ALGORITHM, **SHAPING}
    state = rl(config=rl_config(tiny_model, out, max_steps=4, **resumed), return_state=True)
    assert state.is_completed(), state
    names = asyncio.run(task_run_names(state.state_details.flow_run_id))
    assert {"rollout-2", "rollout-3", "train-3"} <= names
    assert not {"rollout-0", "rollout-1", "train-0", "train-1"} & names
    for s in (0, 1):
        assert (out / f"rollouts/step_{s}/manifest.json").read_bytes() == done[s]
        assert (out / f"metrics/step_{s}.json").read_bytes() == metrics_before[s]
    assert "starting at step 2" in (out / "logs/trainer/rank_0.log").read_text()
    summary = json.loads((out / "summary.json").read_text())
    assert [s["step"] for s in summary["steps"]] == [0, 1, 2, 3]
    # k=0 steps were on-policy; with k=1 rollout 3 ran on weights 1 while the trainer did step 2.
    assert [store.manifest(f"rollouts/step_{s}")["policy_step"] for s in range(4)] == [-1, 0, 1, 1]
    for s in range(4):
        records = read_rollout(store, s)
        k = 0 if s < 2 else 1
        # the manifest names the oldest weights in the step; at k=1 a group that the newest weights
        # sampled whole may join it too (timing), within the staleness bound checked next
        assert min(r["policy_step"] for r in records) == store.manifest(f"rollouts/step_{s}")["policy_step"]
        assert all(0 <= staleness(s, r["policy_step"]) <= k for r in records)
        assert json.loads((out / f"metrics/step_{s}.json").read_text())["max_staleness"] == (s == 3)
    assert [s["max_staleness"] for s in summary["steps"]] == [0, 0, 0, 1]
    trained = [json.loads((out / f"metrics/step_{s}.json").read_text()) for s in range(4)]
    assert all(m["lr"] > 0 and m["kl"] >= 0 for m in trained)  # the schedule's lr and the KL are logged
    shaped = {
        "dropped_zero_variance",
        "refilled",
        "zero_variance_groups",
        "overlong",
        "overlong_penalty_mean",
    }
    assert ["shaping" in s for s in summary["steps"]] == [False, False, True, True]
    for s in (2, 3):
        counts = summary["steps"][s]["shaping"]
        assert set(counts) == shaped and counts == store.manifest(f"rollouts/step_{s}")["shaping"]
        assert counts["refilled"] <= 4 and -1.0 <= counts["overlong_penalty_mean"] <= 0.0
        assert all("overlong_penalty" in r for r in read_rollout(store, s))
    rows, _ = history_and_config(Path(summary["wandb"]))
    assert all({f"rollout/{k}" for k in shaped} <= set(r) for r in rows), rows
    if len(os.sched_getaffinity(0)) >= 2:  # async on a CPU box: vLLM and the trainer on their own cores
        written = {
            n: tomllib.loads((out / f"configs/{n}.toml").read_text()) for n in ("trainer", "inference")
        }
        vllm_cores = {int(c) for c in written["inference"]["inference"]["cpu_threads_bind"].split(",")}
        assert vllm_cores and not vllm_cores & set(written["trainer"]["trainer"]["cpu_affinity"])


def load_under_a_request(pool, prompt: list[int], ticket: dict) -> tuple[dict, Sample]:
    """`pool.broadcast(ticket)` while a 900-token request streams; (its manifest, the sample)."""
    streamed = threading.Event()

    class Watched:  # the pool as the sampler sees it: asked per chunk, so it knows one arrived
        asked = 0

        def ensure(self) -> list[str]:
            return pool.ensure()

        def version(self, url: str) -> int:
            Watched.asked += 1
            if Watched.asked == 3:  # the request was sent and two chunks are in
                streamed.set()
            return pool.version(url)

    async def main() -> tuple[dict, Sample]:
        sampler = Sampler(Watched(), 1.0, 60.0, extra_params={"ignore_eos": True})
        try:
            task = asyncio.create_task(sampler.sample(prompt, 1, 900))
            assert await asyncio.to_thread(streamed.wait, 60)
            manifest = await asyncio.to_thread(pool.broadcast, ticket)
            (sample,) = await task
            return manifest, sample
        finally:
            await sampler.aclose()

    return asyncio.run(main())


def test_weight_transports_change_served_logprobs(tiny_model, tmp_path):
    """Each step's weights reach a real vLLM server through the filesystem and through the nccl
    transport (gloo on CPU: the trainer's sender in this process, rlfleet's worker extension in
    vLLM's): after each load vLLM's logprobs match HF's on those weights. A second sender (a
    relaunched trainer: a new group) is joined by the same server without a restart."""
    from transformers import AutoModelForCausalLM

    from rlfleet.inference.pool import InferencePool
    from rlfleet.trainer.lm_head import token_logprobs
    from rlfleet.trainer.parallel import Parallel
    from rlfleet.weights.nccl import NcclPublisher
    from rlfleet.weights.tickets import served_step, trainer_ticket

    port = free_port()
    long = {"weights.nccl-port": str(port), "inference.max-model-len": "1024"}  # room for a long request
    cfg = rl_config(tiny_model, tmp_path / "run", max_steps=1, **long)
    store = RunStore(cfg.output_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model)
    prompt = [1, *range(40, 60)]
    ids = torch.tensor([prompt])

    def perturb() -> list[float]:  # a deterministic "training step": move every weight; HF's logprobs
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p) * 0.05)
            return token_logprobs(model(input_ids=ids).logits[:, :-1], ids[:, 1:])[0].tolist()

    def nccl_step(step: int, publisher: NcclPublisher) -> dict:
        publisher.publish(step, model)
        sender = threading.Thread(target=publisher.serve, args=(step,))
        sender.start()  # blocks in the broadcast until the server's worker joins it
        try:
            return pool.broadcast(trainer_ticket(store, step, "nccl"))
        finally:
            sender.join(timeout=60)

    def off(a: list[float], b: list[float]) -> float:
        return max(abs(x - y) for x, y in zip(a, b, strict=True))

    torch.manual_seed(0)
    pool = InferencePool(cfg.inference_job())
    try:
        url = pool.ensure()[0]
        started = pool.replicas[0].started  # what the launch task logs
        before = prompt_logprobs(url, prompt)
        initial = copy.deepcopy(model)
        hf0 = perturb()
        model_at_step0 = copy.deepcopy(model)
        model.save_pretrained(tmp_path / "trained")
        fs, spanning = load_under_a_request(
            pool, prompt, {"transport": "filesystem", "step": 0, "path": str(tmp_path / "trained")}
        )
        after_fs = prompt_logprobs(url, prompt)
        hf1 = perturb()
        first = NcclPublisher(store, Parallel(), "float32", port, receivers=1, timeout_s=60)
        nccl1 = nccl_step(1, first)
        after_nccl = prompt_logprobs(url, prompt)
        first.close()
        hf2 = perturb()
        nccl2 = nccl_step(2, NcclPublisher(store, Parallel(), "float32", port, receivers=1, timeout_s=60))
        after_relaunch = prompt_logprobs(url, prompt)
    finally:
        pool.shutdown()
    assert fs["step"] == 0 and nccl1["step"] == 1 and nccl2["step"] == 2 and pool.replicas == []
    assert served_step(store) == 2  # the acknowledgement a cuda_ipc trainer waits on
    assert "ready in" in started and "KV cache size: 524,288 tokens" in started
    assert off(before, after_fs) > 1e-2 and off(after_fs, hf0) < 1e-3
    assert off(after_fs, after_nccl) > 1e-2 and off(after_nccl, hf1) < 1e-3
    assert off(after_nccl, after_relaunch) > 1e-2 and off(after_relaunch, hf2) < 1e-3
    assert nccl1["calls"][0]["workers"][0]["step"] == 1
    # A request in flight during the load: its tokens are credited to -1 then 0, in that order, and
    # each token's sampling logprob is the one of the weights that sampled it (the new weights
    # recompute the KV of the paused request), never a mix: what the loss's ratio is taken against.
    seq = torch.tensor([prompt + spanning.completion_ids])
    by = {
        v: token_logprobs(m(input_ids=seq).logits[:, :-1], seq[:, 1:])[0, len(prompt) - 1 :].tolist()
        for v, m in ((-1, initial), (0, model_at_step0))
    }
    assert spanning.versions == sorted(spanning.versions) and set(spanning.versions) == {-1, 0}
    for i, (v, lp) in enumerate(zip(spanning.versions, spanning.logprobs, strict=True)):
        assert abs(lp - by[0][i]) < 1e-3 or (v == -1 and abs(lp - by[-1][i]) < 1e-3), (i, v, lp)
    assert sum(
        abs(lp - by[0][i]) < 1e-3 for i, lp in enumerate(spanning.logprobs)
    ) >= spanning.versions.count(0)


def test_a_wait_for_edge_names_only_its_own_task_run(prefect_api):
    """Prefect links objects met in `wait_for` to the task that returned an object of that id (a
    str or datetime by id alone, so a freed result's address reused by a state's message drew an
    edge from an unrelated task; `test_rl_run_trains_broadcasts_and_resumes` met one). The edge the
    flow waits on carries only its task run's id and type."""
    from prefect import flow, task
    from prefect.utilities.engine import collect_task_run_inputs_sync

    from rlfleet.flows.rl import edge

    @task
    def words() -> str:
        return "".join(["an object ", "of its own"])

    @task
    def step() -> int:
        return 7

    @flow
    def two():
        said = words()
        done = step(return_state=True)
        stale = done.model_copy(update={"message": said})  # the same object another task returned
        linked = {r.id for r in collect_task_run_inputs_sync(stale)}
        kept = {r.id for r in collect_task_run_inputs_sync(edge(stale))}
        return linked, kept, done.state_details.task_run_id, edge(stale).is_completed()

    linked, kept, own, completed = two()
    assert own in linked and len(linked) == 2, "the setup must reproduce Prefect's link"
    assert kept == {own} and completed
