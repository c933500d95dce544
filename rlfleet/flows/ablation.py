"""Flow `ablation`: one child `rl` run per grid point, then a table comparing them."""

from __future__ import annotations

import statistics
from typing import Any

from prefect import flow, get_run_logger
from prefect.artifacts import create_table_artifact

from rlfleet.config.grid import expand_grid
from rlfleet.config.models import RLConfig
from rlfleet.flows.artifacts import artifact_key
from rlfleet.flows.rl import rl
from rlfleet.runs.configs import preflight
from rlfleet.store import layout, run_store
from rlfleet.store.records import read_metrics


def point_row(name: str, overrides: dict[str, Any], cfg: RLConfig, state: Any) -> dict[str, Any]:
    """Final reward, step time and trainer tokens/s of one finished point, read from its run store."""
    row: dict[str, Any] = {"point": name, **overrides, "state": state.name}
    if not state.is_completed():
        return row
    summary = state.result()
    store = run_store(cfg.output_dir)
    steps = summary["steps"]
    tokens = [read_metrics(store, s["step"])["num_loss_tokens"] for s in steps]
    secs = [s["step_seconds"] for s in steps]
    return row | {
        "final_reward": round(summary["last3_mean_reward"], 4),
        "median_step_s": round(statistics.median(secs), 3),
        "tokens_per_s": round(sum(tokens) / sum(secs), 1),
        "output_dir": cfg.output_dir,
    }


@flow(name="ablation", flow_run_name="ablation-{base.output_dir}", log_prints=True)
def ablation(base: RLConfig, grid: dict[str, list[Any]]) -> list[dict[str, Any]]:
    """Run `rl` once per point of `grid` ({"trainer.lr": [1e-3, 5e-3], ...}); a failed point is
    reported in the table and does not stop the others."""
    log = get_run_logger()
    points = expand_grid(base, grid)
    for _, _, cfg in points:  # every point checked (model, output dir, ports, GPUs) before the first starts
        preflight(cfg)
    rows = []
    for name, overrides, cfg in points:
        log.info("ablation point %s: %s -> %s", name, overrides, cfg.output_dir)
        state = rl.with_options(flow_run_name=f"{base.name}-{name}")(config=cfg, return_state=True)
        rows.append(point_row(name, overrides, cfg, state))
    create_table_artifact(
        key=artifact_key(base.name, "ablation"),
        table=rows,
        description=f"ablation over {list(grid)}: final reward = mean of the last 3 steps",
    )
    run_store(base.output_dir).write_json(layout.ABLATION, rows)
    return rows
