"""The random-init model of the long-tail jobs (long_tail.py, slow_tools.py, faults.py), with its
EOS tuned so that sample lengths are geometric with the mean a job asks."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from vs_trl import positions_for


def tune_eos(model: Path, rate: float, positions: int = 1024, seed: int = 0) -> dict[str, float]:
    """Make EOS about this likely per token, in any context: hidden dimension 0 becomes a constant
    that no layer reads or writes (its embedding column one weight's size, its rows of o_proj and
    down_proj and its input-norm weights 0), so after the final norm it is ~constant / rms(x); the
    LM head reads EOS, and only EOS, from it with the weight that makes the mean P(EOS) over
    `positions` random-token positions `rate`. The rest of the model is untouched; saved in its dtype."""
    import torch
    from transformers import AutoModelForCausalLM

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    m = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).to(dev)
    dtype, eos = json.loads((model / "config.json").read_text())["dtype"], m.config.eos_token_id
    emb, head = m.get_input_embeddings().weight, m.get_output_embeddings().weight
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        emb[:, 0] = emb[:, 1:].std()
        for layer in m.model.layers:
            layer.self_attn.o_proj.weight[0] = layer.mlp.down_proj.weight[0] = 0.0
            layer.input_layernorm.weight[0] = layer.post_attention_layernorm.weight[0] = 0.0
        head[:, 0] = 0.0
        ids = torch.randint(3, m.config.vocab_size, (1, positions), generator=g).to(dev)
        h = m.model(ids).last_hidden_state[0]
        base = h @ head.T
        lo, hi = 0.0, 1e5
        for _ in range(80):  # bisect the weight: P(EOS) rises with it (h[:, 0] > 0)
            w = (lo + hi) / 2
            logits = base.clone()
            logits[:, eos] += w * h[:, 0]
            p = torch.softmax(logits, -1)[:, eos]
            lo, hi = (w, hi) if p.mean().item() < rate else (lo, w)
        head[eos, 0] = w
    m.to("cpu", getattr(torch, dtype)).save_pretrained(model, safe_serialization=True)
    q = p.quantile(torch.tensor([0.1, 0.9], device=p.device)).tolist()
    return {"eos_rate": p.mean().item(), "eos_rate_p10": q[0], "eos_rate_p90": q[1], "head_weight": w}


def prepare_model(tmp: Path, shape: dict[str, Any], max_model_len: int, max_tokens: int, rate: float | None):
    """The random-init model both frameworks load, with RoPE positions for max_model_len and (rate
    None: if 1/vocab would run most samples to max_tokens) EOS tuned to `rate` (default 4/max_tokens),
    in a subprocess so that this process never holds a CUDA context; (path, what tune_eos reports)."""
    from rlfleet.trainer.tiny import make_tiny_model

    model = make_tiny_model(tmp / "model", seed=0, **shape)
    positions_for(model, max_model_len)
    cfg = json.loads((model / "config.json").read_text())
    if rate is None:
        rate = 0.0 if 1 / cfg["vocab_size"] >= 2 / max_tokens else 4 / max_tokens
    if not rate:
        return model, {"tuned": False, "natural_eos_rate": 1 / cfg["vocab_size"]}
    cmd = [sys.executable, __file__, str(model), str(rate), str(max_model_len)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.splitlines()[-1]
    return model, {"tuned": True, "target": rate} | json.loads(out)


if __name__ == "__main__":  # prepare_model's subprocess: tune_eos, with no CUDA context left behind
    print(json.dumps(tune_eos(Path(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3]))))
