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


# -- [loss], [advantage], [trainer.lr_schedule] ---------------------------------------------------
def test_algorithm_defaults_are_todays():
    cfg = load(RLConfig, ["--model.path", "m"])
    loss, job = cfg.loss, cfg.trainer_job()
    assert (loss.type, loss.clip_low, loss.clip_high, loss.aggregation) == ("grpo", 0.2, 0.28, "token_mean")
    assert (loss.mask_ratio_low, loss.mask_ratio_high, loss.is_correction) == (0.125, 8.0, "none")
    assert loss.kl_coef == 0.0 and loss.entropy_coef == 0.0
    assert (cfg.advantage.type, cfg.advantage.std_normalize) == ("grpo", True)
    assert cfg.trainer.lr_schedule.decay == "constant" and cfg.trainer.lr_schedule.warmup_steps == 0
    assert job.loss == loss  # the trainer gets the run's [loss]
    assert tomllib.loads(to_toml(job))["loss"]["clip_low"] == 0.2  # resolved defaults are recorded


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--loss.type", "ppo2"], "loss.type: unknown loss 'ppo2': one of grpo, dr_grpo, gspo, cispo"),
        (["--loss.type", "nope/missing.py:fn"], "loss.type: 'nope/missing.py:fn': no file"),
        (["--loss.type", "no_such_module_xyz:fn"], "loss.type: 'no_such_module_xyz:fn': cannot import"),
        (
            ["--loss.type", "math:no_such_fn"],
            "loss.type: 'math:no_such_fn': math has no attribute 'no_such_fn'",
        ),
        (["--loss.type", "math:pi"], "loss.type: 'math:pi' is not callable"),
        (["--loss.aggregation", "mean"], "loss.aggregation"),
        (["--loss.is-correction", "tis"], "loss.is_correction"),
        (["--loss.kl-estimator", "k4"], "loss.kl_estimator"),
        (["--loss.kl-coef", "-1"], "loss.kl_coef"),
        (["--loss.is-correction", "token_mis", "--loss.is-low", "3"], "is_low (3.0) must be below is_high"),
        (["--advantage.type", "ppo"], "advantage.type"),
        (["--trainer.lr-schedule.decay", "exp"], "trainer.lr_schedule.decay"),
        (["--trainer.lr-schedule", "step"], "trainer.lr_schedule.decay"),
        (["--trainer.lr-schedule.min-lr-ratio", "2"], "trainer.lr_schedule.min_lr_ratio"),
        (
            ["--trainer.clip-low", "0.1", "--loss.clip-low", "0.2"],
            "trainer.clip_low is the old name of loss.clip_low",
        ),
    ],
)
def test_bad_algorithm_options_fail_at_load_naming_the_field(argv, expected):
    with pytest.raises(ConfigError) as ei:
        load(RLConfig, ["--model.path", "m", *argv])
    assert expected in str(ei.value)


def test_type_defaults_and_the_old_trainer_keys():
    """gspo and cispo bring their papers' clip ranges, dr_grpo its constant normaliser; the clip and
    ratio-mask keys that lived under [trainer] still work, as their [loss] names."""
    gspo = load(RLConfig, ["--model.path", "m", "--loss.type", "gspo"]).loss
    assert (gspo.clip_low, gspo.clip_high, gspo.aggregation) == (3e-4, 4e-4, "seq_mean_token_mean")
    cispo = load(RLConfig, ["--model.path", "m", "--loss.type", "cispo", "--loss.clip-high", "4"]).loss
    assert (cispo.clip_low, cispo.clip_high) == (1.0, 4.0)
    assert load(RLConfig, ["--model.path", "m", "--loss.type", "dr_grpo"]).loss.aggregation == "constant"
    old = load(
        RLConfig, ["--model.path", "m", "--trainer.clip-high", "0.3", "--trainer.mask-ratio-low", "0.5"]
    )
    assert (old.loss.clip_high, old.loss.mask_ratio_low) == (0.3, 0.5)
    job = TrainerJobConfig.model_validate({"model": {"path": "m"}, "trainer": {"clip_low": 0.1}})
    assert job.loss.clip_low == 0.1
    assert (
        load(RLConfig, ["--model.path", "m", "--trainer.lr-schedule", "cosine"]).trainer.lr_schedule.decay
        == "cosine"
    )


# -- [orchestrator.shaping] -----------------------------------------------------------------------
def test_batch_shaping_is_off_by_default_and_loads_from_toml(tmp_path):
    shaping = load(RLConfig, ["--model.path", "m"]).orchestrator.shaping
    assert (shaping.dynamic_sampling, shaping.overlong, shaping.refill_cap(16)) == (False, "none", 16)
    f = _write(
        tmp_path,
        "s.toml",
        '[orchestrator.shaping]\ndynamic_sampling = true\nmax_refill = 4\noverlong = "soft"\n'
        "overlong_buffer = 4\n",
    )
    cfg = load(RLConfig, ["--model.path", "m", "@", f])
    assert cfg.orchestrator.shaping.refill_cap(16) == 4 and cfg.orchestrator.shaping.overlong_buffer == 4
    assert RLConfig.model_validate(tomllib.loads(to_toml(cfg))) == cfg


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (
            ["--orchestrator.shaping.overlong", "soft", "--orchestrator.shaping.overlong-buffer", "16"],
            "orchestrator: shaping.overlong_buffer (16) must be below max_tokens (16)",
        ),
        (
            ["--orchestrator.shaping.overlong", "soft"],
            "orchestrator.shaping: overlong = 'soft' needs overlong_buffer",
        ),
        (
            ["--orchestrator.shaping.overlong-buffer", "4"],
            "orchestrator.shaping: overlong_buffer applies only with overlong = 'soft' (got 'none')",
        ),
        (
            ["--orchestrator.shaping.max-refill", "4"],
            "orchestrator.shaping: max_refill applies only with dynamic_sampling = true",
        ),
        (["--orchestrator.shaping.overlong", "cut"], "orchestrator.shaping.overlong"),
        (["--orchestrator.shaping.max-refill", "-1"], "orchestrator.shaping.max_refill"),
        (["--orchestrator.shaping.dynamic-sampling", "yes please"], "orchestrator.shaping.dynamic_sampling"),
    ],
)
def test_bad_batch_shaping_fails_at_load_naming_the_field(argv, expected):
    with pytest.raises(ConfigError) as ei:
        load(RLConfig, ["--model.path", "m", *argv])
    assert expected in str(ei.value)


def test_an_ablation_over_loss_type_gives_each_point_its_types_defaults(tmp_path):
    """The grid re-validates what the user set, so a point's `loss.type` picks its own clip range
    and aggregation; a value the user set stays set."""
    from rlfleet.config.grid import expand_grid

    base = load(RLConfig, ["--model.path", str(tmp_path), "--output-dir", str(tmp_path / "out")])
    points = {
        o["loss.type"]: cfg.loss
        for _, o, cfg in expand_grid(base, {"loss.type": ["grpo", "gspo", "dr_grpo"]})
    }
    assert (points["grpo"].clip_low, points["grpo"].clip_high, points["grpo"].aggregation) == (
        0.2,
        0.28,
        "token_mean",
    )
    assert (points["gspo"].clip_low, points["gspo"].clip_high) == (3e-4, 4e-4)
    assert points["gspo"].aggregation == "seq_mean_token_mean" and points["dr_grpo"].aggregation == "constant"
    pinned = load(
        RLConfig,
        ["--model.path", str(tmp_path), "--output-dir", str(tmp_path / "o"), "--loss.clip-high", "0.3"],
    )
    ((_, _, gspo),) = expand_grid(pinned, {"loss.type": ["gspo"]})
    assert (gspo.loss.clip_low, gspo.loss.clip_high) == (3e-4, 0.3)


def test_a_cpu_replica_decodes_every_sample_in_flight_in_one_batch():
    """vLLM-CPU's server decodes 128 sequences at a time unless told more: a step's samples in
    flight per replica, at least 128; a GPU replica keeps vLLM's default; a set value stays."""
    from rlfleet.config.gpu_defaults import gpu_defaults

    def seqs(gpus: list[str], *args: str) -> int | None:
        cfg = load(RLConfig, ["--model.path", "m", "--orchestrator.batch-size", "32", *args])
        return gpu_defaults(cfg, gpus, gpus).inference.max_num_seqs

    assert seqs([], "--orchestrator.group-size", "8") == 256
    assert seqs([], "--orchestrator.group-size", "8", "--orchestrator.max-async-level", "1") == 512
    assert seqs([], "--orchestrator.group-size", "8", "--inference.num-replicas", "3") == 128
    assert seqs([], "--orchestrator.group-size", "2") == 128
    assert seqs([], "--inference.max-num-seqs", "64") == 64
    assert seqs(["0"]) is None


# -- a GPU trainer's micro-batches by tokens (rlfleet/config/gpu_defaults.py)---------------------
def _gpu_job(tmp_path, *args: str) -> RLConfig:
    """One GPU shared by vLLM and the trainer, a model of Qwen2-0.5B's depth and width (config.json
    only: placement reads no weights)."""
    model = tmp_path / "m05b"
    model.mkdir(exist_ok=True)
    (model / "config.json").write_text('{"hidden_size": 896, "num_hidden_layers": 24}')
    gpus = ["--deployment.num-inference-gpus", "1", "--deployment.num-train-gpus", "1"]
    return load(RLConfig, ["--model.path", str(model), *gpus, *args])


def _resolved(cfg: RLConfig, gpu_bytes: int | None = 80 << 30) -> RLConfig:
    from rlfleet.config.gpu_defaults import gpu_defaults
    from rlfleet.config.placement import assign_gpus

    inf, train = assign_gpus(cfg.deployment, visible=["0"])
    return gpu_defaults(cfg, inf, train, gpu_bytes=gpu_bytes)


def test_a_sequence_count_is_a_cap_never_refused_up_front(tmp_path):
    """`micro_batch_size 64` means at most 64 sequences (as in TRL): more than could fit an 80 GiB
    GPU beside vLLM is still accepted, as a cap the trainer meets with fewer (trainer/budget.py)."""
    mml = ["--inference.max-model-len", "4200"]
    cfg = _resolved(_gpu_job(tmp_path, "--orchestrator.micro-batch-size", "64", *mml))
    assert cfg.trainer.micro_batch_tokens == 64 * 4200
    huge = _resolved(
        _gpu_job(tmp_path, "--orchestrator.micro-batch-size", "8", "--inference.max-model-len", "262144")
    )
    assert huge.trainer.micro_batch_tokens == 8 * 262144


def test_a_gpu_trainer_counts_tokens_and_a_cpu_trainer_sequences(tmp_path, monkeypatch):
    """A GPU trainer with packed rows: a sequence count becomes micro_batch_size x max_model_len
    tokens, trainer.micro_batch_tokens wins when set, unset leaves the trainer to size itself; a CPU
    trainer keeps its 32 sequences and no token budget."""
    from rlfleet.config.gpu_defaults import gpu_defaults

    mml = ["--inference.max-model-len", "4608", "--orchestrator.max-tokens", "4096"]
    assert (
        _resolved(_gpu_job(tmp_path, "--orchestrator.micro-batch-size", "8", *mml)).trainer.micro_batch_tokens
        == 8 * 4608
    )
    assert _resolved(_gpu_job(tmp_path, *mml)).trainer.micro_batch_tokens is None
    both = _gpu_job(
        tmp_path, "--orchestrator.micro-batch-size", "8", "--trainer.micro-batch-tokens", "16384", *mml
    )
    assert _resolved(both).trainer.micro_batch_tokens == 16384
    # GPU memory unknown (no nvidia-smi): converted, and the trainer's probe checks it at its first batch
    monkeypatch.setattr("rlfleet.config.gpu_defaults.gpu_memory", lambda gpu: None)
    unknown = _gpu_job(
        tmp_path, "--orchestrator.micro-batch-size", "8", "--inference.max-model-len", "262144"
    )
    assert _resolved(unknown, gpu_bytes=None).trainer.micro_batch_tokens == 8 * 262144
    cpu = load(RLConfig, ["--model.path", "m", "--orchestrator.micro-batch-size", "8"])
    resolved = gpu_defaults(cpu, [], [])
    assert (resolved.orchestrator.micro_batch_size, resolved.trainer.micro_batch_tokens) == (8, None)


def test_a_row_too_big_for_the_gpu_is_refused_naming_the_field_and_a_token_cap_is_not(tmp_path):
    row = ["--inference.max-model-len", str(2 << 20)]
    with pytest.raises(
        ConfigError, match=r"orchestrator\.seq_len: one packed row of 2097152 tokens .* at most \d+ tokens"
    ):
        _resolved(_gpu_job(tmp_path, *row))
    # 2M tokens of checkpointed layer inputs take 84 GiB: more than the trainer's 0.55 of a 100 GiB
    # GPU beside vLLM, less than all of it while vLLM sleeps (inference.sleep)
    with pytest.raises(ConfigError, match=r"orchestrator\.seq_len"):
        _resolved(_gpu_job(tmp_path, *row), gpu_bytes=100 << 30)
    assert _resolved(_gpu_job(tmp_path, *row, "--inference.sleep", "true"), gpu_bytes=100 << 30)
    big = _resolved(_gpu_job(tmp_path, "--trainer.micro-batch-tokens", str(4 << 20)))
    assert big.trainer.micro_batch_tokens == 4 << 20  # a cap: the trainer takes what fits under it


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
