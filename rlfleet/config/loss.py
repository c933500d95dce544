"""`[loss]`: which policy loss the trainer optimizes, and the terms every loss type shares.

`type` picks one loss behind one seam (rlfleet/trainer/losses/): a built-in name or a user's
`path/to/file.py:fn`, loaded here so a bad reference fails at config load, naming `loss.type`.
Options left unset take the type's published defaults (GSPO's tiny sequence-ratio clip, Dr.GRPO's
constant normaliser, ...), written into the resolved config so a run records what it used.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from rlfleet.config.base import NonEmptyStr, Strict
from rlfleet.usercode import UserCodeError, load_object

BUILTIN_LOSSES = ("grpo", "dr_grpo", "gspo", "cispo")

# (clip_low, clip_high): grpo/dr_grpo DAPO's clip-higher on the token ratio; gspo its paper's range on
# the sequence ratio (GSPO sec. 5.1); cispo the IS weight's clip, no lower bound (MiniMax-M1 sec. 3.1).
CLIP_DEFAULTS = {"grpo": (0.2, 0.28), "dr_grpo": (0.2, 0.28), "gspo": (3e-4, 4e-4), "cispo": (1.0, 0.28)}
AGGREGATION_DEFAULTS = {"dr_grpo": "constant", "gspo": "seq_mean_token_mean"}

Aggregation = Literal["token_mean", "seq_mean_token_sum", "seq_mean_token_mean", "constant"]
ISCorrection = Literal["none", "token_tis", "seq_tis", "token_mis", "seq_mis"]

# Keys that lived under [trainer] before [loss] existed; old configs keep working.
LEGACY_TRAINER_KEYS = ("clip_low", "clip_high", "mask_ratio_low", "mask_ratio_high")


def resolve_user_loss(ref: str) -> str:
    """`file.py:fn` made absolute (the trainer may run from another directory), after checking it
    names a callable with the reward functions' resolver (rlfleet/usercode.py)."""
    if not callable(load_object(ref)):
        raise ValueError(f"{ref!r} is not callable")
    target, _, name = ref.rpartition(":")
    return f"{Path(target).resolve()}:{name}" if target.endswith(".py") else ref


class DistillConfig(Strict):
    """On-policy distillation (docs/algorithms.md): the teacher's logprob of each sampled token
    joins the advantage, A_t += coef x (teacher logprob - student logprob)."""

    teacher: NonEmptyStr = Field(
        description="The `[[served]]` model whose logprobs the student is pulled to."
    )
    coef: float = Field(1.0, gt=0.0, description="Weight of the per-token reverse-KL term in the advantage.")
    with_reward: bool = Field(
        True,
        description="True: the term is added to the task's advantage (mixed); False: pure distillation, "
        "the task's advantage is dropped (rewards are still computed and logged).",
    )


class LossConfig(Strict):
    """The policy loss; defaults are today's GRPO loss exactly (token-level PPO-clip, clip-higher,
    ratio mask, token mean over the step, no KL, no entropy, no IS correction)."""

    type: str = Field(
        "grpo",
        description=f"{' | '.join(BUILTIN_LOSSES)} | `path/file.py:fn` (a per-token loss: docs/algorithms.md).",
    )
    clip_low: float | None = Field(None, ge=0.0, le=1.0, description="Unset: the type's (CLIP_DEFAULTS).")
    clip_high: float | None = Field(None, ge=0.0, description="Unset: the type's (CLIP_DEFAULTS).")
    mask_ratio_low: float = Field(
        0.125,
        ge=0.0,
        description="is_correction none: tokens whose trainer/sampler ratio is below leave the loss.",
    )
    mask_ratio_high: float = Field(
        8.0,
        gt=1.0,
        description="is_correction none: tokens whose trainer/sampler ratio is above leave the loss.",
    )
    aggregation: Aggregation | None = Field(
        None, description="Unset: constant for dr_grpo, seq_mean_token_mean for gspo, else token_mean."
    )
    normalizer: float | None = Field(
        None,
        gt=0.0,
        description="The constant aggregation's divisor; unset: orchestrator.max_tokens x the step's "
        "sequences.",
    )
    kl_coef: float = Field(
        0.0, ge=0.0, description="KL penalty to the initial weights; > 0 loads a frozen copy."
    )
    kl_estimator: Literal["k1", "k2", "k3"] = Field(
        "k3", description="k1: the log ratio; k2: its square / 2; k3: GRPO's, unbiased and non-negative."
    )
    entropy_coef: float = Field(0.0, ge=0.0, description="Entropy bonus: loss -= coef x entropy.")
    is_correction: ISCorrection = Field(
        "none",
        description="none: the ratio is against the sampler's logprobs (masked by mask_ratio_*); else the "
        "trainer's own, detached, times an IS weight trainer/sampler truncated (tis) or masked (mis).",
    )
    is_low: float = Field(0.5, ge=0.0, description="*_mis: weights below leave the loss.")
    is_high: float = Field(
        2.0, gt=0.0, description="*_tis: the weight's cap C; *_mis: weights above leave the loss."
    )
    distill: DistillConfig | None = Field(
        None, description="On-policy distillation from a served teacher, beside any loss type; unset: off."
    )

    @model_validator(mode="after")
    def _type_defaults(self) -> LossConfig:
        """Fill what the user left unset from the type, outside `model_fields_set`: a config dumped
        with `exclude_unset` and given another type (an ablation grid) gets that type's defaults."""
        low, high = CLIP_DEFAULTS.get(self.type, CLIP_DEFAULTS["grpo"])
        for key, default in (
            ("clip_low", low),
            ("clip_high", high),
            ("aggregation", AGGREGATION_DEFAULTS.get(self.type, "token_mean")),
        ):
            if getattr(self, key) is None:
                object.__setattr__(self, key, default)
        return self

    @field_validator("type")
    @classmethod
    def _type(cls, v: str) -> str:
        if v in BUILTIN_LOSSES:
            return v
        if ":" not in v:
            raise ValueError(f"unknown loss {v!r}: one of {', '.join(BUILTIN_LOSSES)}, or `path/file.py:fn`")
        try:
            return resolve_user_loss(v)
        except UserCodeError as e:
            raise ValueError(str(e)) from None

    @model_validator(mode="after")
    def _bounds(self) -> LossConfig:
        if self.mask_ratio_low >= self.mask_ratio_high:
            raise ValueError("mask_ratio_low must be below mask_ratio_high")
        if self.is_correction.endswith("_mis") and self.is_low >= self.is_high:
            raise ValueError(f"is_low ({self.is_low}) must be below is_high ({self.is_high})")
        return self

    @property
    def builtin(self) -> bool:
        return self.type in BUILTIN_LOSSES


def move_legacy_keys(data: Any) -> Any:
    """`trainer.clip_low` & co. (their home before [loss]) as `loss.*`; both set is an error."""
    trainer = data.get("trainer") if isinstance(data, dict) else None
    if not isinstance(trainer, dict) or not any(k in trainer for k in LEGACY_TRAINER_KEYS):
        return data
    loss = data.get("loss") or {}
    if not isinstance(loss, dict):
        return data
    trainer, loss = dict(trainer), dict(loss)
    for key in LEGACY_TRAINER_KEYS:
        if key in trainer:
            if key in loss:
                raise ValueError(f"trainer.{key} is the old name of loss.{key}: set only loss.{key}")
            loss[key] = trainer.pop(key)
    return {**data, "trainer": trainer, "loss": loss}


class WithLoss(Strict):
    """The `[loss]` section of the configs that train with it (the RL run and its trainer job)."""

    loss: LossConfig = Field(default_factory=LossConfig)

    @model_validator(mode="before")
    @classmethod
    def _legacy_loss_keys(cls, data: Any) -> Any:
        return move_legacy_keys(data)
