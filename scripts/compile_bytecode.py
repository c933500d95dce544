"""The venv's bytecode, compiled once by `make install`. On 2 cores uv's install with
`--compile-bytecode` took 40 s; compiling all of site-packages here 19-22 s; only the directories
a run imports from, 11-12 s (docs/benchmarks/cpu.md).

Why bytecode: where PYTHONDONTWRITEBYTECODE is set, a module without it is compiled from source
again by every process of every run (vLLM's imports alone took 25 s). Where it is not set, the
first run writes what it imports, one process at a time and the same module in several at once:
the first `make run` took 62 s to its first step without any of this. Why not uv's: it compiles
every file, and not the editable checkout's `rlfleet/`.

What is compiled: `rlfleet/`, and the site-packages directories listed in `run_imports.txt`, the
ones `make run`'s processes (the tiny model's writer, the controller, Prefect's server, vLLM, the
trainer) import from: ~11,000 of ~25,000 files. A module outside them is compiled when first
imported, as Python does. `make test` compiles everything (`--all`), as the suite imports more.
A list that lags the dependencies costs seconds, never a failure. To write it again:

    find .venv -name __pycache__ -prune -exec rm -rf {} +
    PYTHONDONTWRITEBYTECODE= make run
    .venv/bin/python scripts/compile_bytecode.py --record

    python scripts/compile_bytecode.py [--all | --record | DIR ...]   # DIR: every file under it
"""

from __future__ import annotations

import compileall
import os
import sys
import sysconfig
import warnings
from multiprocessing import Pool
from pathlib import Path

CHUNKS_PER_WORKER = 16
RUN_IMPORTS = Path(__file__).resolve().with_name("run_imports.txt")
RLFLEET = Path(__file__).resolve().parents[1] / "rlfleet"


def site_packages() -> list[Path]:
    """purelib and platlib: one directory where a venv's lib64 links to lib, two where it does not."""
    return sorted({Path(sysconfig.get_paths()[k]).resolve() for k in ("purelib", "platlib")})


def sources(root: Path) -> list[str]:
    """Every `.py` under root, without packages' own `tests/` (12% of site-packages' files)."""
    out = []
    for d, dirs, files in os.walk(root):
        dirs[:] = [x for x in dirs if x not in ("tests", "__pycache__")]
        out += [os.path.join(d, f) for f in files if f.endswith(".py")]
    return out


def listed(sites: list[Path]) -> list[str]:
    """The `.py` files directly in each directory `run_imports.txt` names; one that is gone is
    skipped and counted (the list lags the dependencies: write it again)."""
    lines = [x for x in RUN_IMPORTS.read_text().splitlines() if x and not x.startswith("#")]
    found = {x: [site / x for site in sites if (site / x).is_dir()] for x in lines}
    dirs = [d for ds in found.values() for d in ds]
    if gone := sum(not ds for ds in found.values()):
        print(
            f"{gone} of {len(lines)} directories in {RUN_IMPORTS.name} are not installed: --record again",
            file=sys.stderr,
        )
    return [str(p) for d in dirs for p in d.glob("*.py")]


def record(sites: list[Path]) -> None:
    """Write `run_imports.txt`: the directories under sites that hold bytecode of this interpreter."""
    tag = sys.implementation.cache_tag
    dirs = sorted(
        {
            str(Path(d).parent.relative_to(site))
            for site in sites
            for d, _, files in os.walk(site)
            if d.endswith("__pycache__") and any(f.endswith(f".{tag}.pyc") for f in files)
        }
    )
    head = "# site-packages directories `make run` imports from (scripts/compile_bytecode.py --record)\n"
    RUN_IMPORTS.write_text(head + "".join(f"{d}\n" for d in dirs))
    print(f"recorded {len(dirs)} directories in {RUN_IMPORTS}", file=sys.stderr)


def compile_all(files: list[str]) -> int:
    """Bytecode for each file; the count that did not compile (a package may ship Python 2 files)."""
    warnings.simplefilter("ignore")  # SyntaxWarnings from other projects' sources are not ours
    return sum(not compileall.compile_file(f, quiet=2) for f in files)


def main(argv: list[str]) -> None:
    if argv == ["--record"]:
        return record(site_packages())
    if argv == ["--all"]:
        files = [f for d in [*site_packages(), RLFLEET] for f in sources(d)]
    elif argv:
        files = [f for d in argv for f in sources(Path(d))]
    else:
        files = listed(site_packages()) + sources(RLFLEET)
    n = os.cpu_count() or 1
    chunks = [files[i :: n * CHUNKS_PER_WORKER] for i in range(n * CHUNKS_PER_WORKER)]
    with Pool(n) as pool:
        failed = sum(pool.imap_unordered(compile_all, chunks))
    print(f"compiled {len(files) - failed} of {len(files)} files", file=sys.stderr)


if __name__ == "__main__":
    main(sys.argv[1:])
