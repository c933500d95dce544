"""Ablation grids: a base RLConfig and `{dotted.key: [values]}` -> one validated config per point.

Every point gets its own output_dir (`<base output_dir>/<point name>`) and its own port range, so
the child runs never share files or sockets. All points are validated before any run starts.
"""

from __future__ import annotations

import itertools
import re
from typing import Any

from rlfleet.config.loader import ConfigError, _set_dotted, validate
from rlfleet.config.models import RLConfig

PORT_STRIDE = 16  # ports per point: replica i of point p listens on base port + p * stride + i


def point_name(overrides: dict[str, Any]) -> str:
    text = "_".join(f"{k.rsplit('.', 1)[-1]}-{v}" for k, v in overrides.items())
    return re.sub(r"[^A-Za-z0-9_.-]+", "", text) or "base"


def expand_grid(base: RLConfig, grid: dict[str, list[Any]]) -> list[tuple[str, dict[str, Any], RLConfig]]:
    """(name, overrides, config) for every point of the cartesian product, in grid order."""
    if not grid or any(not isinstance(v, list) or not v for v in grid.values()):
        raise ConfigError("grid: give at least one key, each with a non-empty list of values")
    keys = [k.replace("-", "_") for k in grid]
    if base.inference.num_replicas > PORT_STRIDE:
        raise ConfigError(f"inference.num_replicas: at most {PORT_STRIDE} per ablation point")
    points = []
    for index, values in enumerate(itertools.product(*grid.values())):
        overrides = dict(zip(keys, values, strict=True))
        name = f"p{index}_{point_name(overrides)}"
        data = base.model_dump(mode="json", exclude_unset=True)  # defaults follow the overrides (loss.type)
        for key, value in overrides.items():
            _set_dotted(data, key, value)
        data["output_dir"] = f"{base.output_dir.rstrip('/')}/{name}"
        data["run_name"] = f"{base.name}-{name}"
        data.setdefault("inference", {})["port"] = base.inference.port + index * PORT_STRIDE
        try:
            cfg = validate(RLConfig, data)
        except ConfigError as e:
            raise ConfigError(f"ablation point {name}: {e}") from None
        points.append((name, overrides, cfg))
    return points
