"""Placement on one node of 1, 2, 4 or 8 GPUs (rlfleet/config/placement.py): fake visible GPU lists,
real configs. What is placed where, the transport it chooses, what it says, and each refusal
naming the fields, before anything starts."""

from __future__ import annotations

import json

import pytest

from rlfleet.config.loader import ConfigError, load
from rlfleet.config.models import RLConfig
from rlfleet.config.placement import gpus_needed, model_shape, place
from rlfleet.config.sizing import ModelShape

QWEN_05B = ModelShape(params=0, layers=24, hidden=896, heads=14, kv_heads=2)  # Qwen2.5-0.5B's heads
LLAMA_8B = ModelShape(params=0, layers=32, hidden=4096, heads=32, kv_heads=8)


def gpus(n: int) -> list[str]:
    return [str(i) for i in range(n)]


def cfg(*argv: str) -> RLConfig:
    return load(RLConfig, ["--model.path", "m", *argv])


def layout(
    inference: int, train: int, replicas: int = 1, tp: int = 1, placement: str = "disaggregated", *more: str
) -> RLConfig:
    return cfg(
        "--deployment.num-inference-gpus", str(inference),
        "--deployment.num-train-gpus", str(train),
        "--deployment.placement", placement,
        "--inference.num-replicas", str(replicas),
        "--inference.tensor-parallel-size", str(tp),
        *more,
    )  # fmt: skip


def refused(c: RLConfig, visible: list[str], shape: ModelShape | None = QWEN_05B) -> str:
    with pytest.raises(ConfigError) as e:
        place(c, visible, shape)
    return str(e.value)


# -- what is placed where -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "visible, args, replicas, trainer, transport, mode",
    [
        # CPU box
        (gpus(0), (0, 0), (), (), "filesystem", "cpu"),
        # one GPU, shared (one-GPU mode: vLLM 0.45 of it, cuda_ipc)
        (gpus(1), (1, 1), (("0",),), ("0",), "cuda_ipc", "colocated"),
        # two GPUs: one each
        (gpus(2), (1, 1), (("0",),), ("1",), "filesystem", "disaggregated"),
        # four GPUs, disaggregated: 2 replicas (DP) + 2 FSDP ranks
        (gpus(4), (2, 2, 2), (("0",), ("1",)), ("2", "3"), "filesystem", "disaggregated"),
        # four GPUs: 3 replicas + 1 trainer rank
        (gpus(4), (3, 1, 3), (("0",), ("1",), ("2",)), ("3",), "filesystem", "disaggregated"),
        # four GPUs: one TP-2 replica + 2 ranks
        (gpus(4), (2, 2, 1, 2), (("0", "1"),), ("2", "3"), "filesystem", "disaggregated"),
        # eight GPUs: 2 replicas of TP 2 + 4 ranks
        (
            gpus(8),
            (4, 4, 2, 2),
            (("0", "1"), ("2", "3")),
            ("4", "5", "6", "7"),
            "filesystem",
            "disaggregated",
        ),
        # colocated on all four: a replica and a rank on every GPU
        (
            gpus(4),
            (4, 4, 4, 1, "colocated"),
            tuple((g,) for g in gpus(4)),
            tuple(gpus(4)),
            "cuda_ipc",
            "colocated",
        ),
        # colocated, TP 2: two replicas of two shards, four ranks
        (
            gpus(4),
            (4, 4, 2, 2, "colocated"),
            (("0", "1"), ("2", "3")),
            tuple(gpus(4)),
            "cuda_ipc",
            "colocated",
        ),
        # colocated on two of eight
        (gpus(8), (2, 2, 2, 1, "colocated"), (("0",), ("1",)), ("0", "1"), "cuda_ipc", "colocated"),
        # colocated on one GPU, said so
        (gpus(2), (1, 1, 1, 1, "colocated"), (("0",),), ("0",), "cuda_ipc", "colocated"),
    ],
)
def test_each_layout_places_replicas_ranks_and_the_transport(
    visible, args, replicas, trainer, transport, mode
):
    p = place(layout(*args), visible, QWEN_05B)
    assert (p.replicas, p.trainer, p.transport, p.mode) == (replicas, trainer, transport, mode)
    assert p.inference_gpus == [g for r in replicas for g in r] and p.trainer_gpus == list(trainer)
    assert p.shared == (mode == "colocated")
    assert p.gpus == list(dict.fromkeys(p.inference_gpus + p.trainer_gpus))


def test_visible_gpus_are_taken_in_their_order_not_by_number():
    p = place(layout(2, 2, 2), ["6", "7", "2", "3"], QWEN_05B)
    assert p.replicas == (("6",), ("7",)) and p.trainer == ("2", "3")


def test_a_chosen_transport_is_kept_where_it_fits():
    assert (
        place(layout(2, 2, 2, 1, "disaggregated", "--weights.transport", "nccl"), gpus(4), None).transport
        == "nccl"
    )
    colocated = layout(4, 4, 4, 1, "colocated", "--weights.transport", "filesystem")
    assert place(colocated, gpus(4), None).transport == "filesystem"


def test_it_says_what_it_chose():
    assert place(layout(2, 2, 2), gpus(4), QWEN_05B).describe() == (
        "disaggregated: inference: replicas 0-1 on GPUs 0,1 (tp 1); trainer: 2 FSDP ranks on GPUs 2,3; "
        "weights: filesystem"
    )
    assert place(layout(4, 4, 2, 2, "colocated"), gpus(4), QWEN_05B).describe() == (
        "colocated: inference: replicas 0-1 on GPUs 0+1,2+3 (tp 2); trainer: 4 FSDP ranks on GPUs 0,1,2,3; "
        "shared: GPUs 0,1,2,3; weights: cuda_ipc"
    )
    assert place(cfg(), [], None).describe() == (
        "cpu: inference: replica 0 on the CPU; trainer: the CPU; weights: filesystem"
    )
    p = place(layout(1, 1), gpus(1), None)
    assert json.loads(p.to_json())["describe"] == p.describe()


def test_a_multi_node_controller_holds_no_gpus():
    multi = cfg("--deployment.type", "multi_node", "--deployment.gpus-per-node", "4", "--slurm.job-name", "x")
    p = place(multi, gpus(4), QWEN_05B)
    assert (p.mode, p.gpus, p.transport) == ("multi_node", [], "filesystem")
    assert gpus_needed(multi.deployment) == 4


def test_the_gpus_a_node_needs():
    assert gpus_needed(layout(2, 2, 2).deployment) == 4
    assert gpus_needed(layout(4, 4, 4, 1, "colocated").deployment) == 4
    assert gpus_needed(layout(1, 1).deployment) == 2


# -- refused before anything starts, naming the fields ------------------------------------------


def test_more_replicas_x_tp_than_gpus_is_refused():
    msg = refused(layout(4, 2, 2, 2), gpus(4))
    assert "4 inference + 2 trainer GPUs but 4 are visible" in msg
    assert "deployment.num_inference_gpus, deployment.num_train_gpus" in msg
    msg = refused(layout(8, 8, 8, 1, "colocated"), gpus(4))
    assert "deployment.num_train_gpus = 8 GPUs but 4 are visible" in msg


def test_replicas_x_tp_must_be_the_inference_gpus_at_load():
    with pytest.raises(
        ConfigError, match=r"deployment.num_inference_gpus \(4\) must equal inference.num_replicas x"
    ):
        layout(4, 0, 2, 1)


def test_colocated_needs_as_many_inference_as_trainer_gpus_at_load():
    with pytest.raises(
        ConfigError, match=r"deployment.num_inference_gpus \(2\) must equal deployment.num_train_gpus \(4\)"
    ):
        layout(2, 4, 2, 1, "colocated")


@pytest.mark.parametrize(
    "shape, tp, field",
    [
        (QWEN_05B, 4, "num_attention_heads (14)"),  # 14 heads do not split 4 ways
        (ModelShape(0, 2, 64, heads=8, kv_heads=3), 2, "num_key_value_heads (3)"),
    ],
)
def test_tp_that_does_not_split_the_heads_is_refused(shape, tp, field):
    msg = refused(layout(4, 0, 1, tp) if tp == 4 else layout(2, 0, 1, tp), gpus(4), shape)
    assert f"inference.tensor_parallel_size ({tp}) must divide the model's {field}" in msg


def test_tp_may_be_a_multiple_of_the_kv_heads():
    """vLLM replicates a KV head over the TP ranks past their number: 8 KV heads on TP 16 run."""
    assert place(layout(16, 0, 1, 16), gpus(16), LLAMA_8B).replicas == (tuple(gpus(16)),)
    assert place(layout(2, 2, 1, 2), gpus(4), QWEN_05B).replicas == (("0", "1"),)


def test_the_heads_are_read_from_config_json(tmp_path):
    (tmp_path / "config.json").write_text(
        json.dumps(
            {"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 6, "num_key_value_heads": 2}
        )
    )
    assert model_shape(str(tmp_path)) == ModelShape(0, 2, 64, heads=6, kv_heads=2)
    (tmp_path / "config.json").write_text(
        json.dumps({"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4})
    )
    assert model_shape(str(tmp_path)) == ModelShape(0, 2, 64, heads=4, kv_heads=4)


def test_cuda_ipc_without_a_trainer_rank_on_every_vllm_gpu_is_refused():
    with pytest.raises(ConfigError, match="cuda_ipc needs a trainer rank on every vLLM GPU"):
        layout(2, 2, 2, 1, "disaggregated", "--weights.transport", "cuda_ipc")  # the config alone tells
    c = layout(1, 1, 1, 1, "disaggregated", "--weights.transport", "cuda_ipc")
    msg = refused(c, gpus(2))  # one each on two visible GPUs: nothing shared
    assert "cuda_ipc maps the trainer's GPU memory" in msg and "['0'] and ['1']" in msg
    assert (
        place(layout(4, 4, 4, 1, "colocated", "--weights.transport", "cuda_ipc"), gpus(4), None).transport
        == "cuda_ipc"
    )


def test_nccl_where_trainer_rank_0_shares_a_vllm_gpu_is_refused():
    """NCCL refuses two members of one group on one GPU: colocated (or one shared GPU) cannot nccl."""
    msg = refused(layout(4, 4, 4, 1, "colocated", "--weights.transport", "nccl"), gpus(4))
    assert "nccl sends from trainer rank 0" in msg and "GPU 0 holds both" in msg
    assert "deployment.placement" in msg
    assert "GPU 0 holds both" in refused(
        layout(1, 1, 1, 1, "disaggregated", "--weights.transport", "nccl"), gpus(1)
    )
    # across GPUs, from a trainer of several FSDP ranks
    p = place(layout(2, 2, 2, 1, "disaggregated", "--weights.transport", "nccl"), gpus(4), QWEN_05B)
    assert (p.transport, p.trainer) == ("nccl", ("2", "3"))


def test_sleep_needs_shared_gpus():
    asleep = ("--inference.sleep", "true", "--orchestrator.max-async-level", "0")
    assert place(layout(4, 4, 4, 1, "colocated", *asleep), gpus(4), None).shared
    with pytest.raises(ConfigError, match="deployment.placement = colocated"):
        layout(2, 2, 2, 1, "disaggregated", *asleep)
    assert "inference.sleep needs vLLM and a trainer rank on the same GPU" in refused(
        layout(1, 1, 1, 1, "disaggregated", *asleep), gpus(2)
    )


def test_every_problem_is_named_at_once():
    c = layout(
        1,
        1,
        1,
        1,
        "disaggregated",
        "--weights.transport",
        "cuda_ipc",
        "--inference.tensor-parallel-size",
        "1",
    )
    msg = refused(c, gpus(2), ModelShape(0, 2, 64, heads=3, kv_heads=3))
    assert "cuda_ipc" in msg
    c = layout(2, 2, 1, 2, "colocated")
    msg = refused(c, gpus(1), ModelShape(0, 2, 64, heads=3, kv_heads=3))
    assert "num_attention_heads (3)" in msg and "but 1 are visible" in msg
