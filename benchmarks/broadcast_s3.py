"""Weight broadcast through an S3 run store vs a local one, into a real vLLM server (CPU build).

Each repetition moves every weight a little (so no cache can answer), then times the three
phases a step's broadcast goes through in the flow:
  publish: the trainer's `publish_weights` (safetensors + sha256 manifest, upload when remote)
  fetch:   the controller's `newest_weights` (sha256 check in place when local; download to the
           node's cache and verify when remote)
  reload:  `/pause` + `POST /collective_rpc reload_weights` + `/resume` on the vLLM server
The S3 server is moto in server mode on loopback (an in-memory Python server, not AWS): the S3
numbers measure the protocol path (requests, multipart, verification), not a network. Optionally
also times publish + fetch of one large synthetic file (multipart) without vLLM.

    python benchmarks/broadcast_s3.py --reps 10 --out benchmarks/results/broadcast_cpu_2core.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # for tests.s3server

from rlfleet.config.models import InferenceConfig, ModelConfig, RLConfig  # noqa: E402
from rlfleet.inference.pool import InferencePool  # noqa: E402
from rlfleet.store import RunStore, stage  # noqa: E402
from rlfleet.trainer.tiny import make_tiny_model  # noqa: E402
from rlfleet.weights.client import load  # noqa: E402
from rlfleet.weights.filesystem import publish_weights  # noqa: E402
from rlfleet.weights.tickets import newest_weights  # noqa: E402
from tests.helpers import free_port  # noqa: E402
from tests.s3server import moto_server  # noqa: E402


def _median(rows: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in rows)


def broadcast_reps(store: RunStore, model, tokenizer_dir: Path, url: str, reps: int) -> dict:
    rows = []
    for step in range(reps):
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p) * 1e-3)
        t0 = time.perf_counter()
        manifest = publish_weights(store, step, model, str(tokenizer_dir))
        t1 = time.perf_counter()
        got, path = newest_weights(store, step)
        t2 = time.perf_counter()
        load(url, {"transport": "filesystem", "step": step, "path": path})
        t3 = time.perf_counter()
        assert got == step
        rows.append({"publish_s": t1 - t0, "fetch_s": t2 - t1, "reload_s": t3 - t2, "total_s": t3 - t0})
    nbytes = sum(f["size"] for f in manifest["files"].values())
    timed = rows[1:] if len(rows) > 1 else rows  # the first pays connection and import warm-up
    return {
        "weights_bytes": nbytes,
        "reps": len(timed),
        **{f"median_{k}": _median(timed, k) for k in ("publish_s", "fetch_s", "reload_s", "total_s")},
        "rows": rows,
    }


def big_file_reps(store: RunStore, mib: int, reps: int) -> dict:
    rows = []
    for r in range(reps):
        rel = f"big/step_{r}"
        src = store.staging_dir(rel)
        (src / "blob.bin").write_bytes(os.urandom(mib << 20))
        t0 = time.perf_counter()
        store.publish_dir(src, rel)
        t1 = time.perf_counter()
        stage(store, rel, keep=1)
        t2 = time.perf_counter()
        store.remove(rel)
        rows.append({"publish_s": t1 - t0, "fetch_s": t2 - t1})
    return {
        "mib": mib,
        "reps": reps,
        "median_publish_s": _median(rows, "publish_s"),
        "median_fetch_s": _median(rows, "fetch_s"),
        "rows": rows,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--big-mib", type=int, default=0, help="also time one file of this size (multipart)")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()

    with tempfile.TemporaryDirectory() as tmp_s:
        tmp = Path(tmp_s)
        os.environ.update(
            AWS_ACCESS_KEY_ID="bench",
            AWS_SECRET_ACCESS_KEY="bench-secret",
            AWS_DEFAULT_REGION="us-east-1",
            RLFLEET_CACHE_DIR=str(tmp / "cache"),
        )
        model_dir = make_tiny_model(tmp / "tiny", seed=0)
        cfg = RLConfig(
            output_dir=str(tmp / "serve"),
            model=ModelConfig(path=str(model_dir)),
            inference=InferenceConfig(port=free_port(), max_model_len=128),
        )
        pool = InferencePool(cfg.inference_job())
        results: dict = {}
        with moto_server(tmp / "moto.log") as endpoint:
            os.environ["AWS_ENDPOINT_URL"] = endpoint
            import boto3

            boto3.client("s3").create_bucket(Bucket="bench")
            try:
                t0 = time.perf_counter()
                url = pool.ensure()[0]
                results["vllm_start_s"] = time.perf_counter() - t0
                model = AutoModelForCausalLM.from_pretrained(model_dir)
                for name, store in (("local", RunStore(tmp / "run")), ("s3", RunStore("s3://bench/run"))):
                    results[name] = broadcast_reps(store, model, model_dir, url, a.reps)
                    print(name, {k: v for k, v in results[name].items() if k != "rows"}, flush=True)
            finally:
                pool.shutdown()
            if a.big_mib:
                for name, store in (("local", RunStore(tmp / "run")), ("s3", RunStore("s3://bench/run"))):
                    results[f"big_{name}"] = big_file_reps(store, a.big_mib, 3)
                    print(f"big_{name}", {k: v for k, v in results[f"big_{name}"].items() if k != "rows"})
    env = {
        "torch": torch.__version__,
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "loadavg_at_end": os.getloadavg(),
        "s3_server": "moto server mode on 127.0.0.1",
        "date": time.strftime("%Y-%m-%d"),
    }
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps({"env": env, "results": results}, separators=(",", ":")))


if __name__ == "__main__":
    main()
