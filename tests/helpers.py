"""Probes the tests use and the package does not: a vLLM logprob fingerprint, a dataset's NLL,
`sbatch --test-only`, the ranks that wrote a DCP checkpoint."""

from __future__ import annotations

import random
import subprocess
from collections.abc import Callable
from pathlib import Path

import httpx
import torch
from transformers import AutoTokenizer, PreTrainedModel

from rlfleet.config.models import SFTConfig
from rlfleet.net import tls
from rlfleet.orchestrator.rollout import single_turn
from rlfleet.trainer.lm_head import token_logprobs
from rlfleet.trainer.nll import num_targets, sft_loss
from rlfleet.trainer.sft_data import Example, encode, load_dataset, micro_batches, pad_id
from rlfleet.trainer.train import load_model


def prompt_logprobs(url: str, prompt_ids: list[int], timeout_s: float = 60.0) -> list[float]:
    """The server's logprob of each prompt token after the first: a fingerprint of its weights."""
    resp = httpx.post(
        f"{url}/v1/completions",
        json={
            "model": "policy",
            "prompt": prompt_ids,
            "max_tokens": 1,
            "temperature": 0.0,
            "prompt_logprobs": 0,
        },
        timeout=timeout_s,
        verify=tls(),
    )
    resp.raise_for_status()
    entries = resp.json()["choices"][0]["prompt_logprobs"][1:]
    return [entry[str(tok)]["logprob"] for entry, tok in zip(entries, prompt_ids[1:], strict=True)]


@torch.no_grad()
def evaluate_nll(
    model: PreTrainedModel, examples: list[Example], pad: int, micro_batch_size: int = 32
) -> float:
    """Token-mean NLL of `model` on `examples` over their loss tokens (no update)."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    batches = micro_batches(examples, micro_batch_size, pad)
    n = num_targets(batches)
    total = 0.0
    for mb in batches:
        ids = mb["input_ids"].to(device)
        logits = model(input_ids=ids).logits[:, :-1]
        total += float(sft_loss(token_logprobs(logits, ids[:, 1:]), mb["loss_mask"][:, 1:].to(device), n))
    model.train(was_training)
    return total


def dataset_nll(model_path: str, cfg: SFTConfig, device: str = "cpu") -> float:
    """NLL of the model at `model_path` on the whole configured dataset (for before/after checks)."""
    tok = AutoTokenizer.from_pretrained(model_path)
    ds = load_dataset(cfg.data)
    examples = [encode(tok, row, ds.format, cfg.data.max_seq_len) for row in ds.rows]
    model = load_model(model_path, cfg.model.dtype, torch.device(device))
    return evaluate_nll(model, examples, pad_id(tok), cfg.data.micro_batch_size)


def sbatch_test_only(script: str, env: dict[str, str] | None = None) -> str:
    """`sbatch --test-only`: validates the script and says where it would start; submits nothing."""
    proc = subprocess.run(
        ["sbatch", "--test-only", script], capture_output=True, text=True, env=env, timeout=60
    )
    assert proc.returncode == 0, proc.stderr or proc.stdout
    return (proc.stdout + proc.stderr).strip()


def dcp_ranks(dcp_dir: Path) -> set[int]:
    """The ranks with shard files in a DCP checkpoint (DCP names them `__<rank>_<file>.distcp`)."""
    return {int(p.name.split("_")[2]) for p in Path(dcp_dir).glob("*.distcp")}


def random_records(
    n: int,
    seed: int = 0,
    advantage: Callable[[random.Random, int], float] = lambda rng, i: rng.uniform(-1, 1),
) -> list[dict]:
    """Trajectories of 3-20 tokens over ids 3..127 in groups of 4 (padded micro-batches carry a lot of
    padding); `advantage(rng, i)` gives the i-th its advantage."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        prompt = [1] + [rng.randrange(3, 128) for _ in range(rng.randint(1, 8))]
        completion = [rng.randrange(3, 128) for _ in range(rng.randint(1, 12))]
        logprobs = [-rng.uniform(0.5, 5.0) for _ in completion]
        out.append(
            {"group": i // 4, **single_turn(prompt, completion, logprobs), "advantage": advantage(rng, i)}
        )
    return out
