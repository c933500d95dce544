"""Where a fleet is and what it serves: `<fleet dir>/<name>.json`, written by `rlfleet fleet up`
once its replicas serve and removed when it stops. The fleet dir is `$RLFLEET_FLEET_DIR`, else
`~/.rlfleet/fleets`: one per host user, as Prefect's home is.

A run compares its own replicas' server arguments with the fleet's (`mismatches`): a run that
would start vLLM differently (another model, dtype, max_model_len, TP, max_num_seqs, memory
share, extra arguments) is refused up front, naming each argument."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TypedDict

from rlfleet.config.models import InferenceJobConfig
from rlfleet.inference.server import server_args
from rlfleet.procs import running, this_process

# per run or per process, not the server's shape: a run's own seed does not reseed the fleet; a GPU
# fleet's replicas have sleep mode whatever a run's `inference.sleep` says (they rest between runs)
NOT_SHAPE = {"--host", "--port", "--seed", "--served-model-name", "--enable-sleep-mode"}


class FleetState(TypedDict):
    name: str
    pid: int  # the `rlfleet fleet up` process
    started: float  # its start time (psutil): a recycled pid is not the fleet
    urls: list[str]
    gpu_ids: list[str]
    model: str
    server: dict[str, str]  # one replica's vLLM arguments that a run must match (`shape`)
    api_url: str  # the Prefect API its runs use (fleet/api.py)
    trainer: str  # the warm trainer's spool directory (fleet/warm.py); "" when the fleet keeps none
    trainer_gpu_ids: list[str]


def fleet_dir() -> Path:
    return Path(os.environ.get("RLFLEET_FLEET_DIR") or Path.home() / ".rlfleet" / "fleets")


def state_path(name: str) -> Path:
    return fleet_dir() / f"{name}.json"


def shape(job: InferenceJobConfig) -> dict[str, str]:
    """A replica's vLLM arguments as flag -> value ("" for a bare flag), less NOT_SHAPE."""
    args, out, i = server_args(job, port=0), {}, 0
    while i < len(args):
        flag = args[i]
        value = args[i + 1] if i + 1 < len(args) and not args[i + 1].startswith("--") else ""
        if flag == "--model":  # one directory however a config spells it
            value = str(Path(value).resolve())
        if flag not in NOT_SHAPE:
            out[flag] = value
        i += 2 if value else 1
    return out


def mismatches(fleet: dict[str, str], run: dict[str, str]) -> list[str]:
    """Each server argument on which a run's replicas would differ from the fleet's."""
    return [
        f"{flag}: the fleet's {fleet.get(flag, '(unset)')!r}, the run's {run.get(flag, '(unset)')!r}"
        for flag in sorted(fleet.keys() | run.keys())
        if fleet.get(flag) != run.get(flag)
    ]


def write_state(
    name: str,
    urls: list[str],
    job: InferenceJobConfig,
    api_url: str = "",
    trainer: str = "",
    trainer_gpu_ids: list[str] | None = None,
) -> FleetState:
    """Written by the fleet's own process, once its replicas serve; atomic."""
    me = this_process()
    state: FleetState = {
        "name": name,
        "pid": int(me["pid"]),
        "started": me["started"],
        "urls": urls,
        "gpu_ids": job.gpu_ids,
        "model": job.model.path,
        "server": shape(job),
        "api_url": api_url,
        "trainer": trainer,
        "trainer_gpu_ids": trainer_gpu_ids or [],
    }
    path = state_path(name)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, state)
    return state


def write_json_atomic(path: Path, data: object) -> None:
    """`data` as JSON at `path`, whole or not at all (a reader polling for it sees no half file)."""
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(data, indent=2))
    os.replace(tmp, path)


def read_state(name: str) -> FleetState | None:
    """The fleet `name` if its process still runs (a state file a killed fleet left is stale)."""
    try:
        state: FleetState = json.loads(state_path(name).read_text())
    except (OSError, ValueError):
        return None
    return state if running(state["pid"], state["started"]) else None


def live_fleets() -> list[FleetState]:
    d = fleet_dir()
    names = sorted(p.stem for p in d.glob("*.json")) if d.is_dir() else []
    return [s for n in names if (s := read_state(n)) is not None]


def remove_state(name: str) -> None:
    state_path(name).unlink(missing_ok=True)
