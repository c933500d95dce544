"""Files rlfleet reads at run time, shipped inside the package (package-data in pyproject.toml).
Not code: the commands that read them are slurm/render.py, workers/slurm.py and workers/deploy.py.

- templates/rlfleet.sbatch.j2: the sbatch script of `rlfleet rl|sft|inference` with a `[slurm]` block
  (`[slurm] template_path` replaces it);
- templates/prefect-worker.sbatch.j2: the job script of the Prefect SLURM worker;
- prefect.yaml: the deployments `rlfleet deploy` creates.
"""

from __future__ import annotations

from pathlib import Path

HERE = Path(__file__).resolve().parent
TEMPLATES = HERE / "templates"
PREFECT_FILE = HERE / "prefect.yaml"
