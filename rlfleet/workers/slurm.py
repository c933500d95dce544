"""A Prefect worker for `slurm` work pools: each flow run becomes one sbatch job.

`prefect worker start --pool <pool> --type slurm` (registered through the `prefect.collections`
entry point in pyproject.toml) or `rlfleet worker --pool <pool>`. The job script comes from the
pool's base job template (partition, nodes, gpus_per_node, time, account, qos, env,
extra_directives) rendered through rlfleet/resources/templates/prefect-worker.sbatch.j2; inside the job
`python -m prefect.engine` runs the flow run (deployment pull steps included).

The worker follows the job with squeue, then `scontrol show job` / sacct for its final state:
  COMPLETED                                -> the flow run's own final state stands
  FAILED, NODE_FAIL, TIMEOUT, PREEMPTED, ... -> Crashed, with the SLURM state, reason and exit code
  CANCELLED that Prefect did not ask for   -> Crashed (someone ran scancel), with the reason
A flow run cancelled in Prefect (pending or running) is scancelled and marked Cancelled.
Modeled on prefect's ProcessWorker (prefect/workers/process.py).
"""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import anyio
import anyio.abc
from prefect.client.schemas.objects import StateType
from prefect.exceptions import InfrastructureNotFound
from prefect.states import Cancelled, Crashed
from prefect.workers.base import BaseJobConfiguration, BaseVariables, BaseWorker, BaseWorkerResult
from pydantic import Field

from rlfleet.resources import TEMPLATES
from rlfleet.slurm.commands import (
    CANCELLED,
    SUCCESS,
    JobInfo,
    SlurmError,
    job_info,
    sbatch,
    scancel,
    squeue_state,
)
from rlfleet.slurm.render import render

if TYPE_CHECKING:
    from uuid import UUID

    from prefect.client.schemas.objects import Flow as APIFlow
    from prefect.client.schemas.objects import FlowRun, WorkPool
    from prefect.client.schemas.responses import DeploymentResponse

WORKER_TEMPLATE = TEMPLATES / "prefect-worker.sbatch.j2"


class SlurmJobConfiguration(BaseJobConfiguration):
    partition: str | None = Field(default=None)
    account: str | None = Field(default=None)
    qos: str | None = Field(default=None)
    nodes: int = Field(default=1, ge=1)
    gpus_per_node: int = Field(default=0, ge=0)
    time: str = Field(default="01:00:00")
    extra_directives: list[str] = Field(default_factory=list)
    working_dir: str | None = Field(default=None)
    job_dir: str | None = Field(default=None)
    poll_interval_s: float = Field(default=2.0, gt=0)

    def prepare_for_flow_run(
        self,
        flow_run: FlowRun,
        deployment: DeploymentResponse | None = None,
        flow: APIFlow | None = None,
        work_pool: WorkPool | None = None,
        worker_name: str | None = None,
        worker_id: UUID | None = None,
    ) -> None:
        super().prepare_for_flow_run(flow_run, deployment, flow, work_pool, worker_name, worker_id=worker_id)
        if self.command == self._base_flow_run_command():
            self.command = f"{sys.executable} -m prefect.engine"

    @staticmethod
    def _base_flow_run_command() -> str:
        return "python -m prefect.engine"  # as ProcessWorker: the flow run in the job's own process


class SlurmVariables(BaseVariables):
    partition: str | None = Field(default=None, description="sbatch --partition (none: the default one).")
    account: str | None = Field(default=None, description="sbatch --account.")
    qos: str | None = Field(default=None, description="sbatch --qos.")
    nodes: int = Field(default=1, ge=1, description="sbatch --nodes; the flow runs on the first.")
    gpus_per_node: int = Field(default=0, ge=0, description="sbatch --gpus-per-node (0: none).")
    time: str = Field(default="01:00:00", description="sbatch --time.")
    extra_directives: list[str] = Field(
        default_factory=list, description="More sbatch options, one `#SBATCH` line each ('--exclusive')."
    )
    working_dir: str | None = Field(default=None, description="The job's cwd (default: the worker's cwd).")
    job_dir: str | None = Field(
        default=None,
        description="Where job scripts and their output go (default: <PREFECT_HOME>/slurm-jobs).",
    )
    poll_interval_s: float = Field(default=2.0, gt=0, description="Seconds between squeue polls.")


class SlurmWorkerResult(BaseWorkerResult):
    """The job id (identifier) and its exit status."""


def job_script(flow_run: FlowRun, cfg: SlurmJobConfiguration, job_dir: Path) -> str:
    variables = {
        "job_name": cfg.name or f"prefect-{flow_run.name}",
        "partition": cfg.partition,
        "account": cfg.account,
        "qos": cfg.qos,
        "nodes": cfg.nodes,
        "gpus_per_node": cfg.gpus_per_node,
        "time": cfg.time,
        "extra_directives": cfg.extra_directives,
        "output": str(job_dir / f"{flow_run.id}-%j.out"),
        "working_dir": cfg.working_dir or os.getcwd(),
        "env": {k: v for k, v in cfg.env.items() if v is not None},
        "command": cfg.command,
    }
    return render(WORKER_TEMPLATE, variables)


class SlurmWorker(BaseWorker[SlurmJobConfiguration, SlurmVariables, SlurmWorkerResult]):
    type = "slurm"
    job_configuration = SlurmJobConfiguration
    job_configuration_variables = SlurmVariables
    _description = "Submit each flow run as a SLURM batch job (sbatch); follow it with squeue/scontrol."
    _display_name = "SLURM"
    _documentation_url = "https://slurm.schedmd.com/sbatch.html"

    async def run(
        self,
        flow_run: FlowRun,
        configuration: SlurmJobConfiguration,
        task_status: anyio.abc.TaskStatus[str] | None = None,
    ) -> SlurmWorkerResult:
        logger = self.get_flow_run_logger(flow_run)
        job_dir = Path(
            configuration.job_dir or Path(os.environ.get("PREFECT_HOME", "~/.prefect")) / "slurm-jobs"
        )
        job_dir = job_dir.expanduser().resolve()
        job_dir.mkdir(parents=True, exist_ok=True)
        script = job_dir / f"{flow_run.id}.sbatch"
        tmp = script.with_suffix(".tmp")
        tmp.write_text(job_script(flow_run, configuration, job_dir))
        tmp.replace(script)
        job_id = await anyio.to_thread.run_sync(sbatch, str(script))
        logger.info("submitted flow run %s as SLURM job %s (%s)", flow_run.name, job_id, script)
        if task_status is not None:
            task_status.started(job_id)  # becomes the flow run's infrastructure_pid

        info = await self._follow(flow_run, job_id, configuration.poll_interval_s)
        logger.info("%s", info.describe())
        code = 0 if info.state in SUCCESS else _exit_status(info)
        if info.state not in SUCCESS:
            code = await self._report(flow_run, info, code)
        return SlurmWorkerResult(identifier=job_id, status_code=code)

    async def _follow(self, flow_run: FlowRun, job_id: str, poll_s: float) -> JobInfo:
        """Poll until the job is final; scancel it if the flow run is cancelled meanwhile."""
        cancel_sent = False
        while True:
            state = await anyio.to_thread.run_sync(squeue_state, job_id)
            if state is None or state not in {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED"}:
                info = await anyio.to_thread.run_sync(job_info, job_id)
                if info is not None and info.final:
                    return info
                if info is None and state is None:
                    return JobInfo(job_id, "UNKNOWN", "the job left squeue and scontrol/sacct have no record")
            if not cancel_sent and await self._cancel_requested(flow_run):
                with contextlib.suppress(SlurmError):
                    await anyio.to_thread.run_sync(scancel, job_id)
                cancel_sent = True
            await anyio.sleep(poll_s)

    async def _cancel_requested(self, flow_run: FlowRun) -> bool:
        try:
            current = await self.client.read_flow_run(flow_run.id)
        except Exception:  # the API being briefly away must not lose the job
            return False
        return current.state is not None and current.state.type in (StateType.CANCELLING, StateType.CANCELLED)

    async def _report(self, flow_run: FlowRun, info: JobInfo, code: int) -> int:
        """Set the flow run's state for a job that did not complete; returns the status to hand back.

        0 tells BaseWorker not to propose its own generic Crashed state over ours.
        """
        current = await self.client.read_flow_run(flow_run.id)
        state = current.state
        if (
            info.state in CANCELLED
            and state is not None
            and state.type in (StateType.CANCELLING, StateType.CANCELLED)
        ):
            if state.type != StateType.CANCELLED:
                await self.client.set_flow_run_state(
                    flow_run.id, Cancelled(message=f"cancelled in Prefect; {info.describe()}"), force=True
                )
            return 0
        if state is not None and state.is_final() and not state.is_crashed():
            return code  # the flow reported its own outcome (e.g. Failed with its exception)
        why = " (scancel outside Prefect)" if info.state in CANCELLED else ""
        message = f"{info.describe()}{why}" + (
            f"; {state.message}" if state is not None and state.message else ""
        )
        await self.client.set_flow_run_state(flow_run.id, Crashed(message=message), force=True)
        self.get_flow_run_logger(flow_run).error("flow run crashed: %s", message)
        return 0

    async def kill_infrastructure(
        self, infrastructure_pid: str, configuration: SlurmJobConfiguration, grace_seconds: int = 30
    ) -> None:
        """scancel the flow run's job (Prefect's cancel of a pending flow run)."""
        try:
            await anyio.to_thread.run_sync(scancel, infrastructure_pid)
        except SlurmError as e:
            if "Invalid job id" in str(e):
                raise InfrastructureNotFound(f"SLURM job {infrastructure_pid} not found") from e
            raise

    async def _cancel_run(self, flow_run_id: UUID) -> None:
        """Cancelling a running flow run scancels its job too (BaseWorker handles pending ones only)."""
        flow_run = await self.client.read_flow_run(flow_run_id)
        if flow_run.start_time is None or not flow_run.infrastructure_pid:
            await super()._cancel_run(flow_run_id)
            return
        with contextlib.suppress(SlurmError):
            await anyio.to_thread.run_sync(scancel, flow_run.infrastructure_pid)
        self.get_flow_run_logger(flow_run).info("scancel %s: flow run cancelled", flow_run.infrastructure_pid)


def _exit_status(info: JobInfo) -> int:
    """`ExitCode=rc:signal` -> rc, or 128 + signal, or 1."""
    rc, _, sig = info.exit_code.partition(":")
    if rc.isdigit() and int(rc):
        return int(rc)
    if sig.isdigit() and int(sig):
        return 128 + int(sig)
    return 1


def main(argv: list[str] | None = None) -> int:
    """`rlfleet worker --pool X [prefect worker start options]`: the slurm type is registered on import."""
    from prefect.cli import app

    args = list(sys.argv[1:] if argv is None else argv)
    if "--type" not in args and "-t" not in args:
        args += ["--type", SlurmWorker.type]
    try:
        app(["worker", "start", *args])
    except SystemExit as e:
        return int(e.code or 0)
    return 0
