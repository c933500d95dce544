"""Flow `fleet`: a warm fleet (rlfleet/fleet/) held by a work-pool worker, so that the runs the
pool's other workers start attach to it; cancelling the flow run stops it (SIGTERM)."""

from __future__ import annotations

from prefect import flow

from rlfleet.config.fleet import FleetConfig
from rlfleet.fleet.serve import up


@flow(name="fleet", flow_run_name="{config.name}", log_prints=True)
def fleet(config: FleetConfig) -> int:
    """Serve the fleet until the flow run is cancelled."""
    return up(config)
