"""The pictures that lead the docs' benchmark pages, drawn from results already measured (no run of
their own): each a PNG beside the JSON of its bars, which names every bar's results file.

    python benchmarks/figures.py                  # every page's picture
    python benchmarks/figures.py startup cpu      # some of them

benchmarks/summarize.py redraws them too, and its `--check` fails when one's JSON is stale; it draws
the headline's (results/summary.png) with `draw`. The other pages open on a picture their own
investigation drew (learning_vs_trl.py, long_tail.py, scaling.py, packed_attention.py: each `--plot`)."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from statistics import median
from typing import Any

from claims import RESULTS, cpu_tiny_vs_trl, fresh_clone, load  # a sibling: this directory is on sys.path
from common import pyplot, save_png


def bar(
    panel: str, label: str, value: float, source: str, peer: bool = False, text: str = ""
) -> dict[str, Any]:
    """One bar: `peer` ones are grey, rlfleet's blue; `text` is written at its end (default: seconds)."""
    return {"panel": panel, "label": label, "value": value, "peer": peer, "text": text, "source": source}


def draw(figure: dict[str, Any], png: Path) -> None:
    """A figure JSON's bars, one horizontal panel per `panel`, a line at `ref` (the peer, for ratios)."""
    rows, ref = figure["bars"], figure.get("ref")
    panels = list(dict.fromkeys(r["panel"] for r in rows))
    counts = [sum(r["panel"] == p for r in rows) for p in panels]  # a bar's height the same in each
    fig, axes = pyplot().subplots(
        len(panels), 1, figsize=(9, 1.3 + 0.3 * sum(counts)), dpi=110, height_ratios=counts, squeeze=False
    )
    for ax, panel in zip(axes[:, 0], panels, strict=True):
        mine = [r for r in rows if r["panel"] == panel]
        behind = [r["peer"] or (ref is not None and r["value"] < ref) for r in mine]
        ax.barh(
            [r["label"] for r in mine],
            [r["value"] for r in mine],
            color=["tab:gray" if b else "tab:blue" for b in behind],
        )
        for i, r in enumerate(mine):
            ax.text(
                r["value"], i, f" {r['text'] or format(r['value'], '.1f') + ' s'}", va="center", fontsize=8
            )
        if ref is not None:
            ax.axvline(ref, color="black", lw=0.8, ls="--")
        ax.invert_yaxis()
        ax.set_title(panel, fontsize=9)
        ax.set_xlabel(figure["xlabel"])
        ax.set_xlim(0, max(r["value"] for r in mine) * 1.18)
    fig.suptitle(figure["title"], fontsize=10)
    save_png(fig, png, dpi=110)


def startup() -> dict[str, Any]:
    """Seconds from a command to its first step, cold against TRL and on a warm fleet."""

    def startup_s(directory: str, group: str) -> float:  # a learning_vs_trl group's mean start-up
        seeds = load(f"{directory}/summary.json")["groups"][group]["startup_s_per_seed"]
        return sum(seeds) / len(seeds)

    def first_steps(name: str) -> dict[str, list[float]]:  # fleet_start.py's, by variant
        return {v: [r["first_step_s"] for r in rs] for v, rs in load(name)["results"]["runs"].items()}

    smol = "SmolLM2-135M, one H200: command -> step 0 starts (start-up, base eval in)"
    tiny = "tiny job: command -> step 0's end"
    seq, fleet = "learning_vs_trl_h200_1gpu_cold_seq_", "fleet_back_to_back_h200_1gpu"
    bars = [
        bar(smol, label, startup_s(d, g), f"{d}/summary.json", g.startswith("trl"))
        for label, d, g in (
            ("TRL cold (11-27)", "learning_vs_trl_h200", "trl/sync"),
            ("rlfleet cold (11-27)", "learning_vs_trl_h200", "rlfleet/k1"),
            ("TRL cold (11-28)", "learning_vs_trl_h200x2_s11", "trl/sync"),
            ("rlfleet cold (11-28)", "learning_vs_trl_h200x2_s11", "rlfleet/k1"),
            ("rlfleet, warm fleet (11-28)", "learning_vs_trl_h200x2_s11_fleet2", "rlfleet/k2_fleet"),
            ("TRL cold (11-28, 2nd host)", "learning_vs_trl_h200x2_s12_fleet_wc", "trl/sync"),
            ("rlfleet, warm controller", "learning_vs_trl_h200x2_s12_fleet_wc", "rlfleet/k2_fleet"),
            ("rlfleet cold, alone first (11-29)", seq + "a", "rlfleet/k1"),
            ("TRL cold, alone second (11-29)", seq + "a", "trl/sync"),
            ("TRL cold, alone first (11-29)", seq + "b", "trl/sync"),
            ("rlfleet cold, alone second (11-29)", seq + "b", "rlfleet/k1"),
            ("rlfleet cold, inspection in server, 1st (11-29 b)", seq + "c", "rlfleet/k1"),
            ("TRL cold, 2nd (11-29 b)", seq + "c", "trl/sync"),
            ("rlfleet cold, inspection in server, 3rd (11-29 b)", seq + "d", "rlfleet/k1"),
            ("rlfleet k = 2 cold, 1st (11-29 c)", seq + "e", "rlfleet/k2"),
            ("TRL cold, 2nd (11-29 c)", seq + "e", "trl/sync"),
            ("rlfleet k = 2 cold, 3rd (11-29 c)", seq + "f", "rlfleet/k2"),
            ("TRL cold (11-29 d)", fleet, "trl/sync"),
            ("rlfleet fleet, 1st of 3 back to back", fleet, "rlfleet/k2_fleet_a"),
            ("rlfleet fleet, 2nd of 3 back to back", fleet, "rlfleet/k2_fleet_b"),
            ("rlfleet fleet, 3rd of 3 back to back", fleet, "rlfleet/k2_fleet_c"),
            ("TRL cold, 1st (11-29 e)", seq + "g", "trl/sync"),
            ("rlfleet k = 2 cold, 2nd (11-29 e)", seq + "g", "rlfleet/k2"),
            ("TRL cold, 1st (11-29 f)", seq + "h", "trl/sync"),
            ("rlfleet k = 2 cold, 2nd (11-29 f)", seq + "h", "rlfleet/k2"),
        )
    ]
    gpu, cpu = "fleet_start_h200_1gpu.json", "fleet_start_cpu_2core_warm_controller.json"
    warm = "fleet_warm_controller_h200/summary.json"
    bars += [
        bar(tiny, "H200 cold", first_steps(gpu)["cold"][0], gpu),
        bar(tiny, "H200 fleet, no warm controller", first_steps(gpu)["fleet"][0], gpu),
        bar(tiny, "H200 fleet, warm controller", load(warm)["runs"][0]["first_step_s"], warm),
        bar(tiny, "2 CPU cores cold (median)", median(first_steps(cpu)["cold"]), cpu),
        bar(tiny, "2 CPU cores fleet, warm controller", first_steps(cpu)["fleet"][0], cpu),
    ]
    return {"title": "Start-up: seconds from a command to its first step", "xlabel": "seconds", "bars": bars}


def cpu() -> dict[str, Any]:
    """The CPU box's two headline claims: make run's job against TRL, and a fresh clone's first step."""
    job, clone = cpu_tiny_vs_trl(), fresh_clone()
    panel = f"make run's tiny job, wall seconds, start-up in ({job.env['date'][:10]})"
    first = f"a fresh clone's make run: seconds to step 0's end, median ({clone.env['date'][:10]})"
    return {
        "title": "The 2-core CPU box",
        "xlabel": "seconds",
        "bars": [
            bar(panel, "rlfleet", job.mine, job.sources[0]),
            bar(panel, "TRL 1.16 GRPOTrainer", job.theirs, job.sources[0], peer=True),
            bar(first, "the Makefile now", clone.mine, clone.sources[0]),
            bar(first, "the Makefile before", clone.theirs, clone.sources[0], peer=True),
        ],
    }


def gpu_loop() -> dict[str, Any]:
    """The RL loop on one H100 per weight transport: the median step, tiny and 0.5B shapes."""
    bars = []
    for shape, panel in (("tiny", "a tiny model"), ("05b", "the 0.5B shape (416M parameters)")):
        name = f"gpu_loop_h100_{shape}.json"
        for transport in ("cuda_ipc", "filesystem"):
            r = load(name)["results"]["runs"][f"{shape}/{transport}"]
            bars.append(
                bar(f"{panel}: median step s", transport, r["median_step_s"], name, transport != "cuda_ipc")
            )
    return {
        "title": "The RL loop on one H100 (2026-11-23), per weight transport",
        "xlabel": "seconds",
        "bars": bars,
    }


def weights() -> dict[str, Any]:
    """The weight broadcast through S3 (moto on loopback) against a local disk, 2-core CPU box."""
    r, name = load("broadcast_cpu_2core.json")["results"], "broadcast_cpu_2core.json"
    step, big = (
        "the tiny model's weights: one step's broadcast, median s",
        "one 200 MiB file: publish + fetch, median s",
    )
    bars = []
    for label, key, peer in (("local disk", "local", False), ("S3", "s3", True)):
        s = r[key]["median_total_s"]
        bars.append(bar(step, label, s, name, peer, f"{s:.3f} s"))
    for label, key, peer in (("local disk", "big_local", False), ("S3", "big_s3", True)):
        bars.append(bar(big, label, r[key]["median_publish_s"] + r[key]["median_fetch_s"], name, peer))
    title = "Weight broadcast: a local run store against S3 (moto, loopback), 2026-11-22"
    return {"title": title, "xlabel": "seconds", "bars": bars}


FIGURES: dict[str, tuple[str, Callable[[], dict[str, Any]]]] = {  # name -> (its JSON, its bars)
    "startup": ("startup_summary.json", startup),
    "cpu": ("page_cpu.json", cpu),
    "gpu_loop": ("page_gpu_loop.json", gpu_loop),
    "weights": ("page_weights.json", weights),
}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("names", nargs="*", help=f"of {', '.join(FIGURES)} (default: all)")
    names = ap.parse_args(argv).names or list(FIGURES)
    if unknown := set(names) - set(FIGURES):
        ap.error(f"no figure named {', '.join(sorted(unknown))}")
    for name in names:
        out, bars = FIGURES[name]
        figure = bars()
        (RESULTS / out).write_text(json.dumps(figure, indent=1) + "\n")
        draw(figure, (RESULTS / out).with_suffix(".png"))
        print(f"benchmarks/results/{out} and its .png")


if __name__ == "__main__":
    main()
