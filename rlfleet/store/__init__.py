"""Run store over fsspec: atomic publish, manifests with checksums, a verified local cache."""

from rlfleet.store.cache import stage
from rlfleet.store.runstore import (
    MANIFEST,
    CorruptArtifact,
    RunStore,
    cache_root,
    local_dir,
    run_store,
    step_dir,
)

__all__ = [
    "MANIFEST",
    "CorruptArtifact",
    "RunStore",
    "cache_root",
    "local_dir",
    "run_store",
    "stage",
    "step_dir",
]
