"""`rlfleet rl|sft|inference` with a `[slurm]` block: resolve, write, render, submit (or stop: dry run).

What the job runs reads the configs written here, without their `[slurm]` block (so nothing inside
the job submits again). Everything is written atomically under `<output_dir>`:
  configs/<name>.toml   the resolved configs (rl + trainer/inference, sft, inference)
  slurm/<command>.sbatch the rendered script;  slurm/job.json  the submitted job's id
  logs/slurm/            created here: sbatch does not create the directory of --output
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from rlfleet.config.loader import ConfigError, raise_if, to_toml
from rlfleet.config.lora import check_lora
from rlfleet.config.model import check_model
from rlfleet.config.models import InferenceJobConfig, RLConfig, SFTConfig
from rlfleet.config.placement import gpus_needed, model_shape, place
from rlfleet.orchestrator.envs import check_envs
from rlfleet.slurm.commands import sbatch
from rlfleet.slurm.render import render, replicas_per_node, template_variables
from rlfleet.store import RunDir, layout, run_store
from rlfleet.store.writable import check_output_dir

AnyJob = RLConfig | SFTConfig | InferenceJobConfig


def _copy(cfg: BaseModel, **update: Any) -> Any:
    """A validated copy without the [slurm] block (plus `update`, dotted keys one level deep)."""
    data = cfg.model_dump(mode="json", exclude_none=True)
    data.pop("slurm", None)
    for key, value in update.items():
        section, _, field = key.partition(".")
        if field:
            data.setdefault(section, {})[field] = value
        else:
            data[key] = value
    return type(cfg).model_validate(data)


def _gpu_ids(n: int) -> list[str]:
    return [str(i) for i in range(n)]


def resolve(command: str, cfg: AnyJob) -> dict[str, BaseModel]:
    """The configs the job's processes read, by name."""
    d = cfg.deployment
    multi = d.type == "multi_node"
    hsdp: dict[str, Any] = {}
    if multi and d.num_train_nodes // d.nodes_per_fsdp_group > 1:
        hsdp["trainer.dp_replicate"] = d.num_train_nodes // d.nodes_per_fsdp_group
    if command == "sft":  # on multi_node each train node's torchrun sees that node's GPUs
        node = {"deployment": {"type": "single_node", "num_train_gpus": d.gpus_per_node}} if multi else {}
        return {"sft": _copy(cfg, **node, **hsdp)}
    tp = cfg.inference.tensor_parallel_size
    reps = replicas_per_node(d.gpus_per_node if multi else 0, tp)
    node_inference = {"inference.num_replicas": reps} if multi else {}
    node_gpus = _gpu_ids(reps * tp if multi and d.gpus_per_node else 0)
    if command == "inference":
        return {
            "inference": _copy(
                cfg, deployment={"type": "single_node"}, gpu_ids=node_gpus or cfg.gpu_ids, **node_inference
            )
        }
    rl = _copy(cfg, **hsdp)
    inference = _copy(rl.inference_job(), gpu_ids=node_gpus, **node_inference)
    return {
        "rl": rl,
        "trainer": rl.trainer_job(_gpu_ids(d.gpus_per_node) if multi else None),
        "inference": inference,
    }


def node_placement(cfg: AnyJob) -> str:
    """What an rl job places where on a node, on the GPUs SLURM gives it (`--gpus-per-node`, seen
    as 0..N-1 inside the job): the script echoes it. Only `rl` places vLLM beside a trainer."""
    if not isinstance(cfg, RLConfig):
        return ""
    d = cfg.deployment
    return place(cfg, _gpu_ids(gpus_needed(d)), model_shape(cfg.model.path)).describe()


def submit(command: str, cfg: AnyJob, env: dict[str, str] | None = None) -> dict[str, Any]:
    """Write the configs and the script; submit unless `slurm.dry_run`. Returns what was done."""
    slurm = cfg.slurm
    assert slurm is not None
    if "://" in cfg.output_dir and not cfg.output_dir.startswith("file://"):
        raise ConfigError(
            "output_dir: a SLURM job writes its logs and configs to a shared filesystem path, not a URL"
        )
    problems = check_model(cfg.model) + check_output_dir(cfg.output_dir)
    if not isinstance(cfg, InferenceJobConfig):
        problems += check_lora(cfg.trainer.lora)
    if isinstance(cfg, RLConfig):  # a bad env fails here, not minutes later inside the job
        problems += check_envs(cfg.orchestrator.env, "orchestrator.env")
    raise_if(problems)
    placement = node_placement(cfg)  # a layout that cannot run fails here, before sbatch
    jobs = resolve(command, cfg)
    out = Path(cfg.output_dir.removeprefix("file://")).resolve()
    here = RunDir(out)
    paths = {name: here.config(name) for name in jobs}
    variables = template_variables(
        command,
        slurm,
        cfg.deployment,
        out,
        paths,
        cfg.inference.port if command != "sft" else 0,
        cfg.inference.tensor_parallel_size if command != "sft" else 1,
        env,
        placement,
    )
    script = render(slurm.template_path, variables)  # a template error fails before anything is written
    store = run_store(str(out))
    for name, job in jobs.items():
        store.write_text(layout.config(name), to_toml(job))
    store.write_text(layout.sbatch_script(command), script)
    here.logs("slurm").mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {
        "script": str(out / layout.sbatch_script(command)),
        "configs": {k: str(v) for k, v in paths.items()},
        "logs": str(here.logs("slurm")),
        "job_id": None,
    }
    if slurm.dry_run:
        return result
    result["job_id"] = sbatch(result["script"])
    store.write_text(layout.SLURM_JOB, json.dumps({**result, "submitted_at": time.time()}, indent=2))
    return result
