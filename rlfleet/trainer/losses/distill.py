"""On-policy distillation as a per-token advantage term (`[loss.distill]`).

The student samples; a frozen teacher scores the student's own tokens; the per-token reverse KL
KL(pi_student || pi_teacher) at the sampled token, estimated by its one-sample k1 form
log pi_student(x_t) - log pi_teacher(x_t), is a per-token penalty. As in Thinking Machines'
"On-Policy Distillation" (Lu et al., 2025; Agarwal et al., 2024, "On-Policy Distillation of Language
Models: Learning from Self-Generated Mistakes") and prime-rl's on-policy distillation, it enters
the policy gradient through the advantage, beside (or instead of) the task's:

    A_t = A + coef x (log pi_teacher(x_t | x_<t) - log pi_student(x_t | x_<t))

(A = 0 with `with_reward = false`: pure distillation) with log pi_student the sampler's logprob (the policy that sampled x_t, vLLM's), so the term is a
fixed per-token reward and every loss type (PPO-clip, GSPO, CISPO, a user's) optimises it as it
optimises A. Tokens the teacher finds likelier than the student did are pushed up, the others down.
"""

from __future__ import annotations

import torch


def distill_advantages(
    advantages: torch.Tensor,
    sampler_logprobs: torch.Tensor,
    teacher_logprobs: torch.Tensor,
    mask: torch.Tensor,
    coef: float,
) -> torch.Tensor:
    """Per-token advantages [B, T]: `advantages` ([B] per sequence or [B, T]) plus coef x
    (teacher - sampler) logprob on the loss tokens (0 elsewhere)."""
    adv = advantages.unsqueeze(-1) if advantages.dim() == 1 else advantages
    gap = (teacher_logprobs - sampler_logprobs) * mask.to(sampler_logprobs.dtype)
    return adv.expand_as(sampler_logprobs) + coef * gap


def reverse_kl_sum(
    sampler_logprobs: torch.Tensor, teacher_logprobs: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """Sum over loss tokens of the k1 estimate of KL(student || teacher): what distillation drives to 0."""
    return ((sampler_logprobs - teacher_logprobs) * mask.to(sampler_logprobs.dtype)).sum()
