"""SLURM, for real: Debian's slurm-wlm and munge on loopback (tests/slurmcluster.py), two node daemons.

- `[slurm]` configs fail in validation naming the field, before anything is written;
- a dry run writes a script that `sbatch --test-only` accepts; a custom template gets the variables;
- `rlfleet sft` with `[slurm]` is an sbatch job that trains the tiny model to completion;
- a multi_node `rlfleet rl` job: vLLM on node n1, torchrun trainer + the one controller on n2;
- the Prefect SLURM worker runs `rl/main` as a job (Completed); cancelling a flow run scancels its
  job (Cancelled); a job killed by scancel crashes its flow run with the SLURM state as the reason.
squeue / scontrol outputs are printed (`pytest -s`) for the closing notes; timings are not asserted.
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

from rlfleet.cli import main
from rlfleet.procs import kill_group
from rlfleet.slurm.commands import JobInfo, sbatch_test_only, scancel, scontrol_job
from rlfleet.store import RunStore
from rlfleet.workers.deploy import prefect_cli
from tests.slurmcluster import SlurmCluster, missing_binaries

pytestmark = pytest.mark.slurm

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "tiny"
POOL = "rlfleet-slurm-test"


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    missing = missing_binaries()
    if missing:  # never a skip: `make test` installs them (scripts/install-slurm.sh)
        pytest.fail(
            f"SLURM binaries missing: {missing}; run scripts/install-slurm.sh (apt-get install slurm-wlm munge)"
        )
    cluster = SlurmCluster(tmp_path_factory.mktemp("slurm"), nodes=2).start()
    old = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = str(cluster.conf)  # sbatch, squeue, ... and every job's environment
    try:
        yield cluster
    finally:
        cluster.stop()
        if old is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = old


def wait_job(job_id: str, timeout_s: float = 600) -> JobInfo:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        info = scontrol_job(job_id)
        if info is not None and info.final:
            return info
        time.sleep(1)
    raise TimeoutError(f"SLURM job {job_id} not final after {timeout_s} s: {scontrol_job(job_id)}")


def show(cluster: SlurmCluster, job_id: str) -> str:
    """What squeue and scontrol say about a job (printed for the closing notes)."""
    q = cluster.run(["squeue", "-j", job_id], check=False)
    s = cluster.run(["scontrol", "show", "job", job_id], check=False).stdout
    keep = [
        ln.strip()
        for ln in s.splitlines()
        if ln.strip().startswith(("JobId", "JobState", "NodeList", "BatchHost"))
    ]
    text = f"$ squeue -j {job_id}\n{q.stdout}{q.stderr}$ scontrol show job {job_id} | grep ...\n" + "\n".join(
        keep
    )
    print(text)
    return text


def submit(capsys, *argv: str) -> dict:
    assert main(list(argv)) == 0, capsys.readouterr().err
    return json.loads(capsys.readouterr().out)


def sft_args(model: Path, out: Path, *extra: str) -> list[str]:
    return ["sft", "@", str(EXAMPLE / "sft.toml"), "--model.path", str(model), "--output-dir", str(out)] + [
        "--data.path",
        str(EXAMPLE / "sft_repeat.jsonl"),
        *extra,
    ]


@pytest.mark.parametrize(
    "args, field",
    [
        (["--slurm.template-path", "/no/such.j2"], "slurm.template_path"),
        (["--slurm.time", "soon"], "slurm.time"),
        (["--slurm.extra-directives", '["exclusive"]'], "slurm.extra_directives"),
        (
            ["--deployment.type", "multi_node", "--deployment.num-infer-nodes", "0", "--slurm.job-name", "x"],
            "num_infer_nodes",
        ),
        (
            ["--deployment.type", "multi_node", "--deployment.num-train-nodes", "0", "--slurm.job-name", "x"],
            "num_train_nodes",
        ),
        (
            [
                "--deployment.type",
                "multi_node",
                "--deployment.num-train-nodes",
                "3",
                "--deployment.nodes-per-fsdp-group",
                "2",
            ],
            "nodes_per_fsdp_group",
        ),
        (
            [
                "--deployment.type",
                "multi_node",
                "--deployment.gpus-per-node",
                "3",
                "--inference.tensor-parallel-size",
                "2",
                "--slurm.job-name",
                "x",
            ],
            "tensor_parallel_size",
        ),
        (["--deployment.type", "multi_node"], "[slurm]"),
    ],
)
def test_bad_slurm_config_fails_naming_the_field(tiny_model, tmp_path, capsys, args, field):
    out = tmp_path / "run"
    assert main(["rl", "--model.path", str(tiny_model), "--output-dir", str(out), *args]) == 2
    assert field in capsys.readouterr().err
    assert not out.exists(), "nothing is written for a bad config"


def test_bad_placement_for_sft_and_inference(tiny_model, tmp_path, capsys):
    out = tmp_path / "run"
    assert main(sft_args(tiny_model, out, "--deployment.type", "multi_node", "--slurm.job-name", "x")) == 2
    assert "deployment.num_infer_nodes: must be 0 for `rlfleet sft`" in capsys.readouterr().err
    inf = [
        "inference",
        "--model.path",
        str(tiny_model),
        "--output-dir",
        str(out),
        "--deployment.type",
        "multi_node",
    ]
    assert main([*inf, "--slurm.job-name", "x"]) == 2
    assert "deployment.num_train_nodes: must be 0 for `rlfleet inference`" in capsys.readouterr().err
    assert not out.exists()


def test_dry_run_writes_a_script_sbatch_test_only_accepts(slurm, tiny_model, tmp_path, capsys):
    out = tmp_path / "run"
    result = submit(
        capsys,
        "rl",
        "@",
        str(EXAMPLE / "rl.toml"),
        "--model.path",
        str(tiny_model),
        "--output-dir",
        str(out),
        "--deployment.type",
        "multi_node",
        "--slurm.job-name",
        "dry",
        "--slurm.extra-directives",
        '["--exclusive"]',
        "--dry-run",
    )
    assert result["job_id"] is None
    script = Path(result["script"]).read_text()
    assert script.startswith("#!/bin/bash\n#SBATCH --job-name=dry\n#SBATCH --nodes=2\n")
    assert (
        "#SBATCH --exclusive" in script and "rlfleet.cli rl @" in script and "torch.distributed.run" in script
    )
    for name in ("rl", "trainer", "orchestrator", "inference"):
        assert (out / "configs" / f"{name}.toml").is_file()
    assert "slurm" not in (out / "configs" / "rl.toml").read_text(), "the job's configs do not submit again"
    said = sbatch_test_only(result["script"])
    print(said)
    assert "to start at" in said and "n[1-2]" in said
    assert slurm.run(["squeue", "-h"]).stdout.strip() == "", "--test-only and --dry-run submit nothing"


def test_custom_template_gets_the_documented_variables(tiny_model, tmp_path, capsys):
    names = ["command", "job_name", "num_nodes", "num_infer_nodes", "num_train_nodes", "gpus_per_node"]
    names += ["nodes_per_fsdp_group", "nproc_per_node", "replicas_per_node", "inference_port", "rdzv_port"]
    names += ["output_dir", "log_dir", "workdir", "python", "rlfleet", "multi_node", "time"]
    tpl = tmp_path / "my.sbatch.j2"
    tpl.write_text(
        "#!/bin/bash\n" + "".join(f"# {n}={{{{ {n} }}}}\n" for n in names) + "# rl={{ configs.rl }}\n"
    )
    out = tmp_path / "run"
    args = [
        "rl",
        "--model.path",
        str(tiny_model),
        "--output-dir",
        str(out),
        "--deployment.type",
        "multi_node",
    ]
    result = submit(
        capsys, *args, "--deployment.num-train-nodes", "2", "--slurm.template-path", str(tpl), "--dry-run"
    )
    lines = dict(ln[2:].split("=", 1) for ln in Path(result["script"]).read_text().splitlines()[1:])
    assert lines["command"] == "rl" and lines["num_nodes"] == "3" and lines["num_train_nodes"] == "2"
    assert lines["log_dir"] == str(out / "logs" / "slurm") and lines["rl"] == str(out / "configs" / "rl.toml")
    assert all(lines[n] not in ("", "None") for n in names)

    tpl.write_text("#!/bin/bash\n# {{ no_such_variable }}\n")
    assert (
        main([*args, "--slurm.template-path", str(tpl), "--dry-run", "--output-dir", str(tmp_path / "b")])
        == 1
    )
    assert "no_such_variable" in capsys.readouterr().err
    assert not (tmp_path / "b").exists()


def test_sbatch_of_a_tiny_sft_job_runs_to_completion(slurm, prefect_api, tiny_model, tmp_path, capsys):
    out = tmp_path / "sft"
    result = submit(capsys, *sft_args(tiny_model, out, "--max-steps", "6", "--slurm.job-name", "sft-tiny"))
    job = result["job_id"]
    info = wait_job(job)
    show(slurm, job)
    log = out / "logs" / "slurm" / "sft-0.log"
    assert info.state == "COMPLETED", f"{info}\n{log.read_text()[-3000:] if log.exists() else ''}"
    summary = json.loads((out / "summary.json").read_text())
    assert [s["step"] for s in summary["steps"]] == list(range(6))
    assert log.stat().st_size > 0
    assert json.loads((out / "slurm" / "job.json").read_text())["job_id"] == job
    assert "[slurm]" not in (out / "configs" / "sft.toml").read_text()


@pytest.mark.e2e
def test_multi_node_rl_job_places_inference_trainer_and_one_controller(
    slurm, prefect_api, tiny_model, tmp_path, capsys
):
    """n1 serves vLLM; n2 runs the torchrun trainer (rendezvous on itself) and the controller."""
    from tests.conftest import free_port

    out = tmp_path / "mn"
    args = ["rl", "--model.path", str(tiny_model), "--output-dir", str(out), "--max-steps", "2"]
    args += [
        "--orchestrator.batch-size",
        "4",
        "--orchestrator.group-size",
        "4",
        "--orchestrator.max-tokens",
        "8",
    ]
    args += [
        "--trainer.checkpoint-interval",
        "1",
        "--inference.max-model-len",
        "128",
        "--wandb.mode",
        "offline",
    ]
    args += ["--inference.port", str(free_port()), "--slurm.rdzv-port", str(free_port())]
    args += ["--deployment.type", "multi_node", "--slurm.job-name", "rl-2n"]
    job = submit(capsys, *args)["job_id"]
    info = wait_job(job)
    show(slurm, job)
    logs = out / "logs" / "slurm"
    tails = {f.name: f.read_text(errors="replace")[-1500:] for f in sorted(logs.glob("*.log"))}
    assert info.state == "COMPLETED", f"{info}\n{tails}"
    assert info.nodes == "n[1-2]"
    assert {f.name for f in logs.glob("*.log")} == {"inference-0.log", "trainer-0.log", "controller-0.log"}
    summary = json.loads((out / "summary.json").read_text())
    assert [s["step"] for s in summary["steps"]] == [0, 1]
    assert RunStore(out).complete_steps("checkpoints") == [0, 1]
    assert (
        "http://127.0.0.1:" in (out / "configs" / "rl.toml").read_text()
    )  # the controller used n1's replica


# -- the Prefect SLURM worker --------------------------------------------------------------------


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
    from tests.test_prefect import flow_run

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
    from tests.test_e2e import rl_config
    from tests.test_prefect import wait_final

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
    from tests.test_prefect import wait_final

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
    from tests.test_prefect import wait_final

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
    from tests.test_prefect import wait_final

    run_id = _run_deployment("sft/main", _sft_params(tiny_model, tmp_path / "f"), "command=bash -c 'exit 3'")
    run = wait_final(run_id, timeout_s=180)
    show(slurm, run.infrastructure_pid)
    print("flow run state:", run.state.name, "-", run.state.message)
    assert run.state.is_crashed(), run.state
    assert (
        f"SLURM job {run.infrastructure_pid} FAILED" in run.state.message
        and "exit code 3:0" in run.state.message
    )
