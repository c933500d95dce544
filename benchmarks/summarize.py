"""Write the headline table of BENCHMARKS.md (and of the docs' benchmarks page) from benchmarks/results/.

    python benchmarks/summarize.py            # rewrite the tables between the markers
    python benchmarks/summarize.py --check    # exit 1 if either is stale (tests/test_docs.py)

Each headline below names the result files it reads; the value, the peer's value, the ratio, the
date and the machine come from those files (a file that lacks a date or a machine names the
headline's own), so a new result changes the table only through its JSON. Learning runs are read
generically from each `LEARNING` directory's summary.json: one row per rlfleet group that reached TRL's accuracy.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # its sibling modules, also when loaded by path
from summary_rows import RESULTS, ROOT, Row, command, date, load, machine, ratio  # noqa: E402
from summary_trainer import scaling, trainer_mfu, trainer_packed  # noqa: E402

TARGETS = {  # file -> where its links start, relative to docs/
    ROOT / "BENCHMARKS.md": "docs/",
    ROOT / "docs" / "benchmarks" / "index.md": "../",
}
START, END = "<!-- --8<-- [start:summary] -->", "<!-- --8<-- [end:summary] -->"


# --- headlines --------------------------------------------------------------------------------


def long_tail_command(config: dict, flags: str) -> str:
    """Job (a)'s command line as a results file's `config` recorded it (every run: EOS 1/500, lr 1e-7)."""
    return (
        f"python benchmarks/long_tail.py --device {config['device']} --shape {config['shape']} "
        f"--steps {config['steps']} {flags} --no-peak --eos-rate 0.002 --trainer.lr 1e-7 "
        f'--variants "{config["variants"]}"'
    )


def m_equals_k(config: dict) -> dict:
    """`config` with m = k written into its k = 1 variants: unset, m was k when they ran (max(k, 3) now)."""
    parts = config["variants"].split(";")
    pin = " --orchestrator.max-off-policy-steps 1"
    fixed = [p if "max-off-policy-steps" in p or "max-async-level 1" not in p else p + pin for p in parts]
    return config | {"variants": ";".join(fixed)}


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
                long_tail_command(doc["config"], "--only rlfleet"),
                "benchmarks/long-generations.md#job-a-20-steps-per-transport-against-trl-and-job-b-on-the-gpu-2026-11-26",
            )
        )
    return rows


def long_tail_h100_vs_trl() -> list[Row]:
    """Job (a) against TRL on one H100 machine held for one session: m = 3 beside TRL in each of two
    calls, then m = k and m = 3 again, read against both TRL runs."""
    pairs = [load(f"long_tail_h100_05b_m3_trl_{i}.json") for i in (1, 2)]
    mk = load("long_tail_h100_05b_mk_m3.json")
    trl = [d["results"]["trl"]["gen_tokens_per_s"] for d in pairs]
    first = pairs[0]["config"]
    micro = first["trl_grpo_config"]["per_device_train_batch_size"]
    peer = f"TRL 1.16 GRPOTrainer, micro-batch {micro}: {' / '.join(f'{t:,.0f}' for t in trl)}"
    m3 = [d["results"]["cuda_ipc_m3"]["gen_tokens_per_s"] for d in pairs]
    base = mk["results"]["cuda_ipc_mk"]["gen_tokens_per_s"]
    page = "benchmarks/long-generations.md#job-a-against-trl-on-one-h100-2026-12-06"
    return [
        Row(
            "Long-tail GRPO job, trained tokens/s (0.5B shape, max_tokens 4096, k = 1, cuda_ipc, "
            "`max_off_policy_steps` 3), two runs, each beside TRL",
            " / ".join(f"{t:,.0f}" for t in m3),
            peer,
            " / ".join(ratio(a / b) for a, b in zip(m3, trl, strict=True)),
            date(pairs[0]),
            machine(pairs[0]["env"]),
            long_tail_command(first, f"--trl-steps {first['trl_steps']} --trl-vllm --trl-micro {micro}"),
            page,
        ),
        Row(
            "Long-tail GRPO job, trained tokens/s (0.5B shape, max_tokens 4096, k = 1, cuda_ipc, m = k), "
            "the same H100 session as TRL's runs",
            f"{base:,.0f}",
            peer,
            " / ".join(ratio(base / t) for t in trl),
            date(mk),
            machine(mk["env"]),
            long_tail_command(m_equals_k(mk["config"]), "--only rlfleet"),
            page,
        ),
    ]


def long_tail_h100_stream_fix() -> list[Row]:
    """Job (a) at m = k with vLLM 0.26's cut streams patched: one run beside TRL, one more on the same
    H100 machine, both read against that TRL run."""
    pair, again = load("long_tail_h100_05b_mk_trl_fix.json"), load("long_tail_h100_05b_mk_fix_2.json")
    trl = pair["results"]["trl"]["gen_tokens_per_s"]
    mine = [d["results"]["cuda_ipc_mk"]["gen_tokens_per_s"] for d in (pair, again)]
    c = m_equals_k(pair["config"])
    micro = c["trl_grpo_config"]["per_device_train_batch_size"]
    return [
        Row(
            "Long-tail GRPO job, trained tokens/s (0.5B shape, max_tokens 4096, k = 1, cuda_ipc, m = k), "
            "vLLM 0.26's cut streams patched, two runs, the first beside TRL",
            " / ".join(f"{t:,.0f}" for t in mine),
            f"TRL 1.16 GRPOTrainer, micro-batch {micro}: {trl:,.0f}",
            " / ".join(ratio(t / trl) for t in mine),
            date(pair),
            machine(pair["env"]),
            long_tail_command(c, f"--trl-steps {c['trl_steps']} --trl-vllm --trl-micro {micro}"),
            "benchmarks/long-generations.md#job-a-at-m-k-with-the-stream-fix-one-h100-2026-12-06-later",
        )
    ]


def long_tail_off_policy() -> list[Row]:
    """Job (a) at k = 1 with max_off_policy_steps 3 against m = k (the default then), one machine."""
    m3, k1 = load("long_tail_h100_05b_8steps_m3.json"), load("long_tail_h100_05b_8steps_k1.json")
    r, base = m3["results"]["cuda_ipc_m3"], k1["results"]["cuda_ipc"]
    stale = base["stream"]["dropped_stale"]
    return [
        Row(
            "Long-tail GRPO job, trained tokens/s (0.5B shape, 8 steps, k = 1, cuda_ipc): "
            "`max_off_policy_steps` 3 against m = k",
            f"{r['gen_tokens_per_s']:,.0f} ({r['stream']['dropped_stale']} groups dropped as stale)",
            f"m = k: {base['gen_tokens_per_s']:,.0f} ({stale} of {base['stream']['finished']} dropped)",
            ratio(r["gen_tokens_per_s"] / base["gen_tokens_per_s"]),
            date(m3),
            machine(m3["env"]),
            long_tail_command(m3["config"], "--only rlfleet"),
            "benchmarks/long-generations.md#max_off_policy_steps-3-on-the-gpu-every-sampled-group-trains-2026-12-06-one-h100",
        )
    ]


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
    "learning_vs_trl_h100_1gpu_cold_k2": (
        "one-digit addition, 32-token answers, cold, one H100, each run alone (TRL first, k = 2), "
        "before the stream fix",
        "cold",
    ),
    "learning_vs_trl_h100_1gpu_cold_k2_fix": (
        "one-digit addition, 32-token answers, cold, one H100, each run alone (TRL first, k = 2), "
        "vLLM 0.26's cut streams patched",
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


def fresh_clone() -> list[Row]:
    """A fresh clone's `make run` on the CPU box: seconds from the clone to step 0's end, medians of
    the newest Makefile (the last ref `fresh_clone.py` compared) and of the first ref, beside it."""
    doc = load("fresh_clone_cpu_2core.json")
    refs = doc["results"]["config"]["refs"]
    secs = {ref: [r["first_step_s"] for r in doc["results"]["runs"] if r["ref"] == ref] for ref in refs}
    new, old = statistics.median(secs[refs[-1]]), statistics.median(secs[refs[0]])
    before = len(refs) > 1
    return [
        Row(
            f"A fresh clone's `make run` (install, tiny model, run): seconds to step 0's end, median of {len(secs[refs[-1]])}",
            f"{new:.1f} s",
            f"the Makefile before ({refs[0]}), alternating: {old:.1f} s" if before else "",
            ratio(old / new) if before else "",
            date(doc),
            machine(doc["env"]),
            f"python benchmarks/fresh_clone.py {' '.join(f'--ref {r}' for r in refs)} --reps {len(secs[refs[-1]])} --out ...",
            "benchmarks/cpu.md#start-up-and-env-cost-issue-33-benchmarksstartuppy-benchmarksenv_costpy",
        )
    ]


HEADLINES: list[Callable[[], list[Row]]] = [
    long_tail,
    long_tail_h100_vs_trl,
    long_tail_h100_stream_fix,
    long_tail_off_policy,
    learning_vs_trl,
    smollm2_cpu,
    distill_cpu,
    trainer_mfu,
    trainer_packed,
    scaling,
    cpu_tiny_vs_trl,
    fresh_clone,
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
