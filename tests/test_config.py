import tomllib

import pytest

from rlfleet.config.loader import ConfigError, load, parse_args, to_toml
from rlfleet.config.models import (
    EvalJobConfig,
    InferenceJobConfig,
    RLConfig,
    SFTConfig,
    TrainerJobConfig,
)


def _write(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(text)
    return str(p)


@pytest.fixture
def two_files(tmp_path):
    a = _write(
        tmp_path,
        "a.toml",
        'output_dir = "out/a"\nseed = 1\n[model]\npath = "m"\n'
        "[orchestrator]\nbatch_size = 4\ngroup_size = 4\n[trainer]\nlr = 0.1\n",
    )
    b = _write(
        tmp_path,
        "b.toml",
        "seed = 2\n[orchestrator]\nbatch_size = 8\n[trainer]\nbetas = [0.5, 0.6]\n",
    )
    return a, b


@pytest.mark.parametrize("form", ["spaced", "attached"])
def test_files_compose_left_to_right_with_deep_merge(two_files, form):
    a, b = two_files
    argv = ["@", a, "@", b] if form == "spaced" else [f"@{a}", f"@{b}"]
    cfg = load(RLConfig, argv)
    assert cfg.seed == 2  # scalar replaced by the later file
    assert cfg.output_dir == "out/a"  # kept from the earlier file
    assert cfg.orchestrator.batch_size == 8  # table merged, key replaced
    assert cfg.orchestrator.group_size == 4  # table merged, sibling kept
    assert cfg.trainer.lr == 0.1
    assert cfg.trainer.betas == (0.5, 0.6)
    assert cfg.model.path == "m"


def test_order_matters(two_files):
    a, b = two_files
    cfg = load(RLConfig, ["@", b, "@", a])
    assert cfg.seed == 1
    assert cfg.orchestrator.batch_size == 4


@pytest.mark.parametrize(
    "override",
    [
        ["--orchestrator.batch-size", "32"],
        ["--orchestrator.batch-size=32"],
        ["--orchestrator.batch_size", "32"],
    ],
)
def test_cli_override_beats_files(two_files, override):
    a, b = two_files
    # overrides win even when they come before the files
    cfg = load(RLConfig, [*override, "@", a, "@", b])
    assert cfg.orchestrator.batch_size == 32
    assert cfg.orchestrator.group_size == 4


def test_override_values_parse_as_toml_literals():
    data = parse_args(
        [
            "--a.int",
            "7",
            "--a.float=2.5",
            "--a.exp",
            "3e-4",
            "--a.yes",
            "true",
            "--a.no=false",
            "--a.quoted",
            '"42"',
            "--a.bare",
            "hello",
            "--a.arr",
            "[1, 2]",
            "--a.flag",
        ]
    )
    a = data["a"]
    assert a["int"] == 7 and type(a["int"]) is int
    assert a["float"] == 2.5 and type(a["float"]) is float
    assert a["exp"] == pytest.approx(3e-4)
    assert a["yes"] is True and a["no"] is False
    assert a["quoted"] == "42"
    assert a["bare"] == "hello"
    assert a["arr"] == [1, 2]
    assert a["flag"] is True


def test_overrides_reach_model_with_types():
    cfg = load(
        RLConfig,
        [
            "--model.path",
            "m",
            "--trainer.lr",
            "1e-2",
            "--inference.enforce-eager",
            "false",
            "--run-name",
            "x",
        ],
    )
    assert cfg.trainer.lr == pytest.approx(1e-2)
    assert cfg.inference.enforce_eager is False
    assert cfg.run_name == "x"
    assert cfg.name == "x"


def test_a_number_given_to_a_string_field_is_that_string():
    """`--inference.cpu-threads-bind 0` parses as the TOML integer 0; the field is a string."""
    cfg = load(RLConfig, ["--model.path", "m", "--inference.cpu-threads-bind", "0", "--run-name", "2024"])
    assert cfg.inference.cpu_threads_bind == "0" and cfg.run_name == "2024"


def test_null_unsets_what_a_file_set():
    """The tiny example caps micro_batch_size; `null` gives the default (no cap) back."""
    job = ["@", "examples/tiny/rl.toml", "--model.path", "m"]
    assert load(RLConfig, job).orchestrator.micro_batch_size == 64
    assert (
        load(RLConfig, [*job, "--orchestrator.micro-batch-size", "null"]).orchestrator.micro_batch_size
        is None
    )
    with pytest.raises(ConfigError, match="orchestrator.group_size"):
        load(RLConfig, [*job, "--orchestrator.group-size", "null"])


@pytest.mark.parametrize(
    ("argv", "fields"),
    [
        (["--orchestrator.batchsize", "3"], ["orchestrator.batchsize"]),
        (["--trainer.lr", "abc"], ["trainer.lr"]),
        (["--orchestrator.group-size", "1"], ["orchestrator.group_size"]),
        (
            ["--orchestrator.max-tokens", "64", "--inference.max-model-len", "64"],
            ["orchestrator.max_tokens", "inference.max_model_len"],
        ),
        (["--trainer.betas", "[0.9, 1.0]"], ["trainer.betas"]),
    ],
)
def test_invalid_values_name_the_dotted_field(argv, fields):
    with pytest.raises(ConfigError) as ei:
        load(RLConfig, ["--model.path", "m", *argv])
    for field in fields:
        assert field in str(ei.value)


def test_missing_model_path_is_reported():
    with pytest.raises(ConfigError, match="model"):
        load(RLConfig, [])


def test_missing_file(tmp_path):
    missing = tmp_path / "nope.toml"
    with pytest.raises(ConfigError, match="not found"):
        load(RLConfig, ["@", str(missing)])
    with pytest.raises(ConfigError, match="not found"):
        load(RLConfig, [f"@{missing}"])


def test_invalid_toml(tmp_path):
    bad = _write(tmp_path, "bad.toml", "[model\npath = ")
    with pytest.raises(ConfigError, match="invalid TOML"):
        load(RLConfig, ["@", bad])


@pytest.mark.parametrize("argv", [["stray"], ["--model.path", "m", "stray", "more"], ["@"]])
def test_stray_or_incomplete_arguments(argv):
    with pytest.raises(ConfigError):
        parse_args(argv)


def test_config_error_is_a_value_error():
    assert issubclass(ConfigError, ValueError)


def _full_cfg():
    return load(
        RLConfig,
        [
            "--model.path",
            "m",
            "--output-dir",
            "out/run7",
            "--seed",
            "5",
            "--max-steps",
            "9",
            "--trainer.lr",
            "0.01",
            "--orchestrator.batch-size",
            "3",
            "--inference.port",
            "9000",
        ],
    )


def test_job_configs_carry_shared_fields():
    cfg = _full_cfg()
    t, i = cfg.trainer_job(), cfg.inference_job()
    assert isinstance(t, TrainerJobConfig)
    assert isinstance(i, InferenceJobConfig)
    for job in (t, i):
        assert job.output_dir == "out/run7"
        assert job.seed == 5
        assert job.model == cfg.model
    assert t.max_steps == 9
    assert t.trainer == cfg.trainer and t.trainer.lr == 0.01
    assert i.inference == cfg.inference and i.inference.port == 9000


def test_to_toml_round_trips(tmp_path):
    cfg = _full_cfg()
    text = to_toml(cfg)
    assert RLConfig.model_validate(tomllib.loads(text)) == cfg
    # and through the loader, as a file
    path = _write(tmp_path, "dump.toml", text)
    assert load(RLConfig, ["@", path]) == cfg
    for job in (cfg.trainer_job(), cfg.inference_job()):
        assert type(job).model_validate(tomllib.loads(to_toml(job))) == job


# -- who checks what: a section its own fields, the root what spans sections, preflight the machine --
@pytest.mark.parametrize("job", [RLConfig, InferenceJobConfig, EvalJobConfig], ids=lambda m: m.__name__)
def test_a_sections_own_rule_holds_in_every_config_that_has_the_section(job):
    """The replicas' ports (port + num_replicas - 1) must exist, whichever command runs them."""
    with pytest.raises(ConfigError, match=r"inference\.port: port \+ num_replicas - 1 \(65535 \+ 2 - 1\)"):
        load(job, ["--model.path", "m", "--inference.port", "65535", "--inference.num-replicas", "2"])


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (
            ["--orchestrator.seq-len", "256"],
            "orchestrator.seq_len (256) must be at least inference.max_model_len (512)",
        ),
        (
            [
                "--deployment.type",
                "multi_node",
                "--deployment.gpus-per-node",
                "3",
                "--inference.tensor-parallel-size",
                "2",
            ],
            "inference.tensor_parallel_size (2) must divide deployment.gpus_per_node (3)",
        ),
        # vLLM sleeps on the GPU the trainer steps on: a CPU trainer, or async steps, cannot share it
        (
            ["--inference.sleep", "true", "--deployment.num-inference-gpus", "1"],
            "inference.sleep: vLLM sleeps",
        ),
        (
            ["--inference.sleep", "true", "--orchestrator.max-async-level", "1"]
            + ["--deployment.num-inference-gpus", "1", "--deployment.num-train-gpus", "1"],
            "orchestrator.max_async_level = 0",
        ),
        # a section's validator names its own field, shown under the section's path
        (
            [
                "--orchestrator.batch-size",
                "1",
                "--orchestrator.env",
                '[{type = "repeat"}, {type = "repeat", name = "b"}]',
            ],
            "orchestrator.env: weights give ['b'] none of batch_size=1 prompts",
        ),
        (["--eval.temperature", "0", "--eval.rollouts-per-example", "4"], "eval.temperature: greedy (0)"),
    ],
)
def test_rules_across_sections_fail_at_load_naming_the_fields(argv, expected):
    with pytest.raises(ConfigError) as ei:
        load(RLConfig, ["--model.path", "m", *argv])
    assert expected in str(ei.value)


def test_sft_takes_no_inference_gpus():
    with pytest.raises(ConfigError, match="deployment.num_inference_gpus: SFT runs no inference"):
        load(
            SFTConfig, ["--model.path", "m", "--data.path", "d.jsonl", "--deployment.num-inference-gpus", "1"]
        )


def test_placement_needs_the_visible_gpus_only_at_launch(monkeypatch):
    """One inference and one trainer GPU load anywhere; at launch, inference.sleep needs them to be
    one GPU (one visible), and too few visible GPUs are refused naming the fields."""
    from rlfleet.config.placement import check_gpus

    one_each = ["--deployment.num-inference-gpus", "1", "--deployment.num-train-gpus", "1"]
    cfg = load(RLConfig, ["--model.path", "m", *one_each, "--inference.sleep", "true"])
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    p, problems = check_gpus(cfg)
    assert (p.inference_gpus, p.trainer_gpus, problems) == (["0"], ["0"], [])
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    p, [problem] = check_gpus(cfg)
    assert (p.inference_gpus, p.trainer_gpus) == (["0"], ["1"])
    assert problem.startswith(
        "inference.sleep needs vLLM and a trainer rank on the same GPU(s); they got ['0'] and ['1']"
    )
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    p, [problem] = check_gpus(cfg)
    assert p is None and "deployment.num_inference_gpus, deployment.num_train_gpus" in problem


def test_a_sequence_longer_than_the_models_positions_is_refused_at_launch(tmp_path):
    from rlfleet.config.model import ModelConfig, check_positions

    (tmp_path / "config.json").write_text('{"max_position_embeddings": 512}')
    model = ModelConfig(path=str(tmp_path))
    assert check_positions(model, 512, "data.max_seq_len") == []
    assert check_positions(model, 513, "data.max_seq_len") == [
        "data.max_seq_len: 513 > the model's 512 positions"
    ]
    assert check_positions(ModelConfig(path=str(tmp_path / "none")), 10**6, "data.max_seq_len") == []
