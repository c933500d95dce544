"""RL's objective for the train step (trainer/train.py `Objective`): the `[loss]` policy loss of
each micro-batch against the sampler's logprobs, and the step's metrics from its statistics."""

from __future__ import annotations

from typing import Any

import torch

from rlfleet.config.loss import LossConfig
from rlfleet.trainer.losses.compose import micro_batch_loss, policy_fn
from rlfleet.trainer.losses.distill import distill_advantages, reverse_kl_sum
from rlfleet.trainer.losses.inputs import StepNorm
from rlfleet.trainer.reference import Reference


class PolicyLoss:
    """`norm`: the step's normalisers (an int: its loss-token count only); `ref`: the frozen
    reference (trainer/reference.py), needed when `cfg.kl_coef` > 0."""

    def __init__(
        self,
        cfg: LossConfig,
        norm: StepNorm | int,
        temperature: float = 1.0,
        ref: Reference | None = None,
    ):
        if cfg.kl_coef > 0 and ref is None:
            raise ValueError("loss.kl_coef > 0 needs the reference model (rlfleet/trainer/reference.py)")
        self.cfg, self.temperature, self.ref = cfg, temperature, ref
        self.norm = norm if isinstance(norm, StepNorm) else StepNorm(norm)
        self.term = policy_fn(cfg)
        self.want_entropy = cfg.entropy_coef > 0

    def __call__(
        self, mb: dict[str, torch.Tensor], logprobs: torch.Tensor, entropy: torch.Tensor | None
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        ref_lp = None
        if self.cfg.kl_coef > 0:
            with torch.no_grad():
                ref_lp, _ = self.ref(mb["input_ids"], self.temperature, mb.get("position_ids"))
        adv = mb["advantages"]
        adv = adv[:, 1:] if adv.dim() == 2 else adv
        sampler, mask = mb["old_logprobs"][:, 1:], mb["loss_mask"][:, 1:]
        distill_kl = None
        if self.cfg.distill is not None:
            if "teacher_logprobs" not in mb:
                raise ValueError("loss.distill: the batch carries no teacher_logprobs")
            teacher = mb["teacher_logprobs"][:, 1:]
            adv = adv if self.cfg.distill.with_reward else torch.zeros_like(adv)  # pure distillation
            adv = distill_advantages(adv, sampler, teacher, mask, self.cfg.distill.coef)
            distill_kl = reverse_kl_sum(sampler, teacher, mask)
        loss, stats = micro_batch_loss(
            self.cfg,
            self.term,
            logprobs,
            sampler,
            adv,
            mask,
            self.norm,
            mb.get("position_ids"),
            ref_lp,
            entropy,
        )
        if distill_kl is not None:
            stats["distill_kl_sum"] = distill_kl
        return loss, stats

    def metrics(self, totals: dict[str, float]) -> dict[str, Any]:
        n = max(self.norm.tokens, 1)
        metrics = {
            "clip_frac": totals.get("clipped_tokens", 0.0) / n,
            "mask_frac": totals["masked_tokens"] / n,
            "ratio_mean": totals["ratio_sum"] / n,
            "mismatch_kl": totals["mismatch_kl_sum"] / n,
            "logprob_diff_max": totals["logprob_diff_max"],  # max |trainer - sampler| logprob of a token
            "num_loss_tokens": self.norm.tokens,
        }
        for key, name in (
            ("entropy_sum", "entropy"),
            ("kl_sum", "kl"),
            ("is_weight_sum", "is_weight_mean"),
            ("is_masked_tokens", "is_mask_frac"),
            ("distill_kl_sum", "distill_kl"),
        ):
            if key in totals:
                metrics[name] = totals[key] / n
        return metrics
