"""The CLI refuses bad input before anything starts, names the field, and writes nothing."""

from __future__ import annotations

import socket

import pytest

from rlfleet.cli import main


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
    ],
)
def test_bad_config_fails_naming_the_field(base, tmp_path, capsys, args, expected):
    assert main(["rl", *base, *args]) == 2
    assert expected in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_missing_model_dir(tmp_path, capsys):
    assert main(["rl", "--model.path", str(tmp_path / "nope"), "--output-dir", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "model.path" in err and "rlfleet model tiny" in err
    assert not (tmp_path / "out").exists()


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
