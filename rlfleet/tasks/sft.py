"""The one Prefect task of an SFT run. Thin: the engine loop does the work (in this process, or
as torchrun ranks on several GPUs).

A retry calls `run_sft` again, which resumes one step past the latest complete checkpoint, so a
failed attempt costs at most `checkpoint_interval` steps; an error that will recur (the engine
raises it, or torchrun ranks record it, see `run_torchrun`) is not retried. The run store, not
Prefect's cache, decides what is done, so the task is never cached.
"""

from __future__ import annotations

from typing import Any

from prefect import task
from prefect.cache_policies import NO_CACHE

from rlfleet.config.loader import to_toml
from rlfleet.config.models import SFTConfig
from rlfleet.config.placement import assign_gpus
from rlfleet.store import RunDir, layout, run_store
from rlfleet.trainer.launch import run_torchrun
from rlfleet.trainer.sft import run_sft


@task(name="sft_train", task_run_name="sft_train", cache_policy=NO_CACHE)
def sft_train(cfg: SFTConfig) -> dict[str, Any]:
    """In this process on one device; as torchrun ranks (FSDP2) over deployment.num_train_gpus > 1."""
    gpus = assign_gpus(cfg.deployment)[1]
    if len(gpus) <= 1:
        return run_sft(cfg)
    store = run_store(cfg.output_dir)
    config = RunDir(store.local_dir).sft_ranks_config  # the ranks read it from this machine's disk
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text(to_toml(cfg))
    run_torchrun(["sft", "@", str(config)], gpus, cfg.output_dir, "sft")
    return store.read_json(layout.SUMMARY)
