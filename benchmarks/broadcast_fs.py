"""Filesystem weight broadcast vs a plain file copy of the same bytes on the same disk.

For each model shape, each repetition moves every weight a little (no cache can answer), then
times what a step's broadcast does in the flow:
  save:   the trainer's `publish_weights` (save_pretrained + sha256 manifest + atomic rename)
  verify: the controller's `newest_weights` as the broadcast task calls it (manifest + sizes; the
          trainer hashed the files while publishing); `sha256_s` prices the full re-hash a resume does
  reload: `reload_weights` on the real vLLM CPU server: /pause (which drops the KV and
          prefix caches) -> reload_weights -> /resume
  copy:   `shutil.copytree` of the published directory to another directory on the same disk
Rates are bytes / seconds; the goal is broadcast (save + verify + reload) >= 0.5 x the copy rate.

    python benchmarks/broadcast_fs.py --reps 5 --out benchmarks/results/broadcast_fs_cpu_2core.json
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

import torch
from common import median, rl_config, table, tiny_model, write
from transformers import AutoModelForCausalLM

from rlfleet.inference.pool import InferencePool
from rlfleet.store import RunStore
from rlfleet.weights.client import load
from rlfleet.weights.filesystem import publish_weights
from rlfleet.weights.tickets import newest_weights

SHAPES = {"tiny": {}, "small": {"hidden": 512, "layers": 8, "heads": 8}}


def one_shape(tmp: Path, name: str, reps: int) -> dict:
    model_dir = tiny_model(tmp / name, **SHAPES[name])
    cfg = rl_config(model_dir, tmp / name / "serve")
    pool = InferencePool(cfg.inference_job())
    store = RunStore(tmp / name / "run")
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    rows = []
    try:
        url = pool.ensure()[0]
        for step in range(reps + 1):  # the first pays warm-up
            with torch.no_grad():
                for p in model.parameters():
                    p.add_(torch.randn_like(p) * 1e-3)
            t0 = time.perf_counter()
            manifest = publish_weights(store, step, model, str(model_dir))
            t1 = time.perf_counter()
            got, path = newest_weights(store, step, checksum=False)
            t2 = time.perf_counter()
            newest_weights(store, step)  # not part of the broadcast: what a resume pays instead
            sha256_s = time.perf_counter() - t2
            t3 = time.perf_counter()
            calls = load(url, {"transport": "filesystem", "step": step, "path": path})
            t4 = time.perf_counter()
            copy_dir = tmp / name / f"copy_{step}"
            shutil.copytree(path, copy_dir)
            t5 = time.perf_counter()
            shutil.rmtree(copy_dir)
            assert got == step
            rows.append(
                {
                    "save_s": t1 - t0,
                    "verify_s": t2 - t1,
                    "reload_s": t4 - t3,
                    "copy_s": t5 - t4,
                    "sha256_s": sha256_s,
                    "calls": calls,
                }
            )
    finally:
        pool.shutdown()
    nbytes = sum(f["size"] for f in manifest["files"].values())
    timed = rows[1:]
    med = {k: median([r[k] for r in timed]) for k in ("save_s", "verify_s", "reload_s", "copy_s", "sha256_s")}
    med["broadcast_s"] = med["save_s"] + med["verify_s"] + med["reload_s"]
    rate = {k.replace("_s", "_mb_s"): nbytes / v / 1e6 for k, v in med.items()}
    return {
        "bytes": nbytes,
        "reps": len(timed),
        **{f"median_{k}": v for k, v in med.items()},
        **rate,
        "broadcast_over_copy": rate["broadcast_mb_s"] / rate["copy_mb_s"],
        "reload_over_copy": rate["reload_mb_s"] / rate["copy_mb_s"],
        "median_calls_s": {c: median([r["calls"][c] for r in timed]) for c in rows[0]["calls"]},
        "rows": rows,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--shapes", default="tiny,small")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    results = {}
    with tempfile.TemporaryDirectory(dir=Path(a.out).resolve().parent) as tmp:
        for name in a.shapes.split(","):
            results[name] = one_shape(Path(tmp), name, a.reps)
    write(a.out, results)
    rows = []
    for name, r in results.items():
        for phase in ("save", "verify", "sha256", "reload", "broadcast", "copy"):
            rows.append(
                [
                    f"{name} {phase}",
                    f"{r['bytes'] / 1e6:.1f}",
                    r[f"median_{phase}_s"] * 1e3,
                    r[f"{phase}_mb_s"],
                    r[f"{phase}_mb_s"] / r["copy_mb_s"],
                ]
            )
    table("filesystem weight broadcast vs plain copy", ["model / phase", "MB", "ms", "MB/s", "x copy"], rows)


if __name__ == "__main__":
    main()
