"""FSDP2 on GPUs, the claims the CPU test makes over gloo, here over NCCL.

1. A checkpoint saved by 2 GPU ranks (DCP) resumes on 1 GPU and continues the 1-GPU reference
   run's losses (tiny model, fp32 compute so the comparison is tight).
2. The 1.5B shape: first-step losses on 2 GPUs (FSDP2, and HSDP with dp_replicate=2) equal 1 GPU
   on the same fake batches, bf16 compute.

    python benchmarks/fsdp_gpu_check.py --out benchmarks/results/fsdp_h200x2.json
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from trainer_mfu import write_config  # noqa: E402

from rlfleet.store import RunStore, layout  # noqa: E402
from rlfleet.trainer.tiny import make_tiny_model  # noqa: E402
from tests.synthetic_run import logged_losses, publish_steps, run_job  # noqa: E402


def resume_check(tmp: Path) -> dict:
    model = make_tiny_model(tmp / "tiny")
    ref, dist2 = tmp / "ref", tmp / "dist"
    publish_steps(RunStore(ref), 3)
    shutil.copytree(ref, dist2)
    run_job(ref, model, 3, None, gpus="0")
    run_job(dist2, model, 1, 2, gpus="0,1")
    shards = len(list((dist2 / layout.step_dir(layout.CHECKPOINTS, 0) / layout.DCP).glob("*.distcp")))
    run_job(dist2, model, 3, None, gpus="0")
    return {
        "reference_1gpu": logged_losses(ref, range(3)),
        "2gpu_then_resumed_on_1gpu": logged_losses(dist2, range(3)),
        "dcp_shard_files": shards,
    }


def benchlogged_losses(
    model_dir: str, gpus: list[str], micro_batches: int, extra: list[str], out: Path
) -> dict:
    cmd = [sys.executable, "-m", "rlfleet.cli", "trainer", "--bench", "--model.path", model_dir]
    cmd += ["--gpu-ids", json.dumps(gpus), "--trainer.fsdp", "on", "--trainer.lm-head-chunk", "2048"]
    cmd += [
        "--bench.seq-len",
        "4096",
        "--bench.micro-batches",
        str(micro_batches),
        "--bench.warmup-steps",
        "1",
    ]
    cmd += ["--bench.steps", "3", "--bench.output-json", str(out), "--trainer.lr", "1e-5", *extra]
    env = {"CUDA_VISIBLE_DEVICES": ",".join(gpus)} if len(gpus) == 1 else {}
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**__import__("os").environ, **env})
    if proc.returncode:
        return {"args": extra, "gpus": gpus, "error": proc.stderr[-3000:]}
    return {"args": extra, "gpus": gpus, **json.loads(out.read_text())}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    a = p.parse_args()
    res: dict = {}
    with tempfile.TemporaryDirectory() as t:
        tmp = Path(t)
        try:
            res["resume"] = resume_check(tmp)
        except AssertionError as e:
            res["resume"] = {"error": str(e)[-3000:]}
        print(json.dumps(res["resume"]), flush=True)
        q = str(write_config(tmp / "q15", "1.5b"))
        runs = [(["0"], 4, []), (["0", "1"], 2, []), (["0", "1"], 2, ["--trainer.dp-replicate", "2"])]
        res["losses_1_vs_2_gpus"] = []
        for i, (gpus, mb, extra) in enumerate(runs):
            r = benchlogged_losses(q, gpus, mb, extra, tmp / f"b{i}.json")
            res["losses_1_vs_2_gpus"].append(r)
            print(
                json.dumps(
                    {
                        k: r.get(k)
                        for k in (
                            "gpus",
                            "args",
                            "losses",
                            "tokens_per_second",
                            "mfu",
                            "peak_memory_gib",
                            "error",
                        )
                    }
                ),
                flush=True,
            )
    Path(a.out).write_text(json.dumps(res, separators=(",", ":")))


if __name__ == "__main__":
    main()
