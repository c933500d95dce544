"""Write the Benchmarks page from benchmarks/results/: BENCHMARKS.md's headline, its docs copy
(docs/benchmarks/index.md), the README's numbers and the summary figure (results/summary.png, drawn
from results/summary.json beside it), all from the rows of benchmarks/claims.py; and the pictures
that lead the other benchmark pages (benchmarks/figures.py), each from the JSON beside it.

    python benchmarks/summarize.py            # rewrite what is between the markers, and the figures
    python benchmarks/summarize.py --check    # exit 1 if any of them is stale (tests/test_docs.py)

The prose under the table ("how to read them") is written from the same rows, so it cannot quote
older numbers than the table does.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # its sibling modules, also when loaded by path
from claims import CLAIMS, RESULTS, ROOT, Row, machine, stack  # noqa: E402
from figures import FIGURES, draw  # noqa: E402

SUMMARY = RESULTS / "summary.json"  # the figure's bars; summary.png is drawn from it
PAGES = {  # a page -> where its links to docs/ start, and where its pictures are
    ROOT / "BENCHMARKS.md": ("docs/", "benchmarks/results/"),
    ROOT / "docs" / "benchmarks" / "index.md": ("../", "results/"),
}
README = ROOT / "README.md"
MARKS = {"page": ("<!-- --8<-- [start:summary] -->", "<!-- --8<-- [end:summary] -->")}
MARKS["readme"] = ("<!-- --8<-- [start:headline] -->", "<!-- --8<-- [end:headline] -->")
PICTURE = "![rlfleet against its peer, one bar per claim: the ratio, above 1 rlfleet is ahead]({}summary.png)"


def x(ratio: float) -> str:
    return f"{ratio:.2f}x"


def sooner(ratio: float) -> str:
    return f"{x(ratio)} sooner" if ratio >= 1 else f"{x(1 / ratio)} later"


def readings(r: dict[str, Row]) -> list[str]:
    """What the rows say, in words: every number and every "ahead" or "behind" is read from a row."""
    lt, op, short, long, fleet = r["long_tail"], r["off_policy"], r["short"], r["long"], r["fleet"]
    best_cold = max(short.ratio, long.ratio)
    return [
        f"**Long generations are where rlfleet {'wins' if lt.ratio > 1 else 'does not win yet'}.** A rollout "
        "stream keeps vLLM full while the trainer steps and weights load in flight: on a long-tailed job it "
        f"trains {x(lt.ratio)} the tokens/s of TRL's step-synchronous loop on the same GPU ({machine(lt.env)}, "
        f"{lt.env['date'][:10]}), and keeping samples up to 3 weight loads old trains {x(op.ratio)} the "
        "tokens/s of dropping them (m = k).",
        f"**On short answers it reaches TRL's accuracy {'sooner' if short.ratio >= 1 else 'later'}.** Cold, "
        f"each run alone on one GPU, rlfleet at k = 2 reaches TRL's final pass@1 {sooner(short.ratio)}, counted "
        "from the command's start (its own processes, a vLLM server, a trainer and a Prefect API, start first); "
        f"attached to a warm fleet, whose processes are up already, {sooner(fleet.ratio)}.",
        f"**Long samples {'widen' if long.ratio > short.ratio else 'do not widen'} the gap.** Asked for its "
        f"working (up to 1,024 tokens), the same model reaches TRL's final pass@1 {sooner(long.ratio)} "
        f"({long.env['date'][:10]}). The goal of 3x sooner from a cold start is "
        + ("met." if best_cold >= 3 else f"not met yet (best {x(best_cold)})."),
        f"**The trainer and the GPUs.** At the 1.5B shape the trainer steps {x(r['trainer'].ratio)} the "
        f"tokens/s of plain transformers, packed rows through varlen attention {x(r['packed'].ratio)} the "
        f"dense-mask step's, FlashAttention-4 runs {x(r['attention'].ratio)} torch's FlashAttention-2, and "
        f"one 4-GPU host trains {x(r['scaling'].ratio)} one GPU's tokens/s ({r['scaling'].ratio / 4:.0%} of linear).",
        f"**Small CPU jobs {'pay for separate processes' if r['cpu_trl'].ratio < 1 else 'run ahead of TRL too'}.** "
        f"On make run's tiny job TRL takes {r['cpu_trl'].theirs:.1f} s against rlfleet's {r['cpu_trl'].mine:.1f} s "
        f"({x(r['cpu_trl'].ratio)}); a fresh clone's `make run` reaches its first step in {r['clone'].mine:.1f} s, "
        f"and on-policy distillation reaches 90% of its RL teacher in {r['distill'].mine:.0f} steps against "
        f"RL's {r['distill'].theirs:.0f}.",
    ]


def link(page: str, docs: str) -> str:
    return f"[{Path(page.split('#')[0]).stem}]({docs}{page})"


def block(rows: dict[str, Row], docs: str, pictures: str) -> str:
    """The page's headline: the picture, the table, its commands and how to read it."""
    out = [
        PICTURE.format(pictures),
        "",
        "Where rlfleet stands, measured: one row per claim, each the newest measurement of it. The ratio is "
        "speed (tokens/s, TFLOP/s) or time to a result (the peer's seconds or steps over rlfleet's): above 1 "
        "rlfleet is ahead. Ratios are only taken between numbers of one run of one script on one machine (or "
        "one session of one host); older figures are in the dated pages. Written from `benchmarks/results/` "
        "by `python benchmarks/summarize.py`, whose `--check` (run by `tests/test_docs.py`) fails when this "
        "page, its copy, the README's numbers or a benchmark page's picture is stale.",
        "",
        "| # | claim | rlfleet | peer | rlfleet / peer | date | machine | stack |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for n, r in enumerate(rows.values(), 1):
        out.append(
            f"| [{n}](#commands) | {r.claim} | {r.value} | {r.peer} | **{x(r.ratio)}** | {r.env['date'][:10]} "
            f"| {machine(r.env)} | {stack(r.env)} |"
        )
    out += ["", "## Commands", "", "Each row's, from the repository root (`...`: an output path):", ""]
    out += [f"{n}. `{r.command}` ({link(r.page, docs)})" for n, r in enumerate(rows.values(), 1)]
    out += ["", "## How to read them", ""]
    out += [f"- {line}" for line in readings(rows)]
    return "\n".join(out) + "\n"


def readme(rows: dict[str, Row]) -> str:
    """The README's numbers: the headline's rows, without what BENCHMARKS.md adds."""
    out = [
        PICTURE.format("benchmarks/results/"),
        "",
        "| claim | rlfleet | peer | rlfleet / peer |",
        "|---|---|---|---|",
    ]
    out += [f"| {r.claim} | {r.value} | {r.peer} | **{x(r.ratio)}** |" for r in rows.values()]
    out += [
        "",
        "Each the newest measurement of its claim; the dates, machines, stacks, commands and how to read "
        "them are in [BENCHMARKS.md](BENCHMARKS.md), written with this table by `python benchmarks/summarize.py`.",
    ]
    return "\n".join(out) + "\n"


def figure(rows: dict[str, Row]) -> str:
    """results/summary.json: one bar per claim, its ratio, and what it was read from."""
    bars = [
        {
            "panel": "rlfleet / its peer (dashed: the peer; above 1 rlfleet is ahead)",
            "label": r.label,
            "value": round(r.ratio, 4),
            "peer": False,
            "text": x(r.ratio),
            "source": ", ".join(r.sources),
            "claim": r.claim,
            "rlfleet": r.value,
            "against": r.peer,
            "date": r.env["date"][:10],
            "machine": machine(r.env),
            "stack": stack(r.env),
        }
        for r in rows.values()
    ]
    doc = {"title": "Where rlfleet stands: one bar per claim", "xlabel": "ratio", "ref": 1.0, "bars": bars}
    return json.dumps(doc, indent=1) + "\n"


def between(text: str, marks: tuple[str, str], new: str, path: Path) -> str:
    start, end = marks
    if start not in text or end not in text:
        raise SystemExit(f"{path}: no {start} ... {end} markers")
    head, rest = text.split(start, 1)
    return f"{head}{start}\n{new}{end}{rest.split(end, 1)[1]}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true", help="fail if anything is stale; write nothing")
    a = p.parse_args(argv)
    rows = {name: claim() for name, claim in CLAIMS.items()}
    wanted = {
        path: between(path.read_text(), MARKS["page"], block(rows, *where), path)
        for path, where in PAGES.items()
    }
    wanted[README] = between(README.read_text(), MARKS["readme"], readme(rows), README)
    wanted[SUMMARY] = figure(rows)
    wanted |= {RESULTS / out: json.dumps(bars(), indent=1) + "\n" for out, bars in FIGURES.values()}
    stale = [path for path, text in wanted.items() if not path.exists() or path.read_text() != text]
    # a picture is drawn from its JSON: stale with it, or when missing
    pngs = [f.with_suffix(".png") for f in wanted if f.suffix == ".json"]
    stale += [png for png in pngs if not png.exists() or png.with_suffix(".json") in stale]
    if not a.check:
        for path in stale:
            if path.suffix == ".png":
                draw(json.loads(wanted[path.with_suffix(".json")]), path)
            else:
                path.write_text(wanted[path])
    for path in stale:
        verb = "is stale: run python benchmarks/summarize.py" if a.check else "rewritten"
        print(f"{path.relative_to(ROOT)} {verb}", file=sys.stderr)
    return 1 if a.check and stale else 0


if __name__ == "__main__":
    sys.exit(main())
