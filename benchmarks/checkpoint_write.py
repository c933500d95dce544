"""What a trainer checkpoint costs, phase by phase, against a plain `torch.save` of the same state.

Builds the trainer as `rlfleet rl` does (FSDP2 on one rank: a GPU, or a gloo group on the CPU),
takes one AdamW step so the optimizer holds its state, then saves `--reps` checkpoints through the
trainer's `CheckpointManager`: the seconds the step is held (copy to host memory) and the background
write, split by the trainer's own log line into HF export / trainer state (DCP) / checksums and
publish. The peer is what a user's own loop would do: `torch.save` of the model's and optimizer's
state dicts, one file. `--variants before,now` also times the writer as it was before 2026-11-24
(DCP with one thread and an fsync per file, checksums one file after the other) in the same run.

    python benchmarks/checkpoint_write.py --shape 05b --out benchmarks/results/checkpoint_write_cpu_2core.json
"""

from __future__ import annotations

import argparse
import logging
import re
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import write  # noqa: E402
from gpu_loop import SHAPES  # noqa: E402

from rlfleet.config.loader import load  # noqa: E402
from rlfleet.config.models import TrainerJobConfig  # noqa: E402
from rlfleet.store import RunStore, layout  # noqa: E402
from rlfleet.trainer.checkpoint import CheckpointManager  # noqa: E402
from rlfleet.trainer.loop import build  # noqa: E402
from rlfleet.trainer.tiny import make_tiny_model  # noqa: E402
from rlfleet.trainer.train import accumulate, optimizer_step  # noqa: E402

PHASES = re.compile(
    r"checkpoint (\d+): HF export ([\d.]+) s, trainer state ([\d.]+) s, checksums and publish ([\d.]+) s"
)


class Phases(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.by_step: dict[int, dict[str, float]] = {}

    def emit(self, record: logging.LogRecord) -> None:
        if m := PHASES.search(record.getMessage()):
            self.by_step[int(m[1])] = {"hf_s": float(m[2]), "state_s": float(m[3]), "publish_s": float(m[4])}


def as_before() -> None:
    """The checkpoint writer before 2026-11-24, patched in for the comparison."""
    from torch.distributed.checkpoint import FileSystemWriter

    import rlfleet.store.runstore as runstore
    import rlfleet.trainer.checkpoint as checkpoint

    def sequential(local_dir: Path) -> dict:
        files = [p for p in sorted(local_dir.rglob("*")) if p.is_file() and p.name != runstore.MANIFEST]
        return {
            p.relative_to(local_dir).as_posix(): {"size": p.stat().st_size, "sha256": runstore.sha256_file(p)}
            for p in files
        }

    checkpoint._dcp_writer = lambda path: FileSystemWriter(path)
    runstore.file_entries = sequential


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--shape", default="05b", choices=sorted(SHAPES))
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--variants", default="now", help="comma-separated: now, before (run last)")
    p.add_argument("--dir", help="where to write (default: a temporary dir; the run store's disk)")
    p.add_argument("--out", required=True)
    a = p.parse_args()

    phases = Phases()
    logging.getLogger("rlfleet.checkpoint").addHandler(phases)
    logging.getLogger("rlfleet.checkpoint").setLevel(logging.INFO)
    with tempfile.TemporaryDirectory(dir=a.dir) as tmp:
        model_dir = make_tiny_model(Path(tmp) / "model", seed=0, **SHAPES[a.shape])  # the GPU loop's shapes
        cfg = load(
            TrainerJobConfig,
            ["--model.path", str(model_dir), "--output-dir", str(Path(tmp) / "run")]
            + ["--trainer.device", a.device, "--trainer.fsdp", "on"],
        )
        par, policy, optimizer = build(cfg, str(model_dir))
        params = sum(t.numel() for t in policy.parameters())
        ids = torch.randint(3, 100, (1, 64))
        batch = [{"input_ids": ids, "loss_mask": torch.ones_like(ids)}]
        accumulate(policy, batch, lambda mb, lp, ent: (lp.float().mean(), {}), 1.0, par)
        optimizer_step(policy, optimizer, 1.0)  # AdamW now holds its state

        store = RunStore(str(Path(tmp) / "run"))
        rows, step = [], 0
        for variant in sorted(a.variants.split(","), key=lambda v: v == "before"):
            if variant == "before":
                as_before()
            ckpt = CheckpointManager(store, par, policy, optimizer, str(model_dir), keep=1, interval=1)
            for _ in range(a.reps):
                t0 = time.perf_counter()
                held = ckpt.save(step, {"next_step": step + 1})
                ckpt.wait()
                total = time.perf_counter() - t0
                size = sum(
                    f.stat().st_size
                    for f in store.local_path(layout.step_dir(layout.CHECKPOINTS, step)).rglob("*")
                )
                row = {"variant": variant, "step": step, "held_s": held, "total_s": total, "bytes": size}
                rows.append(row | phases.by_step[step])
                print(rows[-1], flush=True)
                step += 1
            ckpt.close()

        t0 = time.perf_counter()
        plain = Path(tmp) / "plain.pt"
        torch.save({"model": policy.state_dict(), "optim": optimizer.state_dict()}, plain)
        plain_s, plain_bytes = time.perf_counter() - t0, plain.stat().st_size
    best = {v: min(r["total_s"] for r in rows if r["variant"] == v) for v in a.variants.split(",")}
    results = {
        "shape": a.shape,
        "device": a.device,
        "params": params,
        "checkpoints": rows,
        "best_total_s": best,
        "torch_save": {"seconds": plain_s, "bytes": plain_bytes},
        "best_vs_torch_save": {v: s / plain_s for v, s in best.items()},
    }
    for v, s in best.items():
        print(f"rlfleet checkpoint ({v}) {s:.2f} s vs torch.save {plain_s:.2f} s", flush=True)
    write(a.out, results)


if __name__ == "__main__":
    main()
