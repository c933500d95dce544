"""A real SLURM cluster on loopback for the tests: munged, slurmctld and slurmd from Debian's packages.

Everything lives in one tmp dir (its own munge key and socket, slurm.conf, state, spool, logs) and
runs in the foreground as child processes, so the test session owns and stops all of it. Two
node daemons on one host (`slurmd -N n1`, `-N n2` with distinct ports) give a two-node cluster.
Accounting (slurmdbd) is not configured: jobs are followed with squeue and `scontrol show job`,
which keep finished jobs for MinJobAge seconds.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

from rlfleet.procs import kill_group
from rlfleet.slurm.commands import JobInfo, scontrol_job

DAEMONS = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "scontrol", "scancel")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def missing_binaries() -> list[str]:
    extra = {"munged": "/usr/sbin/munged", "slurmctld": "/usr/sbin/slurmctld", "slurmd": "/usr/sbin/slurmd"}
    return [b for b in DAEMONS if not (shutil.which(b) or Path(extra.get(b, "/nonexistent")).exists())]


def _mem_mib() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) // 1024
    return 1024


class SlurmCluster:
    def __init__(self, root: Path, nodes: int = 2, cpus: int | None = None):
        self.root = root
        self.host = socket.gethostname()
        self.nodes = [f"n{i + 1}" for i in range(nodes)]
        self.cpus = cpus or os.cpu_count() or 1
        self.conf = root / "slurm.conf"
        self.socket = root / "munge" / "munge.socket"
        self.procs: list[subprocess.Popen] = []
        self.logs: list = []

    @property
    def env(self) -> dict[str, str]:
        return {"SLURM_CONF": str(self.conf)}

    def write_conf(self) -> None:
        r = self.root
        for d in ("munge", "state", "spool", "logs"):
            (r / d).mkdir(parents=True, exist_ok=True)
        ctld_port = _free_port()
        # Memory is left unmanaged (CR_Core): two node daemons share this host's RAM.
        node_lines = "\n".join(
            f"NodeName={n} NodeHostname={self.host} NodeAddr=127.0.0.1 Port={_free_port()} "
            f"CPUs={self.cpus} RealMemory={_mem_mib() // 2} State=UNKNOWN"
            for n in self.nodes
        )
        self.conf.write_text(
            f"""# written by tests/slurmcluster.py
ClusterName=rlfleet-test
SlurmctldHost={self.host}(127.0.0.1)
SlurmctldPort={ctld_port}
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={self.socket}
SlurmUser=root
SlurmdUser=root
StateSaveLocation={r / "state"}
SlurmdSpoolDir={r / "spool"}/%n
SlurmctldPidFile={r / "slurmctld.pid"}
SlurmdPidFile={r / "slurmd-%n.pid"}
SlurmctldLogFile={r / "logs" / "slurmctld.log"}
SlurmdLogFile={r / "logs" / "slurmd-%n.log"}
SlurmdParameters=config_overrides
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
SwitchType=switch/none
MpiDefault=none
ReturnToService=2
MinJobAge=3600
KillWait=5
InactiveLimit=0
SlurmctldTimeout=30
SlurmdTimeout=60
{node_lines}
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
"""
        )
        key = r / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        (r / "munge").chmod(0o700)

    def _spawn(self, name: str, cmd: list[str]) -> subprocess.Popen:
        log = open(self.root / "logs" / f"{name}.out", "wb")  # noqa: SIM115 - closed in stop()
        self.logs.append(log)
        proc = subprocess.Popen(
            cmd,
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **self.env},
            start_new_session=True,
        )
        self.procs.append(proc)
        return proc

    def start(self, timeout_s: float = 90) -> SlurmCluster:
        self.write_conf()
        m = self.root / "munge"
        self._spawn(
            "munged",
            ["munged", "--foreground", "--force", f"--socket={self.socket}", f"--key-file={m / 'munge.key'}"]
            + [
                f"--log-file={m / 'munged.log'}",
                f"--pid-file={m / 'munged.pid'}",
                f"--seed-file={m / 'seed'}",
            ],
        )
        self._wait(lambda: self.socket.exists(), timeout_s, "munged socket")
        self._spawn("slurmctld", ["slurmctld", "-D", "-i", "-f", str(self.conf)])
        self._wait(lambda: self._ok(["scontrol", "ping"]), timeout_s, "slurmctld")
        for n in self.nodes:
            self._spawn(f"slurmd-{n}", ["slurmd", "-D", "-N", n, "-f", str(self.conf)])
        self._wait(self.all_idle, timeout_s, "nodes idle")
        return self

    def all_idle(self) -> bool:
        out = self.run(["sinfo", "-h", "-N", "-o", "%N %t"], check=False).stdout.split()
        states = dict(zip(out[::2], out[1::2], strict=False))
        return sorted(states) == sorted(self.nodes) and all(s == "idle" for s in states.values())

    def run(self, cmd: list[str], check: bool = True) -> subprocess.CompletedProcess:
        proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **self.env}, timeout=60)
        if check and proc.returncode:
            raise RuntimeError(f"{' '.join(cmd)}: {proc.stdout}{proc.stderr}")
        return proc

    def _ok(self, cmd: list[str]) -> bool:
        return self.run(cmd, check=False).returncode == 0

    def _wait(self, cond, timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while not cond():
            dead = [p.args[0] for p in self.procs if p.poll() is not None]
            if dead or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"SLURM test cluster: {what} not ready (dead: {dead})\n{self.log_tail()}")
            time.sleep(0.5)

    def log_tail(self, chars: int = 3000) -> str:
        parts = []
        for f in sorted((self.root / "logs").glob("*")) + [self.root / "munge" / "munged.log"]:
            if f.is_file():
                parts.append(f"--- {f.name}\n{f.read_text(errors='replace')[-chars:]}")
        return "\n".join(parts)

    def stop(self) -> None:
        """Cancel what is still queued, stop the daemons, then reap job step daemons (slurmstepd
        detaches from slurmd, so killing slurmd's process group does not reach it)."""
        if self.procs and all(p.poll() is None for p in self.procs):
            self.run(["scancel", "--full", "--state=RUNNING"], check=False)
            self.run(["scancel", "--state=PENDING"], check=False)
            deadline = time.monotonic() + 30
            while self.run(["squeue", "-h"], check=False).stdout.strip() and time.monotonic() < deadline:
                time.sleep(0.5)
        for proc in reversed(self.procs):
            if proc.poll() is None:
                kill_group(proc.pid, 10)
                proc.wait()
        self.procs.clear()
        for pid in self._stepds():
            kill_group(pid, 5)
        for log in self.logs:
            log.close()
        self.logs.clear()

    def _stepds(self) -> list[int]:
        """slurmstepd processes of this cluster (their environment names its slurm.conf)."""
        mine = f"SLURM_CONF={self.conf}".encode()
        pids = []
        for proc in Path("/proc").glob("[0-9]*"):
            try:
                if proc.joinpath("comm").read_text().startswith("slurmstepd") and mine in proc.joinpath(
                    "environ"
                ).read_bytes().split(b"\0"):
                    pids.append(int(proc.name))
            except OSError:
                continue
        return pids


def wait_job(job_id: str, timeout_s: float = 600) -> JobInfo:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        info = scontrol_job(job_id)
        if info is not None and info.final:
            return info
        time.sleep(1)
    raise TimeoutError(f"SLURM job {job_id} not final after {timeout_s} s: {scontrol_job(job_id)}")


def show(cluster: SlurmCluster, job_id: str) -> str:
    """What squeue and scontrol say about a job (printed for the closing notes)."""
    q = cluster.run(["squeue", "-j", job_id], check=False)
    s = cluster.run(["scontrol", "show", "job", job_id], check=False).stdout
    keep = [
        ln.strip()
        for ln in s.splitlines()
        if ln.strip().startswith(("JobId", "JobState", "NodeList", "BatchHost"))
    ]
    text = f"$ squeue -j {job_id}\n{q.stdout}{q.stderr}$ scontrol show job {job_id} | grep ...\n" + "\n".join(
        keep
    )
    print(text)
    return text
