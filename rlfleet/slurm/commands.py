"""sbatch / squeue / scontrol / sacct / scancel with typed results.

Finished jobs are looked up with `scontrol show job` (kept for MinJobAge seconds) and, when
accounting (slurmdbd) is configured, with sacct; squeue alone forgets a job as it ends.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass

# SLURM job states (squeue long names) by what they mean for the run.
ACTIVE = {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED", "RESIZING", "SIGNALING"}
SUCCESS = {"COMPLETED"}
CANCELLED = {"CANCELLED", "REVOKED"}


class SlurmError(RuntimeError):
    """A SLURM command failed; the message carries its output."""


@dataclass(frozen=True)
class JobInfo:
    job_id: str
    state: str  # e.g. RUNNING, COMPLETED, CANCELLED (no "by 0" suffix)
    reason: str = ""
    exit_code: str = ""
    nodes: str = ""
    source: str = "scontrol"

    @property
    def active(self) -> bool:
        return self.state in ACTIVE

    @property
    def final(self) -> bool:
        return not self.active

    def describe(self) -> str:
        extra = ", ".join(
            f"{k} {v}"
            for k, v in (("reason", self.reason), ("exit code", self.exit_code))
            if v and v != "None"
        )
        return f"SLURM job {self.job_id} {self.state}" + (f" ({extra})" if extra else "")


def _run(cmd: Sequence[str], env: dict[str, str] | None = None, timeout: float = 60) -> str:
    try:
        proc = subprocess.run(list(cmd), capture_output=True, text=True, env=env, timeout=timeout)
    except FileNotFoundError as e:
        raise SlurmError(f"{cmd[0]} not found: is SLURM installed (scripts/install-slurm.sh)?") from e
    if proc.returncode != 0:
        raise SlurmError(
            f"{' '.join(cmd)} failed ({proc.returncode}): {proc.stderr.strip() or proc.stdout.strip()}"
        )
    return proc.stdout + proc.stderr


def sbatch(script: str, args: Sequence[str] = (), env: dict[str, str] | None = None) -> str:
    """Submit a script file; returns the job id."""
    out = _run(["sbatch", "--parsable", *args, script], env=env)
    return out.strip().splitlines()[-1].split(";")[0]


def scancel(job_id: str, signal: str | None = None, env: dict[str, str] | None = None) -> None:
    _run(["scancel", *([f"--signal={signal}", "--full"] if signal else []), job_id], env=env)


def squeue_state(job_id: str, env: dict[str, str] | None = None) -> str | None:
    """The job's state while squeue still lists it, else None."""
    try:
        out = _run(["squeue", "-h", "-j", job_id, "-o", "%T"], env=env).strip()
    except SlurmError:
        return None  # "Invalid job id specified" once the job has left the queue
    return out.split()[0] if out else None


def parse_scontrol(text: str) -> dict[str, str]:
    """`scontrol show job` output as key -> value (values never contain spaces but for Command=)."""
    fields: dict[str, str] = {}
    for token in re.findall(r"(\w[\w/:]*)=(\S*)", text):
        fields.setdefault(token[0], token[1])
    return fields


def scontrol_job(job_id: str, env: dict[str, str] | None = None) -> JobInfo | None:
    try:
        text = _run(["scontrol", "show", "job", job_id], env=env)
    except SlurmError:
        return None  # purged (older than MinJobAge) or never existed
    f = parse_scontrol(text)
    if "JobState" not in f:
        return None
    return JobInfo(
        job_id, f["JobState"], f.get("Reason", ""), f.get("ExitCode", ""), f.get("NodeList", ""), "scontrol"
    )


def sacct_job(job_id: str, env: dict[str, str] | None = None) -> JobInfo | None:
    """The job's allocation record from accounting; None when accounting is off or has no record."""
    try:
        out = _run(
            ["sacct", "-n", "-P", "-X", "-j", job_id, "-o", "JobID,State,Reason,ExitCode,NodeList"], env=env
        )
    except SlurmError:
        return None
    for line in out.splitlines():
        parts = line.split("|")
        if len(parts) == 5 and parts[0] == job_id:
            return JobInfo(job_id, parts[1].split()[0], parts[2], parts[3], parts[4], "sacct")
    return None


def job_info(job_id: str, env: dict[str, str] | None = None) -> JobInfo | None:
    """scontrol first (live and recent jobs), sacct for jobs scontrol has already forgotten."""
    return scontrol_job(job_id, env) or sacct_job(job_id, env)
