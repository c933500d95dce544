"""Render an sbatch script from a Jinja2 template: rlfleet's own or the user's `[slurm] template_path`.

The variables are listed in rlfleet/resources/templates/rlfleet.sbatch.j2's header (and README, "SLURM").
StrictUndefined: a custom template that names a variable rlfleet does not provide fails the render.
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import Any

import jinja2

from rlfleet.config.deployment import DeploymentConfig, MultiNodeDeployment, SlurmConfig
from rlfleet.config.placement import gpus_needed
from rlfleet.resources import TEMPLATES
from rlfleet.store import RunDir

DEFAULT_TEMPLATE = TEMPLATES / "rlfleet.sbatch.j2"


def template_variables(
    command: str,
    slurm: SlurmConfig,
    deployment: DeploymentConfig | MultiNodeDeployment,
    output_dir: Path,
    configs: dict[str, Path],
    inference_port: int,
    tensor_parallel_size: int = 1,
    env: dict[str, str] | None = None,
    placement: str = "",
) -> dict[str, Any]:
    multi = deployment.type == "multi_node"
    # single_node: the one node needs every GPU the deployment places, once each (colocated: shared)
    gpus = gpus_needed(deployment)
    return {
        "command": command,
        "job_name": slurm.job_name,
        "partition": slurm.partition,
        "account": slurm.account,
        "qos": slurm.qos,
        "time": slurm.time,
        "extra_directives": list(slurm.extra_directives),
        "multi_node": multi,
        "num_nodes": deployment.num_nodes if multi else 1,
        "num_infer_nodes": deployment.num_infer_nodes if multi else 0,
        "num_train_nodes": deployment.num_train_nodes if multi else 0,
        "gpus_per_node": gpus,
        "nodes_per_fsdp_group": deployment.nodes_per_fsdp_group if multi else 1,
        "nproc_per_node": max(gpus, 1),
        "replicas_per_node": replicas_per_node(gpus, tensor_parallel_size),
        "inference_port": inference_port,
        "rdzv_port": slurm.rdzv_port,
        "output_dir": str(output_dir),
        "log_dir": str(RunDir(output_dir).logs("slurm")),
        "configs": {k: str(v) for k, v in configs.items()},
        "workdir": str(Path.cwd()),
        "python": sys.executable,
        "rlfleet": f"{sys.executable} -m rlfleet.cli",
        "env": dict(env or {}),
        "placement": placement,
    }


def replicas_per_node(gpus_per_node: int, tensor_parallel_size: int) -> int:
    """One vLLM replica per TP group of a node's GPUs; one per CPU node."""
    return max(gpus_per_node // tensor_parallel_size, 1)


def render(template_path: str | Path | None, variables: dict[str, Any]) -> str:
    path = Path(template_path) if template_path else DEFAULT_TEMPLATE
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(path.parent)),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,  # noqa: S701 - a shell script, not HTML
    )
    env.filters["q"] = lambda v: shlex.quote(str(v))
    try:
        return env.get_template(path.name).render(**variables)
    except jinja2.TemplateError as e:
        raise ValueError(f"slurm.template_path: {path}: {type(e).__name__}: {e}") from e
