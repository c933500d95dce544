"""Run store over fsspec: atomic publish, manifests with checksums."""

from rlfleet.store.runstore import MANIFEST, CorruptArtifact, RunStore, step_dir

__all__ = ["MANIFEST", "CorruptArtifact", "RunStore", "step_dir"]
