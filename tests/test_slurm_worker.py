"""The Prefect SLURM worker against a real SLURM (the session's `slurm` fixture): it creates a `slurm`
work pool and runs `rl/main` as a job (Completed); cancelling a flow run scancels its job
(Cancelled); a job killed by scancel or failing crashes its flow run with the SLURM state as the
reason. squeue / scontrol outputs are printed (`pytest -s`) for the closing notes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from uuid import UUID

import pytest

from rlfleet.procs import kill_group
from rlfleet.slurm.commands import scancel, scontrol_job
from rlfleet.workers.deploy import prefect_cli
from tests.slurmcluster import show, wait_job

pytestmark = pytest.mark.slurm

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "tiny"
POOL = "rlfleet-slurm-test"


def _worker_env(tmp: Path) -> dict[str, str]:
    """PYTHONPATH for the worker: this checkout first, and the `prefect.collections` entry point
    when the installed rlfleet predates it (a dist-info shim; `pip install -e .` makes it real)."""
    from importlib.metadata import entry_points

    paths = [str(ROOT)]
    if not any(ep.value == "rlfleet.workers.slurm" for ep in entry_points(group="prefect.collections")):
        shim = tmp / "ep" / "rlfleet_slurm_worker-0.dist-info"
        shim.mkdir(parents=True)
        shim.joinpath("METADATA").write_text(
            "Metadata-Version: 2.1\nName: rlfleet-slurm-worker\nVersion: 0\n"
        )
        shim.joinpath("entry_points.txt").write_text(
            "[prefect.collections]\nrlfleet = rlfleet.workers.slurm\n"
        )
        paths.append(str(shim.parent))
    old = os.environ.get("PYTHONPATH")
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(paths + ([old] if old else [])),
        "PREFECT_WORKER_QUERY_SECONDS": "2",
    }


@pytest.fixture(scope="module")
def slurm_worker(slurm, prefect_api, tmp_path_factory):
    """`rlfleet deploy --type slurm`, then `prefect worker start --pool ... --type slurm`."""
    tmp = tmp_path_factory.mktemp("slurm_worker")
    env = _worker_env(tmp)
    deploy = [
        sys.executable,
        "-m",
        "rlfleet.cli",
        "deploy",
        "--pool",
        POOL,
        "--type",
        "slurm",
        "--root",
        str(ROOT),
    ]
    out = subprocess.run(deploy, capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    prefect_cli("work-pool", "update", POOL, "--base-job-template", _job_template(tmp), env=env)
    log = open(tmp / "worker.log", "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        [sys.executable, "-m", "prefect", "worker", "start", "--pool", POOL, "--type", "slurm"],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        cwd=ROOT,
    )
    yield proc, tmp / "worker.log"
    kill_group(proc.pid)
    log.close()


def _job_template(tmp: Path) -> str:
    """The default template with job_dir in the test's tmp dir and a 1 s poll."""
    from rlfleet.workers.slurm import SlurmWorker

    tpl = SlurmWorker.get_default_base_job_template()
    tpl["variables"]["properties"]["job_dir"]["default"] = str(tmp / "jobs")
    tpl["variables"]["properties"]["poll_interval_s"]["default"] = 1.0
    path = tmp / "template.json"
    path.write_text(json.dumps(tpl))
    return str(path)


def _run_deployment(name: str, config: dict, *job_variables: str) -> UUID:
    jv = [a for v in job_variables for a in ("--job-variable", v)]
    text = prefect_cli(
        "deployment", "run", name, "--param", f"config={json.dumps(config)}", *jv, cwd=ROOT, timeout=300
    )
    return UUID(text.split("UUID:")[1].split()[0])


def _wait_running(run_id: UUID, timeout_s: float = 300):
    from tests.helpers import flow_run

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        run = flow_run(run_id)
        if run.state.is_running() and run.infrastructure_pid:
            return run
        assert not run.state.is_final(), run.state
        time.sleep(1)
    raise TimeoutError(f"flow run {run_id} not running: {flow_run(run_id).state}")


def _sft_params(tiny_model: Path, out: Path) -> dict:
    """An SFT run far longer than the test waits: it is cancelled or killed while it trains."""
    return {
        "output_dir": str(out),
        "max_steps": 100000,
        "model": {"path": str(tiny_model)},
        "data": {"path": str(EXAMPLE / "sft_repeat.jsonl"), "max_seq_len": 64},
        "trainer": {"checkpoint_interval": 100000, "num_threads": 1},
    }


def test_worker_creates_a_slurm_pool(slurm_worker):
    from prefect import get_client

    with get_client(sync_client=True) as client:
        pool = client.read_work_pool(POOL)
    assert pool.type == "slurm"
    props = pool.base_job_template["variables"]["properties"]
    assert {"partition", "nodes", "gpus_per_node", "time", "account", "env", "extra_directives"} <= set(props)


@pytest.mark.e2e
def test_worker_runs_rl_main_as_a_slurm_job(slurm, slurm_worker, tiny_model, tmp_path):
    from tests.helpers import rl_config, wait_final

    out = tmp_path / "rl"
    run_id = _run_deployment("rl/main", rl_config(tiny_model, out, 2).model_dump(mode="json"))
    run = wait_final(run_id)
    job = run.infrastructure_pid
    info = wait_job(job, 120)  # the flow run is final a moment before its process (and job) exits
    text = show(slurm, job)
    assert run.state.is_completed(), f"{run.state}\n{slurm_worker[1].read_text()[-3000:]}"
    assert info.state == "COMPLETED" and "JobState=COMPLETED" in text
    assert [s["step"] for s in json.loads((out / "summary.json").read_text())["steps"]] == [0, 1]


def test_cancelling_the_flow_run_scancels_its_job(slurm, slurm_worker, tiny_model, tmp_path):
    from tests.helpers import wait_final

    run_id = _run_deployment("sft/main", _sft_params(tiny_model, tmp_path / "c"))
    job = _wait_running(run_id).infrastructure_pid
    assert scontrol_job(job).state == "RUNNING"
    prefect_cli("flow-run", "cancel", str(run_id), cwd=ROOT, timeout=120)
    run = wait_final(run_id, timeout_s=180)
    info = wait_job(job, 120)
    text = show(slurm, job)
    assert run.state.is_cancelled(), run.state
    assert info.state == "CANCELLED" and "JobState=CANCELLED" in text


def test_a_job_killed_by_scancel_crashes_its_flow_run_with_the_reason(
    slurm, slurm_worker, tiny_model, tmp_path
):
    from tests.helpers import wait_final

    run_id = _run_deployment("sft/main", _sft_params(tiny_model, tmp_path / "k"))
    job = _wait_running(run_id).infrastructure_pid
    scancel(job)  # behind Prefect's back, as an admin or a preemption script would
    run = wait_final(run_id, timeout_s=180)
    show(slurm, job)
    print("flow run state:", run.state.name, "-", run.state.message)
    assert run.state.is_crashed(), run.state
    assert f"SLURM job {job} CANCELLED" in run.state.message


def test_a_failed_job_crashes_its_flow_run_with_state_and_exit_code(
    slurm, slurm_worker, tiny_model, tmp_path
):
    """A job whose command exits 3 before the flow starts: SLURM FAILED -> Crashed, with the reason."""
    from tests.helpers import wait_final

    run_id = _run_deployment("sft/main", _sft_params(tiny_model, tmp_path / "f"), "command=bash -c 'exit 3'")
    run = wait_final(run_id, timeout_s=180)
    show(slurm, run.infrastructure_pid)
    print("flow run state:", run.state.name, "-", run.state.message)
    assert run.state.is_crashed(), run.state
    assert (
        f"SLURM job {run.infrastructure_pid} FAILED" in run.state.message
        and "exit code 3:0" in run.state.message
    )
