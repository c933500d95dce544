"""The one Prefect task of an SFT run. Thin: the engine loop does the work in this process.

A retry calls `run_sft` again, which resumes one step past the latest complete checkpoint, so a
failed attempt costs at most `checkpoint_interval` steps. The run store, not Prefect's cache,
decides what is done, so the task is never cached.
"""

from __future__ import annotations

from typing import Any

from prefect import task
from prefect.cache_policies import NO_CACHE

from rlfleet.config.models import SFTConfig
from rlfleet.trainer.sft import run_sft


@task(name="sft_train", task_run_name="sft_train", cache_policy=NO_CACHE)
def sft_train(cfg: SFTConfig) -> dict[str, Any]:
    return run_sft(cfg)
