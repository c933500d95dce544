"""SLURM engine: sbatch templates, job submission, and typed squeue/scontrol/sacct/scancel (no Prefect)."""
