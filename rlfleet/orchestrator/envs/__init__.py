"""Environments by type, built from their config entries; one module per type.

`load_envs` builds (and caches per process: datasets and user modules load once) the envs of a
config list; `check_envs` builds them in preflight and reports every problem with its field.
"""

from __future__ import annotations

import json
from typing import Any

from rlfleet.config.envs import env_name
from rlfleet.orchestrator.envs.base import Environment, Example, Trajectory
from rlfleet.orchestrator.envs.repeat import RepeatEnv
from rlfleet.usercode import UserCodeError

__all__ = ["Environment", "Example", "Trajectory", "build_env", "check_envs", "load_envs"]

_CACHE: dict[str, Environment] = {}


def build_env(cfg: Any) -> Environment:
    key = json.dumps(cfg.model_dump(mode="json", exclude={"weight"}), sort_keys=True)
    if key not in _CACHE:
        name = env_name(cfg)
        if cfg.type == "repeat":
            env: Environment = RepeatEnv(cfg.args, name)
        elif cfg.type == "python":
            from rlfleet.orchestrator.envs.python_env import PythonEnv

            env = PythonEnv(cfg.args, name)
        elif cfg.type == "reasoning_gym":
            from rlfleet.orchestrator.envs.reasoning_gym_env import ReasoningGymEnv

            env = ReasoningGymEnv(cfg.args, name)
        else:
            from rlfleet.orchestrator.envs.verifiers_env import VerifiersEnv

            env = VerifiersEnv(cfg.args, name)
        _CACHE[key] = env
    return _CACHE[key]


def load_envs(cfgs: list[Any]) -> list[Environment]:
    return [build_env(c) for c in cfgs]


def check_envs(cfgs: list[Any], field: str) -> list[str]:
    """Build every env of `field` (e.g. `orchestrator.env`) and list what is wrong, by field."""
    problems = []
    for i, cfg in enumerate(cfgs):
        where = f"{field}.{i}.args"
        try:
            env = build_env(cfg)
        except UserCodeError as e:  # its message starts with the field under `args`
            problems.append(f"{where}.{e}")
            continue
        except (ValueError, FileNotFoundError, ImportError) as e:
            problems.append(f"{where}: {e}")
            continue
        except Exception as e:  # a dataset or taskset that fails to load in any other way
            problems.append(f"{where}: {type(e).__name__}: {e}")
            continue
        problems += [f"{where}.{p}" for p in getattr(env, "problems", lambda: [])()]
    return problems
