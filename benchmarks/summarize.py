"""Write the headline table of BENCHMARKS.md (and of the docs' benchmarks page) from benchmarks/results/.

    python benchmarks/summarize.py            # rewrite the tables between the markers
    python benchmarks/summarize.py --check    # exit 1 if either is stale (tests/test_benchmarks_summary.py)

Each headline below names the result files it reads; the value, the peer's value, the ratio, the
date and the machine come from those files (a file that lacks a date or a machine names the
headline's own), so a new result changes the table only through its JSON. Learning runs are read
generically from each `LEARNING` directory's summary.json: one row per rlfleet group that reached TRL's accuracy.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
TARGETS = {  # file -> where its links start, relative to docs/
    ROOT / "BENCHMARKS.md": "docs/",
    ROOT / "docs" / "benchmarks" / "index.md": "../",
}
START, END = "<!-- --8<-- [start:summary] -->", "<!-- --8<-- [end:summary] -->"


@dataclass
class Row:
    headline: str
    value: str
    peer: str
    ratio: str
    date: str
    machine: str
    command: str
    page: str  # the page under docs/ that tells more, with its anchor


def load(rel: str) -> dict[str, Any]:
    return json.loads((RESULTS / rel).read_text())


def machine(env: dict[str, Any] | None, fallback: str = "") -> str:
    if not env:
        return fallback
    if isinstance(env.get("machine"), str) and " " in env["machine"]:  # a described machine
        return env["machine"]
    gpu = (env.get("gpu") or "").replace("NVIDIA ", "").replace(" 80GB HBM3", "")
    cpus = env.get("cpus")
    if gpu:
        return f"1x {gpu}" + (f", {cpus} CPUs" if cpus else "")
    return f"{cpus}-core CPU" if cpus else fallback


def date(doc: dict[str, Any], fallback: str = "") -> str:
    d = doc.get("date") or (doc.get("env") or {}).get("date") or fallback
    return d.split(" ")[0]


def ratio(x: float) -> str:
    return f"**{x:.2f}x**"


def command(argv: Any) -> str:
    """A recorded command line, its output path elided (it named the GPU host's disk)."""
    if isinstance(argv, str):
        return argv
    args = list(argv)
    if "--out" in args:
        args[args.index("--out") + 1] = "..."
    return shlex.join(["python", *args] if args[0].endswith(".py") else args)


# --- headlines --------------------------------------------------------------------------------


def long_tail() -> list[Row]:
    """Job (a): a long-tailed GRPO job (0.5B shape, max_tokens 4096), trained tokens/s against TRL
    GRPOTrainer with colocated vLLM, same host and session."""
    trl = load("long_tail_h200_05b_peak_trl.json")
    peer = trl["results"]["trl"]["gen_tokens_per_s"]
    rows = []
    for variant in ("cuda_ipc", "filesystem"):
        doc = load(f"long_tail_h200_05b_{variant}.json")
        r = doc["results"][variant]
        rows.append(
            Row(
                f"Long-tail GRPO job, trained tokens/s (0.5B shape, max_tokens 4096, k = 1, {variant})",
                f"{r['gen_tokens_per_s']:,.0f}",
                f"TRL 1.16 GRPOTrainer: {peer:,.0f}",
                ratio(r["gen_tokens_per_s"] / peer),
                date(doc),
                machine(doc["env"]),
                "python benchmarks/long_tail.py --device cuda --shape 05b --steps 20 --only rlfleet --no-peak "
                f'--eos-rate 0.002 --trainer.lr 1e-7 --variants "{doc["config"]["variants"]}"',
                "benchmarks/long-generations.md#job-a-20-steps-per-transport-against-trl-and-job-b-on-the-gpu-2026-11-26",
            )
        )
    return rows


LEARNING = {  # results directory -> what its job is
    "learning_vs_trl_h200": ("one-digit addition, 32-token answers", "one_seed"),
    "learning_vs_trl_h200_warm": ("one-digit addition, 32-token answers, warm host", "seed1"),
    "learning_vs_trl_reason_h200": ("one-digit addition with its working, up to 1,024 tokens", "reason"),
    "learning_vs_trl_h200x2_s11": ("one-digit addition, 32-token answers, cold (k1) or on a warm fleet", ""),
    "learning_vs_trl_h200x2_s11_fleet2": (
        "one-digit addition, 32-token answers, two runs on a warm fleet",
        "",
    ),
    "learning_vs_trl_h200x2_s12_fleet_wc": (
        "one-digit addition, 32-token answers, two runs on a warm fleet through its warm controller",
        "",
    ),
    "learning_vs_trl_h200_1gpu_shared": (
        "one-digit addition, 32-token answers, cold, both on one GPU",
        "shared",
    ),
    "learning_vs_trl_h200_1gpu_cold_seq_e": (
        "one-digit addition, 32-token answers, cold, one GPU, each run alone (rlfleet first)",
        "cold",
    ),
    "learning_vs_trl_h200_1gpu_cold_seq_f": (
        "one-digit addition, 32-token answers, cold, one GPU, each run alone (TRL first)",
        "cold",
    ),
    "learning_vs_trl_h200_1gpu_cold_seq_h": (
        "one-digit addition, 32-token answers, cold, one GPU, each run alone (TRL first, k = 2)",
        "cold",
    ),
    "fleet_back_to_back_h200_1gpu": (
        "one-digit addition, 32-token answers, three runs back to back on a one-GPU fleet, TRL cold",
        "",
    ),
}


def learning_vs_trl() -> list[Row]:
    """SmolLM2-135M-Instruct learning one-digit addition: training seconds until rlfleet's greedy eval
    pass@1 reaches TRL's final one, against TRL's own (and, in the value, the same after each run's
    start-up); every rlfleet group of each directory's summary.json."""
    rows = []
    for directory, (job, mode) in LEARNING.items():
        summary = load(f"{directory}/summary.json")
        runs = [load(str(Path(f).relative_to("benchmarks/results"))) for f in summary["files"]]
        trl = summary["groups"].get("trl/sync")
        for name, g in summary["groups"].items():
            if name.startswith("trl/") or g.get("to_trl_final_train_wall_s") is None:
                continue  # TRL itself, or a variant that never reached TRL's accuracy
            framework, variant = name.split("/", 1)
            mine = [r for r in runs if r.get("framework") == framework and r.get("variant") == variant]
            first = mine[0] if mine else {}
            seeds = len(g.get("seeds", []))
            peer = f"TRL 1.16 GRPOTrainer: {trl['to_trl_final_train_wall_s']:.1f} s" if trl else ""
            loop = g.get("trl_over_rlfleet_loop_s")
            rows.append(
                Row(
                    f"SmolLM2-135M, {job}: training s to TRL's final pass@1 "
                    f"({summary['base_pass@1']:.2f} -> {summary['trl_final_pass@1']:.2f}), rlfleet {variant}, "
                    f"{seeds} seed{'s' if seeds != 1 else ''}",
                    f"{g['to_trl_final_train_wall_s']:.1f} s (step {g['to_trl_final_step']:.0f})"
                    + (f"; after start-up {ratio(loop)} TRL's speed" if loop else ""),
                    peer,
                    ratio(g["trl_over_rlfleet_train_wall_s"]) if "trl_over_rlfleet_train_wall_s" in g else "",
                    date(first),
                    machine(first.get("env")),
                    command(first.get("command", f"bash benchmarks/learning_vs_trl_gpu.sh {mode}")),
                    "benchmarks/learning.md#learning-against-trl-a-real-model-on-a-real-task-issue-40-benchmarkslearning_vs_trlpy",
                )
            )
    return rows


def smollm2_cpu() -> list[Row]:
    """The SmolLM2 example on a 2-core CPU box: greedy eval pass@1 before and after 20 steps."""
    doc = load("smollm2_cpu_2core.json")
    evals = doc["evals"]
    last = max((k for k in evals if k.startswith("step_")), key=lambda k: int(k.split("_")[1]))
    return [
        Row(
            f"SmolLM2-135M on a CPU box: eval pass@1 (100 held-out, greedy) after {int(last.split('_')[1]) + 1} steps",
            f"{evals['base']['pass@1']:.2f} -> {evals[last]['pass@1']:.2f}",
            "",
            "",
            date(doc),
            doc["machine"],
            command(doc["command"]),
            "real-model.md",
        )
    ]


def distill_cpu() -> list[Row]:
    """On-policy distillation against RL with SmolLM2 on a 2-core CPU box: steps to 90% of the
    teacher's (an RL run's) greedy pass@1."""
    doc = load("distill_cpu_2core.json")
    s = doc["results"]["summary"]
    steps, secs = s["steps_to_target"], s["train_s_to_target"]
    return [
        Row(
            f"SmolLM2-135M on a CPU box, one-digit addition: steps to 90% of the RL teacher's pass@1 "
            f"({s['teacher_pass@1']:.2f}), on-policy distillation",
            f"{steps['distill']} steps ({secs['distill']:.0f} s in the loop)",
            f"RL alone (rlfleet): {steps['rl']} steps ({secs['rl']:.0f} s)",
            f"{s['steps_over_rl']['distill']:.2f}x the steps",
            date(doc),
            machine(doc["env"]),
            "python benchmarks/distill.py --device cpu --teacher-steps 12 --steps 8 --eval-interval 1 --out ...",
            "algorithms.md#measured-smollm2-on-a-cpu-box",
        )
    ]


def trainer_mfu() -> list[Row]:
    """The trainer's step against plain transformers on the same host (1.5B shape, seq 4096)."""
    doc = load("trainer_mfu_h100_mbs4x4.json")
    by = {(r["shape"], r["impl"]): r for r in doc["results"]}
    mine, plain = by[("1.5b", "rlfleet")], by[("1.5b", "plain transformers")]
    return [
        Row(
            "Trainer MFU, 1.5B shape, 4 x 4096-token rows per micro-batch",
            f"{mine['mfu']:.1%} ({mine['tokens_per_second']:,.0f} tokens/s)",
            f"plain transformers: {plain['mfu']:.1%}",
            ratio(mine["tokens_per_second"] / plain["tokens_per_second"]),
            date(doc, "2026-11-23"),
            machine(doc["env"]),
            "python benchmarks/trainer_mfu.py --shapes 1.5b,0.5b --micro-batch-size 4 --micro-batches 4 "
            "--plain-micro-batch-size 2 --variants fast --warmup 2 --steps 5 --out ...",
            "benchmarks/trainer.md#one-host-sync-per-step-lm-head-chunk-8192-4-micro-batches-per-step-2026-11-23-h100",
        )
    ]


def trainer_packed() -> list[Row]:
    """The trainer's step on packed rows of a long-tail mix: varlen attention, compiled, against the
    trainer as it was (transformers' sdpa with a dense block-diagonal mask), one run on one host;
    and the train phase inside the loop (its step metrics)."""
    doc = load("trainer_packed_h200.json")
    rows = []
    for shape in ("0.5b", "1.5b"):
        by = {(r["attention"], r["compile"]): r for r in doc["rows"] if r["shape"] == shape}
        now, before = by[("varlen", True)], by[("sdpa", False)]
        rows.append(
            Row(
                f"Trainer step on packed rows ({shape[:-1]}B shape, samples up to 4,096 tokens), trained tokens/s",
                f"{now['tokens_per_second']:,.0f} ({now['mfu']:.1%} MFU)",
                f"the trainer before (sdpa, dense mask): {before['tokens_per_second']:,.0f} ({before['mfu']:.1%})",
                ratio(now["tokens_per_second"] / before["tokens_per_second"]),
                doc["date"],
                "1x " + doc["device"].removeprefix("NVIDIA "),
                "python benchmarks/packed_attention.py --shapes 0.5b,1.5b --out ...; "
                "rlfleet trainer --bench --model.path DIR --bench.output-json ...",
                "benchmarks/trainer.md#packed-rows-through-varlen-attention-2026-11-27",
            )
        )
    kernels = load("attention_kernels_fa4_h200.json")
    for shape in ("0.5b", "1.5b"):
        by = {r["kernel"]: r for r in kernels["rows"] if r["shape"] == shape}
        rows.append(
            Row(
                f"Varlen attention on a packed row ({shape[:-1]}B shape's heads, 16,384 tokens), "
                "causal forward + backward TFLOP/s",
                f"FlashAttention-4: {by['fa4']['tflops']:.0f}",
                f"torch's FlashAttention-2: {by['flash']['tflops']:.0f}",
                ratio(by["fa4"]["tflops"] / by["flash"]["tflops"]),
                kernels["date"],
                "1x " + kernels["device"].removeprefix("NVIDIA "),
                "python benchmarks/attention_kernels.py --shapes 0.5b,1.5b --kernels flash,fa4 --out ...",
                "benchmarks/trainer.md#flashattention-4-for-packed-rows-2026-11-28",
            )
        )
    loop = load("trainer_in_loop_h100_05b.json")
    steady = [s for s in loop["steps"] if s["step"] > 0]
    tps = sorted(s["train_tokens_per_s"] for s in steady)
    mfu = sorted(s["mfu"] for s in steady)
    rows.append(
        Row(
            "Trainer inside the long-tail loop (0.5B shape, one shared GPU, k = 1), steps 1-5: "
            "trained tokens/s in the train phase",
            f"{tps[0]:,.0f}-{tps[-1]:,.0f} ({mfu[0]:.0%}-{mfu[-1]:.0%} MFU, padding "
            f"{max(s['padding_frac'] for s in steady):.0%})",
            "-",
            "-",
            loop["date"],
            "1x H100",
            "python benchmarks/long_tail.py --device cuda --shape 05b --steps 6 --only rlfleet --no-peak "
            "--eos-rate 0.002 --variants ... --out ...",
            "benchmarks/trainer.md#inside-the-loop-2026-11-27-one-h100-shared-by-vllm-and-the-trainer",
        )
    )
    return rows


def scaling() -> list[Row]:
    """The 4-GPU table (benchmarks/scaling.py): the trainer's in-loop MFU on its own GPU and on a
    shared one, and the best 4-GPU layout against one GPU."""
    doc = load("scaling_h200x4_05b_4steps.json")
    rows, env = doc["rows"], doc["layouts"]["shared-1"]["result"]["env"]
    host = f"4x {doc['device'].removeprefix('NVIDIA ')}"
    cmd = "python benchmarks/scaling.py --shape 05b --steps 4 --no-peak --out ..."
    page = "benchmarks/scaling.md"
    own, shared = rows["split-2-nccl"], rows["shared-1"]
    best = max((n for n in rows if doc["layouts"][n]["gpus"] == 4), key=lambda n: rows[n]["tokens_per_s"])
    return [
        Row(
            "Trainer inside the long-tail loop (0.5B shape, k = 1, FlashAttention-4, 8 rows a micro-batch), "
            "median MFU of steps 1-3",
            f"own GPU: {own['trainer_mfu']:.1%}; GPU shared with vLLM: {shared['trainer_mfu']:.1%}",
            "published in-loop: prime-rl 11-27%, TRL AsyncGRPO ~9%",
            "-",
            date(env),
            host,
            cmd,
            page,
        ),
        Row(
            f"Long-tail job (0.5B shape, 4 steps), trained tokens/s: best 4-GPU layout ({best}) against 1 GPU",
            f"{rows[best]['tokens_per_s']:,.0f}",
            f"1 GPU: {shared['tokens_per_s']:,.0f}",
            ratio(rows[best]["tokens_per_s"] / shared["tokens_per_s"]),
            date(env),
            host,
            cmd,
            page,
        ),
        *weak_scaling(),
    ]


def weak_row(name: str, anchor: str) -> Row:
    """One weak-scaling run (`--batch-per-gpu 32`, 32 prompts per GPU): its best 4-GPU layout's
    trained tokens/s against one GPU's x 4."""
    doc = load(name)
    rows, env = doc["rows"], doc["layouts"]["shared-1"]["result"]["env"]
    one, k = rows["shared-1"], doc.get("max_async_level") or 1
    best = max((n for n in rows if doc["layouts"][n]["gpus"] == 4), key=lambda n: rows[n]["tokens_per_s"])
    return Row(
        f"Long-tail job (0.5B shape, {doc['steps']} steps, k = {k}), 32 prompts per GPU: best 4-GPU layout "
        f"({best}), trained tokens/s against 1 GPU x 4",
        f"{rows[best]['tokens_per_s']:,.0f} ({rows[best]['efficiency']:.0%} of linear)",
        f"1 GPU: {one['tokens_per_s']:,.0f}",
        ratio(rows[best]["tokens_per_s"] / one["tokens_per_s"]),
        date(env),
        f"4x {doc['device'].removeprefix('NVIDIA ')}",
        f"python benchmarks/scaling.py --shape 05b --steps {doc['steps']} --no-peak --batch-per-gpu 32 "
        + (f"--max-async-level {k} " if k != 1 else "")
        + "--out ...",
        f"benchmarks/scaling.md#{anchor}",
    )


def weak_scaling() -> list[Row]:
    """The same job with 32 prompts per GPU, at k = 1 and k = 2; and the 1.5B shape's in-loop MFU on
    one shared GPU, run beside the first's lanes."""
    big = load("scaling_h200x4_15b_3steps.json")
    b = big["rows"]["shared-1"]
    return [
        weak_row(
            "scaling_h200x4_05b_4steps_bpg32.json", "weak-scaling-32-prompts-a-step-per-gpu-2026-11-28-later"
        ),
        weak_row("scaling_h200x4_05b_6steps_bpg32_k2.json", "two-steps-in-flight-k-2-6-steps-2026-11-29"),
        Row(
            "Trainer inside the long-tail loop at the 1.5B shape (one GPU shared with vLLM, k = 1, "
            "FlashAttention-4), median MFU of steps 1-2",
            f"{b['trainer_mfu']:.1%}",
            "published in-loop: prime-rl 11-27%, TRL AsyncGRPO ~9%",
            "-",
            date(big["layouts"]["shared-1"]["result"]["env"]),
            f"4x {big['device'].removeprefix('NVIDIA ')}",
            "python benchmarks/scaling.py --shape 15b --steps 3 --no-peak --only shared-1 --out ...",
            "benchmarks/trainer.md#in-the-loop-on-a-4x-h200-host-2026-11-28-later",
        ),
    ]


def cpu_tiny_vs_trl() -> list[Row]:
    """The tiny CPU job (make run's) against TRL GRPOTrainer (HF generate), both in one run of the
    script: the newest `vs_trl_cpu_2core*.json`."""
    docs = [load(p.name) for p in RESULTS.glob("vs_trl_cpu_2core*.json")]
    doc = max(docs, key=lambda d: d["env"]["date"])
    mine, trl = doc["results"]["rlfleet"], doc["results"]["trl"]
    return [
        Row(
            f"Tiny CPU job (make run's, {mine['steps']} steps): wall seconds, start-up included",
            f"{mine['wall_s']:.1f} s",
            f"TRL 1.16 GRPOTrainer (HF generate): {trl['wall_s']:.1f} s",
            ratio(trl["wall_s"] / mine["wall_s"]),
            date(doc),
            machine(doc["env"]),
            "python benchmarks/vs_trl.py --out ...",
            "benchmarks/cpu.md#what-the-cpu-jobs-step-loop-and-ends-were-waiting-on-2026-11-26-e030fbc-head",
        )
    ]


HEADLINES: list[Callable[[], list[Row]]] = [
    long_tail,
    learning_vs_trl,
    smollm2_cpu,
    distill_cpu,
    trainer_mfu,
    trainer_packed,
    scaling,
    cpu_tiny_vs_trl,
]


def table(pages: str) -> str:
    rows = [r for h in HEADLINES for r in h()]
    out = [
        "| headline | rlfleet | peer | rlfleet / peer | date | machine | command | details |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        link = f"[{r.page.split('#')[0].removesuffix('.md')}]({pages}{r.page})"
        cmd = r.command.replace("|", "\\|")
        out.append(
            f"| {r.headline} | {r.value} | {r.peer or '-'} | {r.ratio or '-'} | {r.date} | {r.machine} | "
            f"`{cmd}` | {link} |"
        )
    note = (
        "\nThe ratio is speed (tokens/s, MFU) or time-to-result (peer seconds / rlfleet seconds): above 1 "
        "rlfleet is ahead. Written by `python benchmarks/summarize.py` from `benchmarks/results/`.\n"
    )
    return "\n".join(out) + "\n" + note


def render(path: Path, pages: str) -> str:
    text = path.read_text()
    if START not in text or END not in text:
        raise SystemExit(f"{path}: no {START} ... {END} markers")
    head, rest = text.split(START, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{START}\n{table(pages)}{END}{tail}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true", help="fail if a table is stale; write nothing")
    a = p.parse_args(argv)
    stale = []
    for path, pages in TARGETS.items():
        new = render(path, pages)
        if new != path.read_text():
            stale.append(path)
            if not a.check:
                path.write_text(new)
    for path in stale:
        verb = "is stale: run python benchmarks/summarize.py" if a.check else "rewritten"
        print(f"{path.relative_to(ROOT)} {verb}", file=sys.stderr)
    return 1 if a.check and stale else 0


if __name__ == "__main__":
    sys.exit(main())
