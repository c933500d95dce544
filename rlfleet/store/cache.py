"""Local, verified copies of remote artifacts, for readers that need a path on local disk.

vLLM's `reload_weights` and `from_pretrained` read files, not S3 objects. Before a reload each
inference node copies the step's weights from the store into its cache (`RunStore.local_dir`),
checks every file against the manifest's size and sha256, and only then renames the copy into
place, so a half-downloaded or corrupt snapshot is never handed to vLLM.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import uuid
from pathlib import Path
from typing import Any

from rlfleet.store.layout import MANIFEST, step_of
from rlfleet.store.runstore import CorruptArtifact, RunStore, sha256_file

log = logging.getLogger("rlfleet.store")


def stage(store: RunStore, rel: str, keep: int | None = None, checksum: bool = True) -> Path:
    """A local directory holding artifact `rel`, every file verified against its manifest.

    A local store is its own cache: the artifact's directory is returned after a checksum check.
    A remote one is downloaded once into `<local_dir>/<rel>`; a later call with the same manifest
    reuses the copy. `keep` evicts older `step_N` copies of the same kind beyond the newest `keep`.
    checksum=False skips the sha256 of a local artifact (sizes are still checked); a download is
    always hashed. Raises FileNotFoundError when `rel` has no manifest and CorruptArtifact when a
    file is bad.
    """
    manifest = store.manifest(rel, verify=store.is_local and checksum)
    if manifest is None:
        raise FileNotFoundError(f"{store.uri(rel)} is not a complete artifact")
    if store.is_local:
        return store.local_path(rel)
    dest = store.local_dir / rel
    if _cached_manifest(dest) != manifest:
        _download(store, rel, manifest, dest)
    if keep is not None:
        evict(dest.parent, keep, protect=dest.name)
    return dest


def _cached_manifest(dest: Path) -> dict[str, Any] | None:
    try:
        return json.loads((dest / MANIFEST).read_text())
    except (OSError, json.JSONDecodeError):
        return None


def _download(store: RunStore, rel: str, manifest: dict[str, Any], dest: Path) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".tmp-{dest.name}-{uuid.uuid4().hex[:8]}")
    try:
        names = list(manifest["files"])
        for name in names:
            (tmp / name).parent.mkdir(parents=True, exist_ok=True)
        store.fs.get([store.path(rel, n) for n in names], [str(tmp / n) for n in names])  # concurrent
        for name, entry in manifest["files"].items():
            target = tmp / name
            if target.stat().st_size != entry["size"] or sha256_file(target) != entry["sha256"]:
                raise CorruptArtifact(f"{rel}/{name}: checksum mismatch after download")
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True))  # the marker, last
        if _cached_manifest(dest) == manifest:  # another rank or process on this node staged it
            return
        if dest.exists():
            trash = dest.with_name(f".trash-{dest.name}-{uuid.uuid4().hex[:8]}")
            os.replace(dest, trash)
            shutil.rmtree(trash, ignore_errors=True)
        try:
            os.replace(tmp, dest)
        except OSError:  # another process staged the same artifact first
            if _cached_manifest(dest) != manifest:
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    log.info("staged %s to %s", rel, dest)


def evict(parent: Path, keep: int, protect: str | None = None) -> list[str]:
    """Remove all but the newest `keep` `step_N` directories under parent (never `protect`)."""
    steps = sorted((s, p) for p in parent.glob("step_*") if p.is_dir() and (s := step_of(p.name)) is not None)
    removed = []
    for _, p in steps[: max(len(steps) - keep, 0)]:
        if p.name != protect:
            shutil.rmtree(p, ignore_errors=True)
            removed.append(p.name)
    return removed
