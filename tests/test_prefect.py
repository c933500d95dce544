"""Prefect as the user drives it: deployments from prefect.yaml, a worker on the local pool, a
deployment run that fails and is retried the way the UI's Retry does, an ablation and an eval.

All against the real Prefect server of the test session (`prefect_api`), real vLLM and trainer.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path
from uuid import UUID

import pytest
from prefect import get_client
from prefect.client.schemas.objects import StateType

from rlfleet.config.loader import load
from rlfleet.config.models import EvalJobConfig
from rlfleet.procs import kill_group, wait_until
from rlfleet.store import RunStore
from rlfleet.workers.deploy import prefect_cli
from tests.helpers import (
    KillWhen,
    assert_every_step_once,
    assert_no_process_left,
    flow_run,
    free_port,
    rl_config,
    task_runs,
    wait_final,
)
from tests.wandb_log import history_and_config

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[1]
POOL = "rlfleet-test"


@pytest.fixture(scope="module")
def worker(prefect_api, tmp_path_factory):
    """`rlfleet deploy`, then `prefect worker start` on the pool, stopped at teardown."""
    out = subprocess.run(
        [sys.executable, "-m", "rlfleet.cli", "deploy", "--pool", POOL, "--root", str(ROOT)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    log_path = tmp_path_factory.mktemp("worker") / "worker.log"
    log = open(log_path, "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        [sys.executable, "-m", "prefect", "worker", "start", "--pool", POOL],
        env={**os.environ, "PREFECT_WORKER_QUERY_SECONDS": "2"},
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        cwd=ROOT,
    )
    yield proc
    kill_group(proc.pid)
    log.close()


def worker_executed(run_id: UUID) -> bool:
    """Whether the worker emitted `prefect.worker.executed-flow-run` for the run: the last thing it
    does with a flow run's process, after proposing Crashed for a non-zero exit."""
    import httpx
    from prefect.settings import PREFECT_API_URL

    query = {
        "event": {"name": ["prefect.worker.executed-flow-run"]},
        "related": {"id": [f"prefect.flow-run.{run_id}"]},
    }
    resp = httpx.post(f"{PREFECT_API_URL.value()}/events/filter", json={"filter": query})
    resp.raise_for_status()
    return bool(resp.json()["events"])


def test_deploy_creates_the_deployments(worker):
    with get_client(sync_client=True) as client:
        deployments = {
            f"{client.read_flow(d.flow_id).name}/{d.name}": d
            for d in client.read_deployments()
            if d.work_pool_name == POOL
        }
        assert client.read_work_pool(POOL).type == "process"
    assert set(deployments) == {"rl/main", "sft/main", "eval/scheduled", "ablation/main", "fleet/tiny"}
    (schedule,) = deployments["eval/scheduled"].schedules
    assert schedule.schedule.cron == "0 * * * *" and schedule.active is False  # off until the user enables it
    pull = deployments["rl/main"].pull_steps[0]["prefect.deployments.steps.set_working_directory"]
    assert pull["directory"] == str(ROOT)
    assert deployments["rl/main"].parameters["config"]["model"]["path"] == "models/tiny"


def test_deployment_run_fails_then_retry_reruns_only_unfinished_tasks(worker, tiny_model, tmp_path):
    """`prefect deployment run rl/main --param config=...`; the trainer is killed in step 1 with
    retries off, so the run fails; `prefect flow-run retry` (the UI's Retry) finishes it."""
    out = tmp_path / "run"
    cfg = rl_config(tiny_model, out, 3, **{"tasks.retries": "0"})
    params = json.dumps(cfg.model_dump(mode="json"))
    # The trainer starts step 1 as soon as its batches are published, which is before the train-1
    # task asks whether the trainer is alive (a dead one would be relaunched there, and the run
    # would not fail). So it is frozen at the batches and killed once train-1 is running.
    ids: dict[str, UUID] = {}

    def train_1_running() -> bool:
        runs = task_runs(ids["run"]) if "run" in ids else []
        return any(t.name == "train-1" and t.state_type == StateType.RUNNING for t in runs)

    killer = KillWhen(out / "batches/step_1/manifest.json", out / "run/trainer.pid", then=train_1_running)
    killer.start()
    text = prefect_cli("deployment", "run", "rl/main", "--param", f"config={params}", cwd=ROOT, timeout=300)
    run_id = ids["run"] = UUID(text.split("UUID:")[1].split()[0])
    wait_final(run_id)
    # The engine sets Failed; then the worker sees the process's exit code 1 and proposes Crashed,
    # which Prefect's server at times accepts over Failed. A retry sent before that proposal is
    # overwritten by it, so wait until the worker is done with the process (a user's Retry comes
    # later than that): it emits `prefect.worker.executed-flow-run` after its crash proposal. The
    # retry below treats Failed and Crashed alike.
    wait_until(
        lambda: worker_executed(run_id), 120, interval_s=1, what="the worker to finish the first attempt"
    )
    first = flow_run(run_id)
    assert not killer.errors, killer.errors
    assert killer.killed_at is not None and (first.state.is_failed() or first.state.is_crashed()), first.state

    prefect_cli("flow-run", "retry", str(run_id), cwd=ROOT, timeout=300)
    final = wait_final(run_id, after=first.end_time.timestamp())
    assert final.state.is_completed(), final.state

    runs = task_runs(run_id)
    executed = Counter(t.name for t in runs if t.state.name != "Cached")
    cached = {t.name for t in runs if t.state.name == "Cached"}
    failed = {t.name for t in runs if t.state.is_failed()}
    assert failed == {"train-1"}
    # finished in the first attempt: step 0 is not called again, step 1's rollout (and batches) comes from the cache
    assert cached == {"rollout-1"}
    step_tasks = {n: c for n, c in executed.items() if not n.startswith(("launch_", "start_", "broadcast_"))}
    assert step_tasks == {
        **{f"{t}-{s}": 1 for t in ("rollout", "train") for s in range(3)},
        "train-1": 2,  # failed, then the retry: the only task that ran twice
    }
    assert executed["launch_inference_pool"] == 2  # processes die with the controller, so relaunched
    assert_every_step_once(out, 3)
    assert_no_process_left(out)


def test_ablation_table_and_eval(prefect_api, tiny_model, tmp_path):
    """A 2-point grid: two child rl runs (each evaluating its policy every 2 steps), one table;
    then the `eval` flow scores the latest checkpoint of one point on its own vLLM server."""
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    from rlfleet.flows.ablation import ablation
    from rlfleet.flows.eval import eval_flow

    base = rl_config(tiny_model, tmp_path / "abl", 2, **{"eval.interval": "2", "eval.num-examples": "8"})
    rows = ablation(base=base, grid={"trainer.lr": [1e-3, 1e-2]})

    assert [r["point"] for r in rows] == ["p0_lr-0.001", "p1_lr-0.01"]
    for row in rows:
        assert row["state"] == "Completed"
        assert 0.0 <= row["final_reward"] <= 1.0 and row["tokens_per_s"] > 0 and row["median_step_s"] > 0
        store = RunStore(row["output_dir"])
        assert store.complete_steps("checkpoints") == [0, 1]
        assert store.read_json("evals/step_1.json")["source"] == "rl"
        assert set(store.read_json("steps/step_1.json")["eval"]["repeat"]) == {"mean_reward", "pass@1"}
        rows_logged, _ = history_and_config(next((Path(row["output_dir"]) / "wandb").glob("offline-run-*")))
        assert "eval/repeat/mean_reward" in rows_logged[1] and "eval/repeat/mean_reward" not in rows_logged[0]
    assert RunStore(tmp_path / "abl").read_json("ablation.json") == rows
    with get_client(sync_client=True) as client:
        (table,) = client.read_artifacts(
            artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=["abl-ablation"])), limit=1
        )
    assert [r["point"] for r in json.loads(table.data)] == [r["point"] for r in rows]

    point = rows[1]["output_dir"]
    cfg = load(
        EvalJobConfig,
        ["--output-dir", point, "--model.path", str(tiny_model), "--inference.port", str(free_port())]
        + ["--eval.num-examples", "16", "--inference.max-model-len", "128"],
    )
    record = eval_flow(config=cfg)
    assert record["step"] == 1 and record["source"] == "eval" and record["num_samples"] == 16
    assert 0.0 <= record["pass_rate"] <= record["mean_reward"] + 1e-9 <= 1.0 + 1e-9
    assert RunStore(point).read_json("evals/step_1.json") == record


def test_gpu_leases_keep_two_runs_off_the_same_gpu(prefect_api, monkeypatch):
    """Two holders of GPU 7 never overlap: the second asks while the first holds it, the server
    refuses it, and it holds GPU 7 only after the first lets go. GPU 6 is leased meanwhile, while
    GPU 7 is held. Shown by the order of events, each thread holding its lease until the event it
    waits for has happened (no sleeps)."""
    import contextvars
    import threading

    import httpx
    from prefect.client.orchestration import PrefectClient

    from rlfleet.workers.leases import ensure_gpu_limits, gpu_lease

    assert ensure_gpu_limits(["6", "7"]) == ["gpu-6", "gpu-7"]
    log: list[tuple[str, str]] = []  # (what, who): "holds"/"lets go" a thread, "refused" a limit
    changed = threading.Condition()
    errors: list[BaseException] = []

    def record(what: str, who: str) -> None:
        with changed:
            log.append((what, who))
            changed.notify_all()

    def until(happened) -> None:
        with changed:
            if not changed.wait_for(lambda: happened(log), timeout=60):  # a safety net
                raise TimeoutError(f"gave up waiting; events: {log}")

    increment = PrefectClient.increment_concurrency_slots_with_lease

    async def observed(self, names, *args, **kwargs):  # the server's answers to the lease requests
        try:
            return await increment(self, names, *args, **kwargs)
        except httpx.HTTPStatusError as e:
            if e.response.status_code == 423:  # Locked: every slot is held
                record("refused", ",".join(names))
            raise

    monkeypatch.setattr(PrefectClient, "increment_concurrency_slots_with_lease", observed)

    def first_holder_may_go(name: str, log: list) -> bool:
        """GPU 7's first holder lets go once the other asker was refused GPU 7 while it held it, and
        GPU 6 is held; the second holder at once (and both at once if both hold it: the asserts
        below say so without waiting out the safety net)."""
        other = "b" if name == "a" else "a"
        if ("lets go", other) in log or ("holds", other) in log:
            return True
        held = log.index(("holds", name))
        return ("refused", "gpu-7") in log[held:] and ("holds", "c") in log

    def hold(name: str, gpus: list[str]) -> None:
        try:
            with gpu_lease(gpus):
                record("holds", name)
                if name == "c":  # hold GPU 6 until GPU 7 is held too
                    until(lambda log: ("holds", "a") in log or ("holds", "b") in log)
                else:
                    until(lambda log: first_holder_may_go(name, log))
                record("lets go", name)  # the last thing inside: the slot is freed after it
        except BaseException as e:  # noqa: BLE001 - the test raises it
            errors.append(e)

    threads = [  # each thread runs in a copy of this context, so it talks to the test's Prefect API
        threading.Thread(target=contextvars.copy_context().run, args=(hold, *a))
        for a in (("a", ["7"]), ("b", ["7"]), ("c", ["6"]))
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors and not any(t.is_alive() for t in threads), (errors, log)
    seven = [(what, who) for what, who in log if who in ("a", "b")]
    first, second = seven[0][1], seven[-1][1]
    assert {first, second} == {"a", "b"}
    assert seven == [("holds", first), ("lets go", first), ("holds", second), ("lets go", second)], log
    held, let_go = log.index(("holds", first)), log.index(("lets go", first))
    assert ("refused", "gpu-7") in log[held:let_go], log  # the second asked meanwhile and waited
    assert ("refused", "gpu-6") not in log, log  # GPU 6 never waited on GPU 7
    assert held < log.index(("lets go", "c")) and log.index(("holds", "c")) < let_go, log  # overlapped
