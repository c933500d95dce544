"""`[trainer.lr_schedule]`: warm-up then constant / linear / cosine, its lr in the step's metrics,
and a resumed trainer continuing the schedule exactly; here with a non-default `[loss]`
(dr_grpo, KL to the initial weights, entropy bonus, token TIS) and RLOO advantages end to end
through the real trainer loop, on CPU, without vLLM."""

from __future__ import annotations

import json
import math
import random

import pytest
import torch

from rlfleet.config.advantage import AdvantageConfig
from rlfleet.config.loss import LossConfig
from rlfleet.config.models import ModelConfig, TrainerConfig, TrainerJobConfig
from rlfleet.config.schedule import LRScheduleConfig
from rlfleet.orchestrator.rollout import publish_rollout, single_turn
from rlfleet.orchestrator.step_batches import BatchSpec, publish_batches
from rlfleet.store import RunStore
from rlfleet.trainer import loop, rl
from rlfleet.trainer.schedule import lr_factor, make_scheduler


def test_lr_factor_by_hand():
    """Warm-up (s + 1) / k for s < k; then progress p = (s - k) / (max_steps - k):
    linear 1 - p, cosine (1 + cos(pi p)) / 2, scaled into [min_lr_ratio, 1]."""
    cos = LRScheduleConfig(decay="cosine", warmup_steps=3, min_lr_ratio=0.1)
    lin = LRScheduleConfig(decay="linear", warmup_steps=3, min_lr_ratio=0.1)
    want_warm = [1 / 3, 2 / 3, 1.0, 1.0]
    assert [lr_factor(cos, 10, s) for s in range(4)] == pytest.approx(want_warm)
    assert lr_factor(cos, 10, 5) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 2 / 7)))
    assert lr_factor(lin, 10, 5) == pytest.approx(0.1 + 0.9 * (1 - 2 / 7))
    assert lr_factor(lin, 10, 9) == pytest.approx(0.1 + 0.9 / 7)  # the last step still learns
    assert lr_factor(cos, 10, 10) == pytest.approx(0.1) == lr_factor(lin, 10, 10)
    assert lr_factor(LRScheduleConfig(), 10, 7) == 1.0


def test_scheduler_rebuilt_at_a_step_has_that_steps_lr():
    """make_scheduler(start=s) after an optimizer state is loaded == an uninterrupted run at s."""
    cfg = LRScheduleConfig(decay="cosine", warmup_steps=3, min_lr_ratio=0.1)
    p = torch.nn.Parameter(torch.ones(3))
    opt = torch.optim.AdamW([p], lr=0.5)
    sched, lrs, saved = make_scheduler(opt, 0.5, cfg, 10), [], None
    for s in range(10):
        lrs.append(opt.param_groups[0]["lr"])
        p.grad = torch.ones(3)
        opt.step()
        if s == 4:
            saved = opt.state_dict()
        sched.step()
    opt2 = torch.optim.AdamW([torch.nn.Parameter(torch.ones(3))], lr=0.5)
    opt2.load_state_dict(saved)
    make_scheduler(opt2, 0.5, cfg, 10, start=5)
    assert opt2.param_groups[0]["lr"] == lrs[5]
    assert lrs == [0.5 * lr_factor(cfg, 10, s) for s in range(10)]


def _publish(store: RunStore, steps: int) -> None:
    rng = random.Random(0)
    for step in range(steps):
        records = []
        for g in range(3):
            prompt = [1] + [rng.randrange(4, 100) for _ in range(rng.randint(3, 6))]
            for _ in range(4):
                completion = [rng.randrange(4, 100) for _ in range(rng.randint(2, 6))]
                lps = [-rng.uniform(3.0, 6.0) for _ in completion]
                records.append(
                    {"group": g, "prompt_uid": f"{step}-{g}", **single_turn(prompt, completion, lps),
                     "reward": rng.random(), "policy_step": step - 1, "completion": ""}
                )  # fmt: skip
        publish_rollout(store, step, records, {"policy_step": step - 1})
        publish_batches(
            store, step, records, BatchSpec(6, advantage=AdvantageConfig(type="rloo"), max_tokens=6)
        )


def _metrics(out, steps):
    return [json.loads((out / f"metrics/step_{s}.json").read_text()) for s in steps]


def test_a_resumed_trainer_continues_the_schedule_exactly(tiny_model, tmp_path, monkeypatch):
    """Warm-up 2 + cosine over 6 steps: a trainer that dies after step 2's checkpoint and is
    relaunched trains steps 3-5 at exactly the lrs (and to the losses) of an uninterrupted one."""

    def job(out):
        return TrainerJobConfig(
            output_dir=str(out),
            max_steps=6,
            model=ModelConfig(path=str(tiny_model)),
            trainer=TrainerConfig(
                lr=1e-2,
                checkpoint_interval=1,
                lr_schedule=LRScheduleConfig(decay="cosine", warmup_steps=2, min_lr_ratio=0.1),
            ),
            loss=LossConfig(type="dr_grpo", kl_coef=0.05, entropy_coef=0.01, is_correction="token_tis"),
        )

    runs, real = {}, rl.load_micro_batches

    def dies_at_3(store, step):
        if step == 3:
            raise RuntimeError("killed")
        return real(store, step)

    starts = []
    monkeypatch.setattr(loop, "make_scheduler", lambda *a: starts.append(a[-1]) or make_scheduler(*a))
    for name in ("straight", "resumed"):
        out = tmp_path / name
        _publish(RunStore(out), 6)
        if name == "resumed":
            monkeypatch.setattr(rl, "load_micro_batches", dies_at_3)
            with pytest.raises(RuntimeError, match="killed"):
                rl.run_trainer(job(out))
            monkeypatch.setattr(rl, "load_micro_batches", real)
        rl.run_trainer(job(out))
        runs[name] = _metrics(out, range(6))
    assert starts == [0, 0, 3]  # the relaunch resumed from checkpoint 2
    straight, resumed = runs["straight"], runs["resumed"]
    assert [m["lr"] for m in straight] == [
        1e-2 * lr_factor(job(tmp_path).trainer.lr_schedule, 6, s) for s in range(6)
    ]
    assert [m["lr"] for m in resumed] == [m["lr"] for m in straight]
    for a, b in zip(straight[3:], resumed[3:], strict=True):
        assert a["loss"] == pytest.approx(b["loss"], abs=1e-6)
    assert all(m["kl"] >= 0 and "entropy" in m and "is_weight_mean" in m for m in straight)
    assert straight[0]["kl"] == pytest.approx(0.0, abs=1e-9)  # step 0: the policy is the reference
    assert straight[-1]["kl"] > 0


@pytest.fixture
def _restore_torch_threads():
    """The SFT example sets trainer.num_threads = 1, which is process-wide."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


@pytest.mark.usefixtures("_restore_torch_threads")
def test_sft_follows_the_schedule_and_resumes_it(tiny_model, tmp_path, monkeypatch):
    """SFT shares the optimizer and the schedule: a run killed after checkpoint 2 and resumed logs
    the lrs of an uninterrupted one, each lr x lr_factor(step)."""
    from rlfleet.trainer import sft as engine
    from tests.helpers import example_config

    args = [
        "--max-steps",
        "6",
        "--trainer.checkpoint-interval",
        "3",
        "--trainer.lr-schedule.warmup-steps",
        "2",
    ]
    args += ["--trainer.lr-schedule.decay", "linear", "--trainer.lr-schedule.min-lr-ratio", "0.2"]
    straight = engine.run_sft(example_config(tiny_model, tmp_path / "a", *args), progress=False)
    real = engine.step_batches

    def dies_at_3(*a, **kw):
        if len(calls) == 3:
            raise RuntimeError("killed")
        calls.append(1)
        return real(*a, **kw)

    calls: list[int] = []
    monkeypatch.setattr(engine, "step_batches", dies_at_3)
    cfg = example_config(tiny_model, tmp_path / "b", *args)
    with pytest.raises(RuntimeError, match="killed"):
        engine.run_sft(cfg, progress=False)
    monkeypatch.setattr(engine, "step_batches", real)
    resumed = engine.run_sft(cfg, progress=False)
    lrs = [s["lr"] for s in straight["steps"]]
    assert lrs == [cfg.trainer.lr * lr_factor(cfg.trainer.lr_schedule, 6, s) for s in range(6)]
    assert [s["lr"] for s in resumed["steps"]] == lrs
    assert [s["loss"] for s in resumed["steps"]] == pytest.approx(
        [s["loss"] for s in straight["steps"]], rel=1e-4
    )
