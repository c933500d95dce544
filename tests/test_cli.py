"""The CLI refuses bad input before anything starts, names the field, and writes nothing."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from rlfleet.cli import main
from rlfleet.config.loader import ConfigError, load


@pytest.fixture
def base(tiny_model, tmp_path):
    return ["--model.path", str(tiny_model), "--output-dir", str(tmp_path / "out")]


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--orchestrator.batchsize", "3"], "orchestrator.batchsize"),
        (["--trainer.lr", "fast"], "trainer.lr"),
        (["--orchestrator.group-size", "1"], "orchestrator.group_size"),
        (["--max-steps", "0"], "max_steps"),
        (["--inference.port", "80"], "inference.port"),
        (["--orchestrator.max-tokens", "600"], "inference.max_model_len"),
        (["--deployment.num-inference-gpus", "3"], "deployment.num_inference_gpus"),
        (["--orchestrator.env", "chess"], "orchestrator.env"),
        (["--orchestrator.batch-size", "-4"], "orchestrator.batch_size"),
        (["--orchestrator.temperature", "0"], "orchestrator.temperature"),
        (["--orchestrator.max-async-level", "-1"], "orchestrator.max_async_level"),
        (["--trainer.betas", "[0.9, 1.5]"], "trainer.betas"),
        (["--loss.clip-low", "1.5"], "loss.clip_low"),
        (["--trainer.lr"], "--trainer.lr needs a value"),
        (["--model.dtype", "float8"], "model.dtype"),
        (["--model.path", ""], "model.path"),
        (["--inference.port", "65535", "--inference.num-replicas", "2"], "inference.port"),
        (
            ["--inference.tensor-parallel-size", "2", "--deployment.num-inference-gpus", "1"],
            "deployment.num_inference_gpus",
        ),
        (["--deployment.num-train-gpus", "2"], "deployment.num_train_gpus"),
        (["--max-steps", "2.5"], "max_steps"),
        (["--optimizer.lr", "1"], "optimizer"),
        (["--weights.transport", "rdma"], "weights.transport"),
        (["--weights.transport", "cuda_ipc"], "cuda_ipc needs a trainer rank on every vLLM GPU"),
        (
            ["--deployment.placement", "colocated", "--deployment.num-train-gpus", "2"],
            "deployment.num_inference_gpus (0) must equal deployment.num_train_gpus (2)",
        ),
        (["--weights.transport", "nccl", "--inference.urls", '["http://h:1"]'], "use filesystem"),
        (["stray"], "unexpected argument 'stray'"),
    ],
)
def test_bad_config_fails_naming_the_field(base, tmp_path, capsys, args, expected):
    assert main(["rl", *base, *args]) == 2
    assert expected in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_cuda_ipc_across_two_gpus_fails_before_anything_starts(base, tmp_path, capsys, monkeypatch):
    """Two visible GPUs give vLLM and the trainer one each: no memory to share, so cuda_ipc is refused."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    gpus = ["--deployment.num-inference-gpus", "1", "--deployment.num-train-gpus", "1"]
    assert main(["rl", *base, *gpus, "--weights.transport", "cuda_ipc"]) == 2
    err = capsys.readouterr().err
    assert "weights.transport: cuda_ipc maps the trainer's GPU memory" in err and "['0'] and ['1']" in err
    assert not (tmp_path / "out").exists()


def test_missing_model_dir(tmp_path, capsys):
    assert main(["rl", "--model.path", str(tmp_path / "nope"), "--output-dir", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "model.path" in err and "rlfleet model tiny" in err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("toml", "expected"),
    [
        ("trainer = 3\n", "trainer: Input should be a valid dictionary"),
        ("[trainer\nlr = 1\n", "invalid TOML"),
        ("[trainer]\nlearning_rate = 1e-3\n", "trainer.learning_rate"),
    ],
)
def test_bad_config_file(base, tmp_path, capsys, toml, expected):
    (tmp_path / "bad.toml").write_text(toml)
    assert main(["rl", "@", str(tmp_path / "bad.toml"), *base]) == 2
    assert expected in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_missing_config_file(base, tmp_path, capsys):
    assert main(["rl", "@", str(tmp_path / "nope.toml"), *base]) == 2
    assert "config file not found" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_model_dir_without_weights(tiny_model, tmp_path, capsys):
    broken = tmp_path / "model"
    broken.mkdir()
    for f in tiny_model.iterdir():
        if f.suffix != ".safetensors":
            (broken / f.name).write_bytes(f.read_bytes())
    assert main(["rl", "--model.path", str(broken), "--output-dir", str(tmp_path / "out")]) == 2
    assert "lacks *.safetensors" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_unwritable_output_dir(base, tmp_path, capsys):
    # root ignores mode bits; procfs directories stay unwritable even for root
    ro = Path("/proc/1") if os.geteuid() == 0 else tmp_path / "ro"
    ro.mkdir(mode=0o500, exist_ok=True)
    try:
        assert main(["rl", *base, "--output-dir", str(ro / "run")]) == 2
        assert "not writable" in capsys.readouterr().err
        assert not (ro / "run").exists()
    finally:
        if ro != Path("/proc/1"):
            ro.chmod(0o700)


def test_output_dir_under_a_file(base, tmp_path, capsys):
    (tmp_path / "afile").write_text("x")
    assert main(["rl", *base, "--output-dir", str(tmp_path / "afile" / "run")]) == 2
    assert "output_dir" in capsys.readouterr().err


def test_busy_port(base, tmp_path, capsys):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        assert main(["rl", *base, "--inference.port", str(port)]) == 2
    assert f"[{port}]" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_more_gpus_than_visible(base, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert main(["rl", *base, "--deployment.num-inference-gpus", "1"]) == 2
    assert "1 inference + 0 trainer GPUs but 0 are visible" in capsys.readouterr().err


def test_unknown_command(capsys):
    assert main(["fly"]) == 2
    assert "rlfleet rl" in capsys.readouterr().err


ENV_TASK = """
def exact(completion, answer):
    return float(completion.strip() == answer)

def needs_secret(completion, secret):
    return 1.0

def undocumented(a, b):
    return a
"""


@pytest.mark.parametrize(
    ("env_toml", "expected"),
    [
        ('type = "chess"\n', "orchestrator.env.0: Input tag 'chess' found using 'type'"),
        (
            'type = "python"\n[orchestrator.env.args]\ndataset = "d.jsonl"\n',
            "orchestrator.env.0.python.args.rewards: Field required",
        ),
        (
            'type = "python"\nweight = 0\n[orchestrator.env.args]\ndataset = "d.jsonl"\nrewards = ["t.py:exact"]\n',
            "orchestrator.env.0.python.weight",
        ),
        (
            'type = "python"\n[orchestrator.env.args]\ndataset = "nope.jsonl"\nrewards = ["t.py:exact"]\n',
            "orchestrator.env.0.args.dataset: nope.jsonl: no such file or directory",
        ),
        (
            'type = "python"\n[orchestrator.env.args]\ndataset = "d.jsonl"\nrewards = ["t.py:missing"]\n',
            "orchestrator.env.0.args.rewards.0.fn: 't.py:missing': t.py has no attribute 'missing'",
        ),
        (
            'type = "python"\n[orchestrator.env.args]\ndataset = "d.jsonl"\nrewards = ["no_such_pkg.mod:f"]\n',
            "orchestrator.env.0.args.rewards.0.fn: 'no_such_pkg.mod:f': cannot import",
        ),
        (
            'type = "python"\n[orchestrator.env.args]\ndataset = "d.jsonl"\nrewards = ["other.py:f"]\n',
            "orchestrator.env.0.args.rewards.0.fn: 'other.py:f': no file",
        ),
        (
            'type = "python"\n[orchestrator.env.args]\ndataset = "d.jsonl"\nprompt_column = "question"\nrewards = ["t.py:exact"]\n',
            "orchestrator.env.0.args.prompt_column: no column 'question'",
        ),
        (
            'type = "python"\n[orchestrator.env.args]\ndataset = "d.jsonl"\nrewards = ["t.py:needs_secret"]\n',
            "orchestrator.env.0.args.rewards.0.fn: t.py:needs_secret needs ['secret']",
        ),
        (
            'type = "python"\n[orchestrator.env.args]\ndataset = "d.jsonl"\nrewards = ["t.py:exact"]\ntools = ["t.py:undocumented"]\nmax_turns = 2\n',
            "orchestrator.env.0.args.tools: 't.py:undocumented': no tool schema",
        ),
        (
            'type = "python"\n[orchestrator.env.args]\ndataset = "d.jsonl"\nrewards = ["t.py:exact"]\nmax_turns = 3\n',
            "max_turns > 1 needs tools or env_response",
        ),
        (
            'type = "python"\n[orchestrator.env.args]\ndataset = "d.jsonl"\nreward = ["t.py:exact"]\n',
            "orchestrator.env.0.python.args.reward: Extra inputs are not permitted",
        ),
        (
            'type = "verifiers"\n[orchestrator.env.args]\nmodule = "no_such_taskset"\n',
            "orchestrator.env.0.args.module: cannot load taskset 'no_such_taskset'",
        ),
        (
            'type = "repeat"\n[[orchestrator.env]]\ntype = "repeat"\n',
            "environment names must be unique; repeated: ['repeat']",
        ),
        (
            'type = "repeat"\nweight = 100\n[[orchestrator.env]]\ntype = "repeat"\nname = "rare"\n',
            "weights give ['rare'] none of batch_size=16 prompts",
        ),
    ],
)
def test_bad_env_fails_before_anything_starts(base, tmp_path, capsys, monkeypatch, env_toml, expected):
    (tmp_path / "t.py").write_text(ENV_TASK)
    (tmp_path / "d.jsonl").write_text('{"prompt": "1+1=", "answer": "2"}\n')
    (tmp_path / "env.toml").write_text("[[orchestrator.env]]\n" + env_toml)
    monkeypatch.chdir(tmp_path)  # user code references are relative to the working directory
    assert main(["rl", "@", str(tmp_path / "env.toml"), *base]) == 2
    assert expected in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_the_rl_flow_module_leaves_torch_transformers_and_prefects_server_for_later():
    """`rlfleet rl` imports the flow before Prefect's server and vLLM start; torch and transformers
    (~6 s on 2 cores) load beside vLLM's start instead (the tokenizer thread, the first batch).
    Prefect's server module (FastAPI, SQLAlchemy: ~3 s) is imported by Prefect's client where it
    starts a temporary server: a run on a shared API never needs it."""
    import subprocess
    import sys

    heavy = ("torch", "transformers", "prefect.server.api.server")
    code = (
        f"import sys, rlfleet.runs.early, rlfleet.flows.rl; print([m for m in {heavy} if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_early_start_stops_what_no_flow_adopted(base, tmp_path):
    """`rlfleet rl` starts a run's vLLM and trainer before the flow (runs/early.py); if the flow
    never takes them (it failed first, or resolved another inference config), leaving the `with`
    stops them and frees the run's lock."""
    from rlfleet.config.models import RLConfig
    from rlfleet.runs import early as early_mod
    from rlfleet.runs.configs import resolve
    from rlfleet.runs.early import early_start, started_early
    from rlfleet.runs.handles import RunHandles
    from rlfleet.store import RunStore
    from tests.helpers import free_port

    cfg = load(RLConfig, [*base, "--inference.port", str(free_port())])
    with early_start(cfg):
        early = early_mod._RUNS[cfg.output_dir]
        (replica,) = early.pool.replicas
        assert replica.process.alive()
        assert (tmp_path / "out/run/controller.pid").exists()
        trainer = early.trainer.process  # a fresh run's trainer starts with vLLM
        assert trainer.alive() and (tmp_path / "out/configs/trainer.toml").is_file()
    assert not replica.process.alive() and not trainer.alive() and not early_mod._RUNS
    assert not (tmp_path / "out/run/controller.pid").exists()

    # a run with a step already: its flow discards the dead life's work first, so no early trainer
    RunStore(tmp_path / "out").write_json("metrics/step_0.json", {})
    with early_start(cfg):
        assert started_early(cfg.output_dir) and early_mod._RUNS[cfg.output_dir].trainer is None
    (tmp_path / "out/metrics/step_0.json").unlink()

    with early_start(cfg):
        early = early_mod._RUNS[cfg.output_dir]
        early.pool.ensure()  # serving: its port is taken, and the flow's preflight must not count it
        with pytest.raises(ConfigError, match="inference.port"):
            resolve(cfg)
        assert started_early(cfg.output_dir) and resolve(cfg, ports=False)
        trainer = early.trainer.process
        other = cfg.model_copy(update={"inference": cfg.inference.model_copy(update={"max_model_len": 64})})
        handles = RunHandles.for_run(other)
        assert handles.pool is not early.pool
        assert early.pool.closed and not early.pool.replicas and not early_mod._RUNS
        assert handles.trainer is not early.trainer and not trainer.alive()
