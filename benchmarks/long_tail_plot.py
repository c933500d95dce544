"""Draw runs of `long_tail.py` side by side: what each trained and sampled a second, and what became
of its finished groups (trained or dropped as too stale). The PNG goes beside the first JSON.

    python benchmarks/long_tail_plot.py results/long_tail_h100_05b_8steps_m3.json \\
        results/long_tail_h100_05b_8steps_k1.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from claims import machine  # a sibling: this script's directory is on sys.path


def runs(paths: list[Path]) -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
    """Every rlfleet run of the files, by name (TRL's and the ratios left out), and the first file's env."""
    out: dict[str, dict[str, Any]] = {}
    docs = [json.loads(path.read_text()) for path in paths]
    for path, doc in zip(paths, docs, strict=True):
        for name, r in doc["results"].items():
            if isinstance(r, dict) and "stream" in r:
                if name in out:
                    raise SystemExit(f"{path}: a run named {name!r} is already in an earlier file")
                out[name] = r
    if not out:
        raise SystemExit(f"no rlfleet run in {[str(p) for p in paths]}")
    return out, docs[0]["env"]


def plot(paths: list[Path]) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows, env = runs(paths)
    fig, (tok, groups) = plt.subplots(1, 2, figsize=(10, 4))
    for i, r in enumerate(rows.values()):
        tok.bar(
            i,
            (r["all_gen_tokens_per_s"] or 0) / 1e3,
            color="C7",
            alpha=0.4,
            label="sampled" if not i else None,
        )
        tok.bar(i, r["gen_tokens_per_s"] / 1e3, width=0.6, color="C0", label="trained" if not i else None)
        tok.text(
            i, r["gen_tokens_per_s"] / 1e3, f"{r['gen_tokens_per_s'] / 1e3:.1f}k", ha="center", va="bottom"
        )
        s = r["stream"]
        trained = s["finished"] - s["dropped_stale"]
        dropped = s["dropped_stale"] + s.get("aborted_stale", 0)  # dropped at take, or cut in flight
        groups.bar(i, trained, color="C0", label="trained" if not i else None)
        groups.bar(i, dropped, bottom=trained, color="C3", label="stale" if not i else None)
        groups.text(i, trained + dropped, f"{dropped} stale", ha="center", va="bottom")
    for ax, label in ((tok, "tokens/s (thousands)"), (groups, "groups finished or cut")):
        ax.set_xticks(range(len(rows)), list(rows), rotation=15)
        ax.set_ylabel(label)
        ax.legend(loc="lower right", fontsize=8)
    steps = {r["steps"] for r in rows.values()}
    fig.suptitle(
        f"job (a), {'/'.join(map(str, sorted(steps)))} steps each, {machine(env)}, {env.get('date', '')}",
        fontsize=10,
    )
    fig.tight_layout()
    png = paths[0].with_suffix(".png")
    fig.savefig(png, dpi=110)
    return png


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("results", nargs="+", type=Path, help="long_tail.py JSONs; the PNG goes beside the first")
    print(plot(ap.parse_args().results))


if __name__ == "__main__":
    main()
