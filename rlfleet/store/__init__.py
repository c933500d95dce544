"""Run store over fsspec: atomic publish, manifests with checksums, a verified local cache; its
paths (`layout`) and what its files hold (`records`)."""

from rlfleet.store.cache import stage
from rlfleet.store.layout import MANIFEST, RunDir, step_dir
from rlfleet.store.runstore import CorruptArtifact, RunStore, cache_root, local_dir, run_store

__all__ = [
    "MANIFEST",
    "CorruptArtifact",
    "RunDir",
    "RunStore",
    "cache_root",
    "local_dir",
    "run_store",
    "stage",
    "step_dir",
]
