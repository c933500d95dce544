"""The architecture matrix (issue 32): architecture x weight transport, on whatever this machine has.

Per architecture a tiny random-init model (`rlfleet model tiny --arch A`; on a CPU Gemma-2's
weights sharpened so that its soft-caps bite, tests/archmatrix.py `make_arch_model`) served by one real
`rlfleet inference` replica (HTTP, as a run starts it) and trained by the trainer's own step in
this process; tests/archmatrix.py `run_arch` says what is checked. Per transport the JSON has:
  max_abs_diff  max |vLLM - trainer| logprob on 60 fixed tokens after an RL step's weights loaded
  identical     whether loading the start weights again left vLLM's tensors bit for bit as its own
                loader built them (names, shapes, dtypes, values)
  load_s        the controller's load call (pause, load, resume)
  ok            every check held (tolerance: 1e-3 on a CPU's float32, 5e-2 on a GPU's bfloat16)
and `unsupported` where the transport cannot run here. CPU: filesystem and nccl (gloo). GPU: also
cuda_ipc (vLLM on the trainer's GPU); nccl needs a second GPU (NCCL refuses two ranks on one):
with two, vLLM and the trainer share GPU 1 and the nccl sender sits on GPU 0.

    python benchmarks/arch_matrix.py --out benchmarks/results/arch_matrix_cpu_2core.json
    python benchmarks/arch_matrix.py --out benchmarks/results/arch_matrix_h100.json      # on a GPU box
"""

from __future__ import annotations

import argparse
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

import torch
from common import table, write

from rlfleet.trainer.tiny import ARCHS
from tests.archmatrix import (
    TRANSPORTS_CPU,
    TRANSPORTS_GPU,
    make_arch_model,
    row_ok,
    run_arch,
)
from tests.replica import HttpReplica


def placement() -> tuple[torch.device, str | None, torch.device | None, tuple[str, ...], dict[str, str]]:
    """(trainer device, vLLM's GPU, nccl sender's device, transports, unsupported: why)."""
    if not torch.cuda.is_available():
        return torch.device("cpu"), None, None, TRANSPORTS_CPU, {"cuda_ipc": "needs a GPU"}
    if torch.cuda.device_count() < 2:
        why = {"nccl": "needs a second GPU (NCCL refuses two ranks on one GPU)"}
        return torch.device("cuda", 0), "0", None, ("filesystem", "cuda_ipc"), why
    return torch.device("cuda", 1), "1", torch.device("cuda", 0), TRANSPORTS_GPU, {}


def summarize(row: dict[str, Any], tol: float, unsupported: dict[str, str]) -> dict[str, Any]:
    bad = row_ok(row, tol)
    cells: dict[str, Any] = {t: {"unsupported": why} for t, why in unsupported.items()}
    for name, t in row["transports"].items():
        cells[name] = {
            "max_abs_diff": t["max_abs_diff"],
            "identical": not t["identity_changed"],
            "load_s": t["load_s"],
            "rl_step_logprob_diff_max": t["rl_step"]["logprob_diff_max"],
            "ok": not [b for b in bad if b.startswith(f"{name}:")],
        }
    return {"served_diff": row["served_diff"], "start_s": row["start_s"], "failed": bad, "cells": cells}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--archs", default=",".join(ARCHS))
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    device, gpu, nccl_device, transports, unsupported = placement()
    tol = 5e-2 if gpu is not None else 1e-3
    results: dict[str, Any] = {
        "device": str(device),
        "vllm_gpu": gpu,
        "tolerance": tol,
        "matrix": {},
        "rows": [],
    }
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        for arch in args.archs.split(","):
            t0 = time.perf_counter()
            model_dir = make_arch_model(tmp / "models", arch, sharpen=gpu is None)
            try:

                def engine_for(m: Path, arch: str = arch) -> HttpReplica:
                    return HttpReplica(m, tmp / arch / "serve", gpu)

                row = run_arch(arch, model_dir, tmp, engine_for, transports, device, nccl_device)
                results["matrix"][arch] = summarize(row, tol, unsupported)
                results["rows"].append(row)
            except Exception as e:  # one architecture failing is a row of the matrix, not the end
                results["matrix"][arch] = {
                    "error": f"{type(e).__name__}: {e}"[:2000],
                    "trace": traceback.format_exc(),
                }
            results["matrix"][arch]["wall_s"] = time.perf_counter() - t0
            write(args.out, results)
    names = ("filesystem", "cuda_ipc", "nccl")
    rows = [
        [arch, *[cell(m, n) for n in names], f"{m.get('served_diff', float('nan')):.1e}"]
        for arch, m in results["matrix"].items()
    ]
    table(f"max |vLLM - trainer| logprob after a load ({device})", ["arch", *names, "served at start"], rows)


def cell(m: dict[str, Any], name: str) -> str:
    if "cells" not in m:
        return "error"
    c = m["cells"].get(name, {"unsupported": "not run"})
    if "unsupported" in c:
        return "n/a"
    return f"{c['max_abs_diff']:.1e} {'ok' if c['ok'] and c['identical'] else 'FAIL'}"


if __name__ == "__main__":
    main()
