"""`rlfleet rl|inference|trainer|model` — every component runs alone from the CLI, as in prime-rl.

rlfleet rl @ examples/tiny/rl.toml --orchestrator.batch-size 32
rlfleet inference @ outputs/tiny/configs/inference.toml
rlfleet trainer @ outputs/tiny/configs/trainer.toml
rlfleet model tiny --out models/tiny
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import time
from collections.abc import Sequence

from rlfleet.config.loader import ConfigError, load

USAGE = __doc__


def _rl(argv: Sequence[str]) -> int:
    from rlfleet.config.models import RLConfig
    from rlfleet.runs import preflight

    cfg = load(RLConfig, argv)
    preflight(cfg)  # fail in a second, before Prefect and vLLM take a minute to start
    from rlfleet.flows.rl import rl

    summary = rl(config=cfg)
    print(json.dumps({k: v for k, v in summary.items() if k != "steps"}, indent=2))
    return 0


def _inference(argv: Sequence[str]) -> int:
    from rlfleet.config.checks import check_model, check_ports, raise_if
    from rlfleet.config.models import InferenceJobConfig
    from rlfleet.inference.server import launch_replicas, stop_replicas

    cfg = load(InferenceJobConfig, argv)
    raise_if(check_model(cfg.model) + check_ports(cfg.inference))
    replicas = launch_replicas(cfg)
    print("serving:", " ".join(r.url for r in replicas), flush=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        while all(r.process.alive() for r in replicas):
            time.sleep(1.0)
        return 1
    except KeyboardInterrupt:
        return 0
    finally:
        stop_replicas(replicas)


def _trainer(argv: Sequence[str]) -> int:
    from rlfleet.config.models import TrainerJobConfig
    from rlfleet.trainer.worker import run_trainer

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    run_trainer(load(TrainerJobConfig, argv))
    return 0


def _model(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="rlfleet model")
    parser.add_argument("kind", choices=["tiny"])
    parser.add_argument("--out", required=True)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    from rlfleet.trainer.tiny import make_tiny_model

    print(make_tiny_model(args.out, seed=args.seed))
    return 0


def _runs(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="rlfleet runs")
    parser.add_argument("action", choices=["status"])
    parser.add_argument("output_dir")
    args = parser.parse_args(argv)
    from rlfleet.runs import status

    print(json.dumps(status(args.output_dir), indent=2))
    return 0


COMMANDS = {"rl": _rl, "inference": _inference, "trainer": _trainer, "model": _model, "runs": _runs}


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in COMMANDS:
        print(USAGE, file=sys.stderr)
        return 2
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    # The ephemeral Prefect server otherwise logs an error per run trying to reach its telemetry host.
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    try:
        return COMMANDS[argv[0]](argv[1:])
    except ConfigError as e:
        print(f"rlfleet {argv[0]}: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
