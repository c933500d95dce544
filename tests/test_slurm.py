"""SLURM, for real: Debian's slurm-wlm and munge on loopback (tests/slurmcluster.py), two node daemons.

- `[slurm]` configs fail in validation naming the field, before anything is written;
- a dry run writes a script that `sbatch --test-only` accepts; a custom template gets the variables;
- `rlfleet sft` with `[slurm]` is an sbatch job that trains the tiny model to completion;
- a multi_node `rlfleet rl` job: vLLM on node n1, torchrun trainer + the one controller on n2.
- one whose inference step dies at once stops its controller and fails (no startup timeout).
The Prefect SLURM worker is tests/test_slurm_worker.py.
squeue / scontrol outputs are printed (`pytest -s`) for the closing notes; timings are not asserted.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlfleet.cli import main
from rlfleet.store import RunStore
from tests.helpers import dcp_ranks, sbatch_test_only
from tests.slurmcluster import show, wait_job

pytestmark = pytest.mark.slurm

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "tiny"


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
    # what SFT does take: train nodes only, each a torchrun of `rlfleet sft` ranks (dry runs)
    two = ["--deployment.num-infer-nodes", "0", "--deployment.num-train-nodes", "2", "--dry-run"]
    submit(
        capsys, *sft_args(tiny_model, out, "--deployment.type", "multi_node", "--slurm.job-name", "x", *two)
    )
    script = (out / "slurm" / "sft.sbatch").read_text()
    assert "#SBATCH --nodes=2\n" in script and "--nnodes=2" in script and "rlfleet.cli sft @" in script
    gpus = ["--deployment.num-train-gpus", "2", "--slurm.job-name", "x", "--dry-run"]
    submit(capsys, *sft_args(tiny_model, tmp_path / "gpus", *gpus))
    assert "#SBATCH --gpus-per-node=2\n" in (tmp_path / "gpus" / "slurm" / "sft.sbatch").read_text()
    assert "num_train_gpus = 2" in (tmp_path / "gpus" / "configs" / "sft.toml").read_text()


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
    for name in ("rl", "trainer", "inference"):
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


def _script_and_configs(capsys, tiny_model, out, *args: str) -> tuple[str, dict]:
    import tomllib

    result = submit(
        capsys, "rl", "--model.path", str(tiny_model), "--output-dir", str(out), *args, "--dry-run"
    )
    configs = {k: tomllib.loads(Path(v).read_text()) for k, v in result["configs"].items()}
    return Path(result["script"]).read_text(), configs


@pytest.mark.parametrize(
    "args, placement",
    [
        (
            [
                "--deployment.num-inference-gpus",
                "2",
                "--deployment.num-train-gpus",
                "2",
                "--inference.num-replicas",
                "2",
            ],
            "disaggregated: inference: replicas 0-1 on GPUs 0,1 (tp 1); trainer: 2 FSDP ranks on GPUs 2,3",
        ),
        (
            ["--deployment.placement", "colocated", "--deployment.num-inference-gpus", "4"]
            + [
                "--deployment.num-train-gpus",
                "4",
                "--inference.num-replicas",
                "2",
                "--inference.tensor-parallel-size",
                "2",
            ],
            "colocated: inference: replicas 0-1 on GPUs 0+1,2+3 (tp 2); trainer: 4 FSDP ranks on GPUs 0,1,2,3",
        ),
    ],
)
def test_a_four_gpu_node_job_asks_for_four_gpus_and_says_its_placement(
    tiny_model, tmp_path, capsys, args, placement
):
    """single_node on a 4-GPU node: the job asks SLURM for the GPUs it places on, once each, and its
    controller places itself on them (the script echoes what it will choose)."""
    script, _ = _script_and_configs(capsys, tiny_model, tmp_path / "run", *args)
    assert "#SBATCH --gpus-per-node=4\n" in script
    assert f"echo 'placement: {placement}" in script


def test_a_layout_that_cannot_run_is_refused_before_the_script(tiny_model, tmp_path, capsys):
    """The tiny model has 2 attention heads: TP 4 cannot split them."""
    args = ["--deployment.num-inference-gpus", "4", "--inference.tensor-parallel-size", "4"]
    base = ["rl", "--model.path", str(tiny_model), "--output-dir", str(tmp_path / "run")]
    assert main([*base, *args, "--slurm.job-name", "x", "--dry-run"]) == 2
    assert (
        "inference.tensor_parallel_size (4) must divide the model's num_attention_heads (2)"
        in capsys.readouterr().err
    )
    assert not (tmp_path / "run").exists()


def test_multi_node_four_gpu_nodes_run_tp_groups_and_four_trainer_ranks(tiny_model, tmp_path, capsys):
    """4-GPU nodes, TP 2: each inference node runs 2 replicas (CUDA_VISIBLE_DEVICES 0,1 and 2,3),
    each train node a torchrun of 4 ranks."""
    from rlfleet.config.models import InferenceJobConfig
    from rlfleet.inference.server import replica_env

    multi = ["--deployment.type", "multi_node", "--deployment.gpus-per-node", "4"]
    multi += ["--deployment.num-infer-nodes", "2", "--deployment.num-train-nodes", "2"]
    script, configs = _script_and_configs(
        capsys, tiny_model, tmp_path / "run", *multi, "--inference.tensor-parallel-size", "2"
    )
    assert "#SBATCH --nodes=4\n" in script and "#SBATCH --gpus-per-node=4\n" in script
    assert "--nnodes=2 --nproc-per-node=4" in script
    assert "for ((r = 0; r < 2; r++))" in script and "--inference.replica-offset $((rank * 2))" in script
    node = InferenceJobConfig.model_validate(configs["inference"])
    assert (node.gpu_ids, node.inference.num_replicas) == (["0", "1", "2", "3"], 2)
    assert [replica_env(node, r)["CUDA_VISIBLE_DEVICES"] for r in range(2)] == ["0,1", "2,3"]


def test_sbatch_of_a_tiny_sft_job_runs_to_completion(slurm, prefect_api, tiny_model, tmp_path, capsys):
    """Multi-node SFT: one gloo rank on each of the two nodes, rendezvous on the first."""
    out = tmp_path / "sft"
    nodes = [
        "--deployment.type",
        "multi_node",
        "--deployment.num-infer-nodes",
        "0",
        "--deployment.num-train-nodes",
        "2",
    ]
    result = submit(
        capsys, *sft_args(tiny_model, out, "--max-steps", "6", "--slurm.job-name", "sft-tiny", *nodes)
    )
    job = result["job_id"]
    info = wait_job(job)
    show(slurm, job)
    logs = [out / "logs" / "slurm" / f"sft-{r}.log" for r in (0, 1)]
    tails = "\n".join(f.read_text(errors="replace")[-1500:] for f in logs if f.exists())
    assert info.state == "COMPLETED" and info.nodes == "n[1-2]", f"{info}\n{tails}"
    summary = json.loads((out / "summary.json").read_text())
    assert [s["step"] for s in summary["steps"]] == list(range(6))
    assert "sft rank 1/2" in tails, "the second node trained as rank 1 of 2"
    assert dcp_ranks(out / "checkpoints" / "step_5" / "dcp") == {0, 1}, "DCP shards of both ranks"
    assert json.loads((out / "slurm" / "job.json").read_text())["job_id"] == job
    assert "[slurm]" not in (out / "configs" / "sft.toml").read_text()


def multi_node_rl_args(model: Path, out: Path, job_name: str, port: int) -> list[str]:
    """The tiny two-step rl job on two nodes: vLLM on n1 serving on `port`, trainer + controller on n2."""
    from tests.helpers import free_port

    args = ["rl", "--model.path", str(model), "--output-dir", str(out), "--max-steps", "2"]
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
    args += ["--inference.port", str(port), "--slurm.rdzv-port", str(free_port())]
    return args + ["--deployment.type", "multi_node", "--slurm.job-name", job_name]


@pytest.mark.e2e
def test_multi_node_rl_job_places_inference_trainer_and_one_controller(
    slurm, prefect_api, tiny_model, tmp_path, capsys
):
    """n1 serves vLLM; n2 runs the torchrun trainer (rendezvous on itself) and the controller."""
    from tests.helpers import free_port

    out = tmp_path / "mn"
    job = submit(capsys, *multi_node_rl_args(tiny_model, out, "rl-2n", free_port()))["job_id"]
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


@pytest.mark.e2e
def test_multi_node_rl_job_stops_its_controller_once_no_inference_step_is_left(
    slurm, prefect_api, tiny_model, tmp_path, capsys
):
    """n1's inference step exits at once (a socket of this test holds its port). The controller,
    given n1's url, would poll it for inference.startup_timeout_s (900 s); the job stops it instead,
    says which step died and where its log is, and fails."""
    import socket

    from tests.helpers import free_port

    out = tmp_path / "dead"
    port = free_port()
    with socket.socket() as held:  # bound, not listening: `rlfleet inference` finds the port in use
        held.bind(("127.0.0.1", port))
        args = multi_node_rl_args(tiny_model, out, "rl-dead", port)
        job = submit(capsys, *args, "--inference.startup-timeout-s", "900")["job_id"]
        info = wait_job(job, timeout_s=300)  # the controller alone would wait 900 s
    show(slurm, job)
    logs = out / "logs" / "slurm"
    said = (logs / f"job-{job}.out").read_text(errors="replace")
    inference = (logs / "inference-0.log").read_text(errors="replace")
    assert (info.state, info.exit_code) == ("FAILED", "1:0"), f"{info}\n{said}"
    assert f"inference.port: port(s) [{port}] on 127.0.0.1 are in use" in inference, inference
    assert f"inference step on n1 (rank 0) exited with code 2; its log: {logs}/inference-0.log" in said, said
    assert "no inference step left: stopping the controller" in said
    assert "controller stopped" in said
    assert not (out / "summary.json").exists()
