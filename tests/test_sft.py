"""The `sft` flow: it lowers the tiny model's loss, resumes without redoing steps, masks only what it
should train on, and refuses bad data before writing anything."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from prefect.artifacts import Artifact
from transformers import AutoTokenizer

from rlfleet.cli import main
from rlfleet.config.loader import load, validate
from rlfleet.config.models import SFTConfig
from rlfleet.store import RunStore
from rlfleet.trainer.sft import run_sft
from rlfleet.trainer.sft_data import DataError, encode, encode_chat, load_dataset, step_rows
from tests.helpers import EXAMPLE, dataset_nll, dcp_ranks, example_config


@pytest.fixture(autouse=True)
def _restore_torch_threads():
    """The example sets trainer.num_threads = 1, which is process-wide; other tests keep theirs."""
    import torch

    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def chat_rows(n: int) -> list[dict]:
    """A chat version of `repeat`: the user names a letter, the assistant repeats it."""
    letters = "abcdefgh"
    return [
        {
            "messages": [
                {"role": "system", "content": "repeat"},
                {"role": "user", "content": letters[i % 8] * (4 + i % 5)},
                {"role": "assistant", "content": letters[i % 8] * 8},
            ]
        }
        for i in range(n)
    ]


def mean(xs: list[float]) -> float:
    return sum(xs) / len(xs)


def test_flow_lowers_the_tiny_models_loss(prefect_api, tiny_model, tmp_path):
    from rlfleet.flows.sft import sft

    out = tmp_path / "run"
    cfg = example_config(tiny_model, out, "--max-steps", "15", "--run-name", "sft-test")
    nll_before = dataset_nll(str(tiny_model), cfg)

    summary = sft(config=cfg)

    losses = [s["loss"] for s in summary["steps"]]
    assert [s["step"] for s in summary["steps"]] == list(range(15))
    assert mean(losses[-3:]) < 0.25 * mean(losses[:3]), losses
    # The published weights are a loadable HF directory and fit the data better than the base model.
    assert summary["weights"] == str(out / "weights" / "step_14")
    nll_after = dataset_nll(summary["weights"], cfg)
    assert nll_after < 0.5 * nll_before, (nll_before, nll_after)

    store = RunStore(out)
    assert store.complete_steps("checkpoints") == [9, 14]
    assert store.read_json("summary.json")["last3_mean_loss"] == summary["last3_mean_loss"]
    assert (out / "loss_curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert load(SFTConfig, ["@", str(out / "configs" / "sft.toml")]) == cfg
    metrics = store.read_json("metrics/step_0.json")
    assert metrics["loss"] == losses[0] and metrics["loss_tokens"] > 0 and metrics["seconds"] > 0

    table = Artifact.get("sft-test-sft-loss")
    rows = json.loads(table.data) if isinstance(table.data, str) else table.data
    assert [r["step"] for r in rows] == list(range(15))


def test_flow_resumes_from_the_checkpoint_without_redoing_steps(prefect_api, tiny_model, tmp_path):
    from rlfleet.flows.sft import sft

    out = tmp_path / "run"
    sft(config=example_config(tiny_model, out, "--max-steps", "4", "--trainer.checkpoint-interval", "2"))
    first = {p.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in (out / "metrics").iterdir()}
    assert sorted(first) == [f"step_{i}.json" for i in range(4)]

    summary = sft(
        config=example_config(tiny_model, out, "--max-steps", "7", "--trainer.checkpoint-interval", "2")
    )

    assert [s["step"] for s in summary["steps"]] == list(range(7))
    after = {p.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in (out / "metrics").iterdir()}
    assert {k: after[k] for k in first} == first  # steps 0-3 were not trained again
    assert RunStore(out).complete_steps("checkpoints") == [1, 3, 5, 6]
    assert RunStore(out).read_json("checkpoints/step_6/manifest.json")["cursor"] == {"next_step": 7}


def test_a_task_retry_resumes_from_the_latest_checkpoint(prefect_api, tiny_model, tmp_path, monkeypatch):
    import rlfleet.trainer.sft as engine
    from rlfleet.flows.sft import sft

    real_step, calls = engine.step_batches, []

    def flaky_step(*args, **kwargs):
        calls.append(1)
        if len(calls) == 4:  # step 3 of the first attempt; checkpoints are at steps 1, 3, 5
            raise RuntimeError("injected trainer crash")
        return real_step(*args, **kwargs)

    monkeypatch.setattr(engine, "step_batches", flaky_step)
    out = tmp_path / "run"
    cfg = example_config(
        tiny_model,
        out,
        "--max-steps",
        "6",
        "--trainer.checkpoint-interval",
        "2",
        "--tasks.retry-delay-s",
        "0",
    )
    summary = sft(config=cfg)

    assert [s["step"] for s in summary["steps"]] == list(range(6))
    # 3 steps before the crash, then the retry redid only what the step-1 checkpoint did not cover.
    assert len(calls) == 3 + 1 + 4
    assert RunStore(out).complete_steps("checkpoints") == [1, 3, 5]


def test_a_trainer_error_is_recorded_and_fails_the_run_with_its_message(
    prefect_api, tiny_model, tmp_path, monkeypatch
):
    """SFT records its errors as the RL trainer does (`run/trainer_error.json`, which the task reads
    when the trainer runs as torchrun ranks): one that will recur fails the run at once, naming it."""
    import rlfleet.trainer.sft as engine
    from rlfleet.flows.sft import sft

    real, steps = engine.step_batches, []

    def bad_row(ds, tok, data, step, seed):
        steps.append(step)
        if step == 2:
            raise DataError("data.path: row 7 has no assistant message")
        return real(ds, tok, data, step, seed)

    monkeypatch.setattr(engine, "step_batches", bad_row)
    out = tmp_path / "run"
    cfg = example_config(tiny_model, out, "--max-steps", "4", "--tasks.retry-delay-s", "0")
    with pytest.raises(DataError, match="row 7 has no assistant message"):
        sft(config=cfg)

    assert steps == [0, 1, 2]  # deterministic: not retried
    error = RunStore(out).read_json("run/trainer_error.json")
    assert (error["step"], error["type"], error["deterministic"]) == (2, "DataError", True)
    assert error["message"] == "data.path: row 7 has no assistant message"


def test_resumed_training_matches_an_uninterrupted_run(tiny_model, tmp_path):
    """The cursor is the step and the optimizer state is restored: steps after a resume see the same
    batches and produce the same losses as a run that never stopped. (Chat rows from parquet.)"""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = tmp_path / "chat.parquet"
    pq.write_table(pa.Table.from_pylist(chat_rows(24)), rows)
    args = ["--data.path", str(rows), "--data.batch-size", "8", "--trainer.checkpoint-interval", "3"]
    assert load_dataset(example_config(tiny_model, tmp_path, *args).data).format == "chat"

    straight = run_sft(example_config(tiny_model, tmp_path / "a", "--max-steps", "6", *args), progress=False)
    run_sft(example_config(tiny_model, tmp_path / "b", "--max-steps", "3", *args), progress=False)
    resumed = run_sft(example_config(tiny_model, tmp_path / "b", "--max-steps", "6", *args), progress=False)

    losses = [s["loss"] for s in straight["steps"]]
    assert [s["loss"] for s in resumed["steps"]] == pytest.approx(losses, rel=1e-4)
    assert mean(losses[-2:]) < 0.8 * mean(losses[:2]), losses


def test_a_rerun_before_the_first_checkpoint_redoes_every_step_from_the_base_model(tiny_model, tmp_path):
    """A life killed before its first checkpoint left metrics, weights and a half-written
    checkpoint: the rerun resumes at step 0 all the same, discards them, and trains as a run that
    never stopped (trainer/resume.py: one rule with or without a checkpoint)."""
    import shutil

    args = ["--max-steps", "3", "--trainer.checkpoint-interval", "10"]
    straight = run_sft(example_config(tiny_model, tmp_path / "a", *args), progress=False)
    dead = tmp_path / "b"
    shutil.copytree(tmp_path / "a" / "metrics", dead / "metrics")  # its records of steps 0-2
    shutil.copytree(tmp_path / "a" / "weights", dead / "weights")
    (dead / "checkpoints" / ".tmp-step_2-0123abcd").mkdir(parents=True)  # its last write, cut
    planted = {p.name: p.stat().st_mtime_ns for p in (dead / "metrics").iterdir()}

    resumed = run_sft(example_config(tiny_model, dead, *args), progress=False)

    assert [s["loss"] for s in resumed["steps"]] == pytest.approx(
        [s["loss"] for s in straight["steps"]], rel=1e-4
    )
    assert all((dead / "metrics" / n).stat().st_mtime_ns != t for n, t in planted.items()), (
        "every step redone"
    )
    assert not list((dead / "checkpoints").glob(".tmp-*"))


def test_two_ranks_via_the_flow_match_one_process_and_resume_on_one(
    prefect_api, tiny_model, tmp_path, monkeypatch
):
    """`rlfleet sft` with deployment.num_train_gpus = 2 runs the engine as 2 torchrun ranks (FSDP2 on
    gloo here: CUDA_VISIBLE_DEVICES only names the devices) on packed rows; its losses equal one
    process's, and its 2-rank DCP checkpoint resumes in one process."""
    args = ["--trainer.checkpoint-interval", "2", "--data.pack", "--data.micro-batch-size", "4"]
    args += ["--trainer.param-dtype", "float32"]
    ref = run_sft(example_config(tiny_model, tmp_path / "ref", "--max-steps", "6", *args), progress=False)

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    out = tmp_path / "dist"
    two = [*args, "--max-steps", "4", "--deployment.num-train-gpus", "2", "--trainer.fsdp", "on"]
    argv = ["sft", "@", str(EXAMPLE / "sft.toml"), "--model.path", str(tiny_model), "--output-dir", str(out)]
    assert main([*argv, "--data.path", str(EXAMPLE / "sft_repeat.jsonl"), *two]) == 0
    logs = out / "logs" / "sft"
    assert "sft rank 0/2" in (logs / "rank_0.log").read_text()  # one log file per rank
    assert "sft rank 1/2" in (logs / "rank_1.log").read_text()
    assert "sft rank 1/2" not in (logs / "rank_0.log").read_text()
    assert dcp_ranks(out / "checkpoints" / "step_3" / "dcp") == {0, 1}  # shards of both ranks
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")

    resumed = run_sft(example_config(tiny_model, out, "--max-steps", "6", *args), progress=False)
    want = [s["loss"] for s in ref["steps"]]
    assert want[0] != want[-1]
    assert [s["loss"] for s in resumed["steps"]] == pytest.approx(want, rel=1e-4, abs=1e-6)


def test_step_rows_cover_each_epoch_once_and_depend_only_on_seed_and_step():
    n, batch = 10, 4
    first_epochs = [i for step in range(5) for i in step_rows(n, step, batch, seed=0, shuffle=True)]
    assert sorted(first_epochs[:10]) == list(range(10)) and sorted(first_epochs[10:20]) == list(range(10))
    assert first_epochs[:10] != first_epochs[10:20]  # a fresh permutation per epoch
    assert step_rows(n, 3, batch, 0, True) == first_epochs[12:16]
    assert step_rows(n, 3, batch, 1, True) != step_rows(n, 3, batch, 0, True)
    assert step_rows(n, 1, batch, 0, shuffle=False) == [4, 5, 6, 7]


def test_chat_masks_only_assistant_tokens(tiny_model):
    tok = AutoTokenizer.from_pretrained(tiny_model)
    messages = [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "u1"},
        {"role": "assistant", "content": "A1"},
        {"role": "user", "content": "u2"},
        {"role": "assistant", "content": "B2"},
    ]
    ex = encode_chat(tok, messages)
    expected = tok.apply_chat_template(messages, tokenize=True, return_dict=False)
    assert ex.input_ids == list(expected)  # the same ids inference sees
    trained = "".join(tok.decode([t]) for t, m in zip(ex.input_ids, ex.loss_mask, strict=True) if m)
    ignored = "".join(tok.decode([t]) for t, m in zip(ex.input_ids, ex.loss_mask, strict=True) if not m)
    assert trained == "A1</s>\nB2</s>\n"  # assistant content plus the template's end of turn
    assert ignored == "<system>sys\n<user>u1\n<assistant><user>u2\n<assistant>"


def test_prompt_completion_masks_the_completion_and_eos(tiny_model):
    tok = AutoTokenizer.from_pretrained(tiny_model)
    ex = encode(tok, {"prompt": "ccc", "completion": "cccc"}, "prompt_completion", max_seq_len=64)
    assert ex.input_ids[0] == tok.bos_token_id and ex.input_ids[-1] == tok.eos_token_id
    assert ex.loss_mask == [0, 0, 0, 0, 1, 1, 1, 1, 1]
    short = encode(tok, {"prompt": "ccc", "completion": "cccc"}, "prompt_completion", max_seq_len=6)
    assert short.input_ids == ex.input_ids[:6] and short.loss_mask == ex.loss_mask[:6]


def test_chat_template_that_rewrites_history_is_refused(tiny_model):
    tok = AutoTokenizer.from_pretrained(tiny_model)
    # Drops earlier assistant turns' content, as some "thinking" templates do.
    tok.chat_template = (
        "{% for m in messages %}{% if m['role'] == 'assistant' and not loop.last %}<assistant>\n"
        "{% else %}<{{ m['role'] }}>{{ m['content'] }}\n{% endif %}{% endfor %}"
        "{% if add_generation_prompt %}<assistant>{% endif %}"
    )
    msgs = [
        {"role": r, "content": c}
        for r, c in [("user", "a"), ("assistant", "b"), ("user", "c"), ("assistant", "d")]
    ]
    with pytest.raises(DataError, match="renders earlier turns differently"):
        encode_chat(tok, msgs)


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    ("make_data", "extra", "expected"),
    [
        (lambda d: d / "missing.jsonl", [], "data.path"),
        (lambda d: _write(d / "rows.csv", "prompt,completion\n"), [], "must end in .jsonl or .parquet"),
        (
            lambda d: _write(d / "bad.jsonl", '{"prompt": "a", "completion": "b"}\nnot json\n'),
            [],
            "bad.jsonl:2",
        ),
        (lambda d: _write(d / "odd.jsonl", '{"text": "a"}\n'), [], "data.format: cannot detect"),
        (lambda d: _write(d / "empty.jsonl", "\n"), [], "has no rows"),
        (
            lambda d: _write(d / "pc.jsonl", '{"prompt": "a", "completion": "b"}\n'),
            ["--data.format", "chat"],
            "row 0",
        ),
        (
            lambda d: _write(d / "mixed.jsonl", '{"prompt": "a", "completion": "b"}\n{"prompt": "a"}\n'),
            [],
            "row 1",
        ),
        (
            lambda d: _write(d / "noasst.jsonl", '{"messages": [{"role": "user", "content": "a"}]}\n'),
            [],
            "no assistant message",
        ),
        (lambda d: EXAMPLE / "sft_repeat.jsonl", ["--data.format", "xml"], "data.format"),
        (lambda d: EXAMPLE / "sft_repeat.jsonl", ["--data.batchsize", "4"], "data.batchsize"),
        (lambda d: EXAMPLE / "sft_repeat.jsonl", ["--data.micro-batch-size", "0"], "data.micro_batch_size"),
        (lambda d: EXAMPLE / "sft_repeat.jsonl", ["--data.max-seq-len", "4096"], "data.max_seq_len"),
        (lambda d: EXAMPLE / "sft_repeat.jsonl", ["--trainer.lr", "fast"], "trainer.lr"),
    ],
)
def test_bad_data_fails_before_anything_is_written(tiny_model, tmp_path, capsys, make_data, extra, expected):
    out = tmp_path / "out"
    argv = ["sft", "@", str(EXAMPLE / "sft.toml"), "--model.path", str(tiny_model), "--output-dir", str(out)]
    assert main([*argv, "--data.path", str(make_data(tmp_path)), *extra]) == 2
    assert expected in capsys.readouterr().err
    assert not out.exists()


def test_sft_config_requires_data(tiny_model):
    with pytest.raises(ValueError, match="data"):
        validate(SFTConfig, {"model": {"path": str(tiny_model)}})
