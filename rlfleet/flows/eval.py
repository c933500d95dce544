"""Flow `eval`: a checkpoint (latest, a step, or the base model) through its own vLLM servers, or
loaded on a warm fleet's (`fleet = NAME`).

The result lands in the run store (`evals/step_N.json`) and as a table artifact; deployment
`eval/scheduled` runs it on a cron schedule against a live run's output_dir.
"""

from __future__ import annotations

from typing import Any

from prefect import flow
from prefect.artifacts import create_table_artifact

from rlfleet.config.inference import check_ports
from rlfleet.config.loader import raise_if
from rlfleet.config.model import check_model
from rlfleet.config.models import EvalJobConfig
from rlfleet.flows.artifacts import artifact_key
from rlfleet.orchestrator.envs import check_envs
from rlfleet.tasks.eval import evaluate_checkpoint


@flow(name="eval", flow_run_name="eval-{config.output_dir}-{config.checkpoint}")
def eval_flow(config: EvalJobConfig) -> dict[str, Any]:
    ports = check_ports(config.inference) if config.fleet is None else []  # a fleet's replicas serve already
    raise_if(check_model(config.model) + ports + check_envs(config.eval.env, "eval.env"))
    record = evaluate_checkpoint.with_options(
        retries=1, timeout_seconds=config.inference.startup_timeout_s + 600
    )(config)
    create_table_artifact(
        key=artifact_key("eval", "result"),
        table=[{"step": record["step"], **e} for e in record["envs"]],
        description=f"eval of {config.output_dir} checkpoint {config.checkpoint}",
    )
    return record
