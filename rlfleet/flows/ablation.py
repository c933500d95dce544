"""Flow `ablation`: one child `rl` run per grid point, then a table comparing them. On a warm fleet
the children run at once, each in its own process on one of the fleet's replicas; otherwise one
after the other, as subflows."""

from __future__ import annotations

import statistics
import subprocess
import sys
from typing import Any

from prefect import flow, get_run_logger
from prefect.artifacts import create_table_artifact

from rlfleet.config.grid import expand_grid
from rlfleet.config.loader import to_toml
from rlfleet.config.models import RLConfig
from rlfleet.flows.artifacts import artifact_key
from rlfleet.flows.rl import rl
from rlfleet.runs.configs import preflight
from rlfleet.store import layout, run_store
from rlfleet.store.records import read_metrics


def point_row(
    name: str, overrides: dict[str, Any], cfg: RLConfig, state: str, summary: dict | None
) -> dict[str, Any]:
    """Final reward, step time and trainer tokens/s of one finished point, read from its run store."""
    row: dict[str, Any] = {"point": name, **overrides, "state": state}
    if summary is None:
        return row
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


def side_by_side(
    base: RLConfig, points: list[tuple[str, dict[str, Any], RLConfig]]
) -> dict[str, tuple[str, dict | None]]:
    """Each point as its own `rlfleet rl` process (the in-process registries, such as the early
    start's and the served models', hold one run), all started at once: each holds one of the
    fleet's replicas (fleet/attach.py) and the rest wait for one. Their flow runs go to the same
    Prefect API. Returns each point's state ("Completed" or "Failed", as a subflow's) and summary."""
    log = get_run_logger()
    configs = run_store(base.output_dir).local_dir / "ablation"
    configs.mkdir(parents=True, exist_ok=True)
    procs = {}
    for name, overrides, cfg in points:
        path = configs / f"{name}.toml"
        path.write_text(to_toml(cfg))
        log.info("ablation point %s: %s -> %s (its own process)", name, overrides, cfg.output_dir)
        with (configs / f"{name}.log").open("wb") as out:
            procs[name] = subprocess.Popen(
                [sys.executable, "-m", "rlfleet.cli", "rl", "@", str(path)],
                stdout=out,
                stderr=subprocess.STDOUT,
            )
    results: dict[str, tuple[str, dict | None]] = {}
    for (name, _, cfg), proc in zip(points, procs.values(), strict=True):
        rc = proc.wait()
        summary = run_store(cfg.output_dir).read_json(layout.SUMMARY) if rc == 0 else None
        if rc != 0:
            log.warning("ablation point %s failed (exit %d): see %s", name, rc, configs / f"{name}.log")
        results[name] = ("Completed" if summary is not None else "Failed", summary)
    return results


@flow(name="ablation", flow_run_name="ablation-{base.output_dir}", log_prints=True)
def ablation(base: RLConfig, grid: dict[str, list[Any]]) -> list[dict[str, Any]]:
    """Run `rl` once per point of `grid` ({"trainer.lr": [1e-3, 5e-3], ...}); a failed point is
    reported in the table and does not stop the others."""
    log = get_run_logger()
    points = expand_grid(base, grid)
    for _, _, cfg in points:  # every point checked (model, output dir, ports, GPUs) before the first starts
        preflight(cfg)
    rows = []
    if base.fleet is not None:  # at once, each in its own `rlfleet rl`, one fleet replica each
        results = side_by_side(base, points)
        rows = [point_row(name, ov, cfg, *results[name]) for name, ov, cfg in points]
    for name, overrides, cfg in points if base.fleet is None else []:
        log.info("ablation point %s: %s -> %s", name, overrides, cfg.output_dir)
        state = rl.with_options(flow_run_name=f"{base.name}-{name}")(config=cfg, return_state=True)
        rows.append(
            point_row(name, overrides, cfg, state.name, state.result() if state.is_completed() else None)
        )
    create_table_artifact(
        key=artifact_key(base.name, "ablation"),
        table=rows,
        description=f"ablation over {list(grid)}: final reward = mean of the last 3 steps",
    )
    run_store(base.output_dir).write_json(layout.ABLATION, rows)
    return rows
