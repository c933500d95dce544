"""Start-up before and after, from results already measured (no run of its own): the seconds from a
command to its first step, cold against TRL and on a warm fleet, as one picture and one JSON.

    python benchmarks/startup_summary.py --out benchmarks/results/startup_summary.json

It reads benchmarks/results/ (each number's file is named in the JSON) and writes the JSON and a
PNG beside it. docs/benchmarks/startup.md shows both."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from statistics import median
from typing import Any, TypedDict

RESULTS = Path(__file__).resolve().parent / "results"


class Bar(TypedDict):
    panel: str  # which picture: the SmolLM2 job's start-up, or the tiny job's first step
    label: str
    seconds: float
    source: str  # the results file it comes from


def startup(directory: str, group: str) -> float:
    """A learning_vs_trl group's start-up (command -> step 0 starts), mean over its seeds."""
    seeds = json.loads((RESULTS / directory / "summary.json").read_text())["groups"][group][
        "startup_s_per_seed"
    ]
    return sum(seeds) / len(seeds)


def fleet_start(name: str) -> dict[str, list[float]]:
    """fleet_start.py's first steps (command -> step 0's end), by variant."""
    runs = json.loads((RESULTS / name).read_text())["results"]["runs"]
    return {v: [r["first_step_s"] for r in rs] for v, rs in runs.items()}


def bars() -> list[Bar]:
    smol = "SmolLM2-135M, one H200: command -> step 0 starts (start-up, base eval in)"
    tiny = "tiny job: command -> step 0's end"
    gpu, cpu = (
        fleet_start("fleet_start_h200_1gpu.json"),
        fleet_start("fleet_start_cpu_2core_warm_controller.json"),
    )
    warm = json.loads((RESULTS / "fleet_warm_controller_h200" / "summary.json").read_text())
    out: list[Bar] = []
    for label, directory, group in (
        ("TRL cold (11-27)", "learning_vs_trl_h200", "trl/sync"),
        ("rlfleet cold (11-27)", "learning_vs_trl_h200", "rlfleet/k1"),
        ("TRL cold (11-28)", "learning_vs_trl_h200x2_s11", "trl/sync"),
        ("rlfleet cold (11-28)", "learning_vs_trl_h200x2_s11", "rlfleet/k1"),
        ("rlfleet, warm fleet (11-28)", "learning_vs_trl_h200x2_s11_fleet2", "rlfleet/k2_fleet"),
        ("TRL cold (11-28, 2nd host)", "learning_vs_trl_h200x2_s12_fleet_wc", "trl/sync"),
        ("rlfleet, warm controller", "learning_vs_trl_h200x2_s12_fleet_wc", "rlfleet/k2_fleet"),
        ("rlfleet cold, alone first (11-29)", "learning_vs_trl_h200_1gpu_cold_seq_a", "rlfleet/k1"),
        ("TRL cold, alone second (11-29)", "learning_vs_trl_h200_1gpu_cold_seq_a", "trl/sync"),
        ("TRL cold, alone first (11-29)", "learning_vs_trl_h200_1gpu_cold_seq_b", "trl/sync"),
        ("rlfleet cold, alone second (11-29)", "learning_vs_trl_h200_1gpu_cold_seq_b", "rlfleet/k1"),
        (
            "rlfleet cold, inspection in server, 1st (11-29 b)",
            "learning_vs_trl_h200_1gpu_cold_seq_c",
            "rlfleet/k1",
        ),
        ("TRL cold, 2nd (11-29 b)", "learning_vs_trl_h200_1gpu_cold_seq_c", "trl/sync"),
        (
            "rlfleet cold, inspection in server, 3rd (11-29 b)",
            "learning_vs_trl_h200_1gpu_cold_seq_d",
            "rlfleet/k1",
        ),
        ("rlfleet k = 2 cold, 1st (11-29 c)", "learning_vs_trl_h200_1gpu_cold_seq_e", "rlfleet/k2"),
        ("TRL cold, 2nd (11-29 c)", "learning_vs_trl_h200_1gpu_cold_seq_e", "trl/sync"),
        ("rlfleet k = 2 cold, 3rd (11-29 c)", "learning_vs_trl_h200_1gpu_cold_seq_f", "rlfleet/k2"),
        ("TRL cold (11-29 d)", "fleet_back_to_back_h200_1gpu", "trl/sync"),
        ("rlfleet fleet, 1st of 3 back to back", "fleet_back_to_back_h200_1gpu", "rlfleet/k2_fleet_a"),
        ("rlfleet fleet, 2nd of 3 back to back", "fleet_back_to_back_h200_1gpu", "rlfleet/k2_fleet_b"),
        ("rlfleet fleet, 3rd of 3 back to back", "fleet_back_to_back_h200_1gpu", "rlfleet/k2_fleet_c"),
        ("TRL cold, 1st (11-29 e)", "learning_vs_trl_h200_1gpu_cold_seq_g", "trl/sync"),
        ("rlfleet k = 2 cold, 2nd (11-29 e)", "learning_vs_trl_h200_1gpu_cold_seq_g", "rlfleet/k2"),
        ("TRL cold, 1st (11-29 f)", "learning_vs_trl_h200_1gpu_cold_seq_h", "trl/sync"),
        ("rlfleet k = 2 cold, 2nd (11-29 f)", "learning_vs_trl_h200_1gpu_cold_seq_h", "rlfleet/k2"),
    ):
        out.append(
            {
                "panel": smol,
                "label": label,
                "seconds": startup(directory, group),
                "source": f"{directory}/summary.json",
            }
        )
    out += [
        {
            "panel": tiny,
            "label": "H200 cold",
            "seconds": gpu["cold"][0],
            "source": "fleet_start_h200_1gpu.json",
        },
        {
            "panel": tiny,
            "label": "H200 fleet, no warm controller",
            "seconds": gpu["fleet"][0],
            "source": "fleet_start_h200_1gpu.json",
        },
        {
            "panel": tiny,
            "label": "H200 fleet, warm controller",
            "seconds": warm["runs"][0]["first_step_s"],
            "source": "fleet_warm_controller_h200/summary.json",
        },
        {
            "panel": tiny,
            "label": "2 CPU cores cold (median)",
            "seconds": median(cpu["cold"]),
            "source": "fleet_start_cpu_2core_warm_controller.json",
        },
        {
            "panel": tiny,
            "label": "2 CPU cores fleet, warm controller",
            "seconds": cpu["fleet"][0],
            "source": "fleet_start_cpu_2core_warm_controller.json",
        },
    ]
    return out


def plot(rows: list[Bar], png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = list(dict.fromkeys(r["panel"] for r in rows))
    counts = [sum(r["panel"] == p for r in rows) for p in panels]  # a bar's height the same in each
    fig, axes = plt.subplots(
        len(panels), 1, figsize=(9, 1.2 + 0.28 * sum(counts)), dpi=110, height_ratios=counts
    )
    for ax, panel in zip(axes, panels, strict=True):
        mine = [r for r in rows if r["panel"] == panel]
        colors = ["tab:gray" if r["label"].startswith("TRL") else "tab:blue" for r in mine]
        ax.barh([r["label"] for r in mine], [r["seconds"] for r in mine], color=colors)
        for i, r in enumerate(mine):
            ax.text(r["seconds"], i, f" {r['seconds']:.1f} s", va="center", fontsize=8)
        ax.invert_yaxis()
        ax.set_title(panel, fontsize=9)
        ax.set_xlabel("seconds")
        ax.set_xlim(0, max(r["seconds"] for r in mine) * 1.18)
    fig.tight_layout()
    fig.savefig(png)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    out = Path(ap.parse_args().out)
    rows = bars()
    summary: dict[str, Any] = {"bars": rows}
    out.write_text(json.dumps(summary, indent=1))
    plot(rows, out.with_suffix(".png"))
    for r in rows:
        print(f"{r['seconds']:7.1f} s  {r['label']}  ({r['panel']})")


if __name__ == "__main__":
    main()
