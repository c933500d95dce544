"""The venv's bytecode, compiled once by `make install`. On 2 cores uv's install with
`--compile-bytecode` took 40 s; without it 9 s, and this 22 s (medians, docs/benchmarks/cpu.md).

Why bytecode: where PYTHONDONTWRITEBYTECODE is set, a module without it is compiled from source
again by every process of every run (vLLM's imports alone took 25 s). Why not uv's: this compiles
only what a run can import, site-packages without its packages' own `tests/` directories (12% of
the files) and the editable checkout's `rlfleet/`, which uv never compiles; and it gives the files
to the workers in a few dozen chunks (`python -m compileall -j` gives them one at a time, and took
as long for the smaller set as uv did for all of it).

    python scripts/compile_bytecode.py [DIR ...]   # default: site-packages and rlfleet/
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


def sources(root: Path) -> list[str]:
    out = []
    for d, dirs, files in os.walk(root):
        dirs[:] = [x for x in dirs if x not in ("tests", "__pycache__")]
        out += [os.path.join(d, f) for f in files if f.endswith(".py")]
    return out


def compile_all(files: list[str]) -> int:
    """Bytecode for each file; the count that did not compile (a package may ship Python 2 files)."""
    warnings.simplefilter("ignore")  # SyntaxWarnings from other projects' sources are not ours
    return sum(not compileall.compile_file(f, quiet=2) for f in files)


def main() -> None:
    # purelib and platlib: one directory where a venv's lib64 links to lib, two where it does not
    site = {Path(sysconfig.get_paths()[k]).resolve() for k in ("purelib", "platlib")}
    roots = [Path(p) for p in sys.argv[1:]] or [
        *sorted(site),
        Path(__file__).resolve().parents[1] / "rlfleet",
    ]
    files = [f for r in roots for f in sources(r)]
    n = os.cpu_count() or 1
    chunks = [files[i :: n * CHUNKS_PER_WORKER] for i in range(n * CHUNKS_PER_WORKER)]
    with Pool(n) as pool:
        failed = sum(pool.imap_unordered(compile_all, chunks))
    print(f"compiled {len(files) - failed} of {len(files)} files", file=sys.stderr)


if __name__ == "__main__":
    main()
