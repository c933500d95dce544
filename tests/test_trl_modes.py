"""benchmarks/vs_trl.py's TRL samplers on a vLLM server of their own (`--trl-vllm-mode server`,
`--trl-async`), as far as a CPU checks them: the configs TRL builds from the spec, the servers'
command lines and GPUs, the flags a CPU refuses, the picklable reward. The runs themselves need
GPUs: docs/benchmarks/long-generations.md."""

from __future__ import annotations

import importlib
import multiprocessing
import pickle
import subprocess
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pytest

from rlfleet.config.loader import load
from rlfleet.config.models import RLConfig

ROOT = Path(__file__).resolve().parents[1]
BATCH, GROUP = 4, 4


@pytest.fixture
def trl():
    """TRL is the bench extra (`make bench-install`), which `make test` does not install."""
    return pytest.importorskip("trl", reason="TRL is the bench extra: make bench-install")


@pytest.fixture(scope="module")
def bench():
    if str(ROOT / "benchmarks") not in sys.path:
        sys.path.insert(0, str(ROOT / "benchmarks"))
    return {n: importlib.import_module(n) for n in ("vs_trl", "trl_servers", "trl_worker")}


def spec_for(bench, model: Path, tmp: Path, sampler: str, processes: int = 1, *extra: str) -> dict:
    argv = ["@", str(bench["vs_trl"].JOB), "--model.path", str(model), "--output-dir", str(tmp / "rlfleet")]
    argv += ["--orchestrator.batch-size", str(BATCH), "--orchestrator.group-size", str(GROUP), *extra]
    return bench["vs_trl"].trl_spec(load(RLConfig, argv), model, tmp, "cpu", sampler, processes)


def test_server_mode_points_grpo_config_at_the_server(trl, bench, tiny_model, tmp_path):
    from trl import GRPOConfig

    spec, colocated = (
        spec_for(bench, tiny_model, tmp_path, "server"),
        spec_for(bench, tiny_model, tmp_path, "hf"),
    )
    server, grpo = spec["server"], spec["grpo"]
    args = GRPOConfig(**grpo)
    assert args.use_vllm and args.vllm_mode == "server"
    assert args.vllm_server_base_url == f"http://127.0.0.1:{server['port']}"
    loss = load(RLConfig, ["@", str(bench["vs_trl"].JOB), "--model.path", str(tiny_model)]).loss
    assert args.vllm_importance_sampling_mode == "token_mask"  # rlfleet's ratio mask, its bounds
    assert (args.vllm_importance_sampling_clip_min, args.vllm_importance_sampling_clip_max) == (
        loss.mask_ratio_low,
        loss.mask_ratio_high,
    )
    # the server's GPU share and context length go on its command line, not into the trainer's config
    assert "vllm_gpu_memory_utilization" not in grpo and "vllm_max_model_length" not in grpo
    assert server["gpu_memory_utilization"] == 0.9 and server["max_model_len"] > 0
    # everything but the sampler is the HF-generate run's config
    assert {k: v for k, v in grpo.items() if not k.startswith("vllm") and k != "use_vllm"} == {
        k: v for k, v in colocated["grpo"].items() if k != "use_vllm"
    }


def test_async_grpo_config_carries_the_job(trl, bench, tiny_model, tmp_path):
    from trl.experimental.async_grpo import AsyncGRPOConfig

    spec = spec_for(bench, tiny_model, tmp_path, "async", 2, "--orchestrator.max-async-level", "2")
    args = AsyncGRPOConfig(**spec["grpo"])
    assert args.per_device_train_batch_size * args.gradient_accumulation_steps * 2 == BATCH * GROUP
    assert args.num_generations == GROUP and args.max_staleness == 3  # rlfleet's m at k = 2
    cfg = load(RLConfig, ["@", str(bench["vs_trl"].JOB), "--model.path", str(tiny_model)])
    assert args.learning_rate == cfg.trainer.lr and args.max_completion_length == cfg.orchestrator.max_tokens
    assert (args.epsilon, args.epsilon_high) == (cfg.loss.clip_low, cfg.loss.clip_high)
    assert args.token_budget == 0  # a fixed batch x group sequences a step
    assert args.vllm_server_base_url == f"http://127.0.0.1:{spec['server']['port']}"
    assert spec["server"]["kind"] == "async" and spec["sampler"] == "async"


def test_async_renders_prompts_as_rlfleet_tokenizes_them(bench, tiny_model, tmp_path):
    spec = spec_for(bench, tiny_model, tmp_path, "async")
    tok = bench["trl_worker"].plain_tokenizer(spec["model"])
    rendered = [
        tok.apply_chat_template(
            [{"role": "user", "content": r["prompt"]}], add_generation_prompt=True, return_dict=False
        )
        for r in spec["rows"]
    ]
    assert rendered == spec["prompt_ids"]


def test_server_takes_the_last_gpu_and_trainers_the_rest(bench, tmp_path):
    s = bench["trl_servers"]
    assert s.visible_gpus({"CUDA_VISIBLE_DEVICES": "2,5,6,7"}) == ["2", "5", "6", "7"]
    assert s.placement(["2", "5", "6", "7"], 3) == ("7", ["2", "5", "6"])
    assert s.placement(["0", "1", "2", "3"], 1) == ("3", ["0"])
    assert s.server_env({"A": "1"}, "7") == {
        "A": "1",
        "CUDA_VISIBLE_DEVICES": "7",
        "VLLM_SERVER_DEV_MODE": "1",
    }
    with pytest.raises(SystemExit, match=r"1 visible GPU\(s\) \['0'\], 1 trainer process\(es\) need 2"):
        s.placement(["0"], 1)
    with pytest.raises(SystemExit, match="4 visible GPU.* need 5"):
        s.placement(["0", "1", "2", "3"], 4)
    # refused before any server starts
    spec = {"server": {"kind": "server"}, "processes": 1}
    with (
        pytest.raises(SystemExit, match="0 visible"),
        s.serving(spec, {"CUDA_VISIBLE_DEVICES": ""}, tmp_path / "s.log"),
    ):
        pass
    assert not (tmp_path / "s.log").exists()


def test_server_command_lines_parse_as_their_servers_read_them(trl, bench, tiny_model, tmp_path):
    from trl.scripts.vllm_serve import make_parser

    s = bench["trl_servers"]
    trl_server = spec_for(bench, tiny_model, tmp_path, "server")["server"] | {"dtype": "bfloat16"}
    cmd = s.server_command(trl_server)
    assert cmd[:3] == [sys.executable, "-m", "trl.scripts.vllm_serve"]
    args, rest = make_parser().parse_args_and_config(args=cmd[3:], return_remaining_strings=True)
    assert (args.model, args.port, args.tensor_parallel_size, args.dtype) == (
        str(tiny_model),
        trl_server["port"],
        1,
        "bfloat16",
    )
    assert (args.gpu_memory_utilization, args.max_model_len, rest) == (0.9, trl_server["max_model_len"], [])

    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    async_server = spec_for(bench, tiny_model, tmp_path, "async")["server"]
    cmd = s.server_command(async_server)
    assert cmd[:4] == [sys.executable, "-m", "vllm.entrypoints.cli.main", "serve"]
    args = make_arg_parser(FlexibleArgumentParser()).parse_args(cmd[4:])
    # AsyncGRPO names the model by its path and divides by temperature-scaled sampled logprobs
    assert (args.model_tag, args.port, args.max_model_len) == (
        str(tiny_model),
        async_server["port"],
        async_server["max_model_len"],
    )
    assert (args.weight_transfer_config.backend, args.logprobs_mode) == ("nccl", "processed_logprobs")


@pytest.mark.parametrize("script", ["vs_trl.py", "long_tail.py"])
@pytest.mark.parametrize(
    ("flags", "error"),
    [
        (["--trl-vllm", "--trl-vllm-mode", "server"], "--trl-vllm-mode server needs --device cuda"),
        (["--trl-async"], "--trl-async needs --device cuda"),
        (["--trl-vllm-mode", "server", "--device", "cuda"], "--trl-vllm-mode server needs --trl-vllm"),
        (["--trl-async", "--trl-vllm", "--device", "cuda"], "--trl-async samples from its own vLLM server"),
    ],
)
def test_cpu_and_meaningless_combinations_are_refused(script, flags, error):
    cmd = [sys.executable, str(ROOT / "benchmarks" / script), *flags, "--out", "unused.json"]
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and error in r.stderr


def test_the_reward_pickles_and_scores_what_grpo_trainer_decodes(bench, tiny_model):
    from transformers import AutoTokenizer

    from rlfleet.orchestrator.envs.repeat import reward

    w = bench["trl_worker"]
    tok = AutoTokenizer.from_pretrained(tiny_model)
    filler = tok.convert_tokens_to_ids("<extra_0>")  # special: GRPOTrainer's decode skips it
    ids = [
        tok("aab", add_special_tokens=False)["input_ids"] + [filler, tok.eos_token_id],
        tok("bbb")["input_ids"],
    ]
    letters = ["a", "b"]
    # the closure it replaces: the repeat reward over GRPOTrainer's `completions`
    before = [
        reward(a, c, 8, per="max_tokens")
        for a, c in zip(letters, tok.batch_decode(ids, skip_special_tokens=True), strict=True)
    ]
    fn = w.reward_for({"model": str(tiny_model), "max_tokens": 8, "per": "max_tokens"})
    assert fn(completion_ids=ids, letter=letters, completions=["ignored"] * 2) == before == [2 / 8, 3 / 8]
    assert pickle.loads(pickle.dumps(fn))(completion_ids=ids, letter=letters) == before
    with ProcessPoolExecutor(
        1, mp_context=multiprocessing.get_context("spawn")
    ) as pool:  # as AsyncGRPO's worker
        assert pool.submit(fn, completion_ids=ids, letter=letters).result() == before


def test_an_async_clock_has_no_generation_timers(bench):
    clock = {
        "begins": [10.0, 12.0, 15.0],
        "end": 16.0,
        "logs": [{"reward": r} for r in (0.1, 0.2, 0.3)] + [{"train_runtime": 6.0}],
        "gens": [{"tokens": 5, "lengths": [2, 3], "sync_s": 0.5, "wait_s": w} for w in (1.0, 0.5, 0.0)],
    }
    res = bench["vs_trl"].trl_result(clock, 9.0, 7.5, is_async=True)
    assert res["split_median_s"] == {"rollout_wait": 0.5, "weight_sync": 0.5, "train": 0.5}
    assert res["per_step"]["step"] == [2.0, 3.0, 1.0] and res["per_step"]["rollout_wait"] == [1.0, 0.5, 0.0]
    assert "generate" not in res["per_step"] and res["per_step"]["tokens"] == [5, 5, 5]
    assert (res["steps"], res["startup_s"], res["reward_last3"]) == (3, 1.0, pytest.approx(0.2))
