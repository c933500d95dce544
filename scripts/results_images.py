"""mkdocs hook: the benchmark pictures (`benchmarks/results/**/*.png`, each beside its JSON) served at
`benchmarks/results/` in the site, so a page under docs/benchmarks/ shows one as `results/NAME.png`
without a copy of it in docs/."""

from __future__ import annotations

from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent.parent / "benchmarks" / "results"


def on_files(files: Any, config: Any) -> Any:
    from mkdocs.structure.files import File

    for png in sorted(RESULTS.rglob("*.png")):  # a results directory's pictures too
        rel = png.relative_to(RESULTS).as_posix()
        files.append(File.generated(config, f"benchmarks/results/{rel}", content=png.read_bytes()))
    return files
