"""The algorithm's sections ([loss], [advantage], [trainer.lr_schedule], [orchestrator.shaping]):
today's defaults, each type's own defaults (also per grid point), and bad values refused at load
naming the field."""

import tomllib

import pytest

from rlfleet.config.loader import ConfigError, load, to_toml
from rlfleet.config.models import RLConfig, TrainerJobConfig


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
    f = tmp_path / "s.toml"
    f.write_text(
        '[orchestrator.shaping]\ndynamic_sampling = true\nmax_refill = 4\noverlong = "soft"\n'
        "overlong_buffer = 4\n"
    )
    cfg = load(RLConfig, ["--model.path", "m", "@", str(f)])
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
