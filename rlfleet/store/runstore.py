"""The run store: one output_dir over fsspec, where every artifact is published atomically.

A directory artifact (`rollouts/step_3`, `weights/step_3`, ...) is complete only when its
`manifest.json` exists and every file it lists has the recorded size and sha256. On a local
filesystem the directory is built under a temp name and renamed into place; on object storage
the files are uploaded first and the manifest written last, so readers never trust a partial
upload.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
import uuid
from pathlib import Path
from typing import Any

import fsspec
from fsspec.implementations.local import LocalFileSystem

MANIFEST = "manifest.json"
_CHUNK = 1 << 20


class CorruptArtifact(RuntimeError):
    """A manifest exists but a file it lists is missing or has the wrong size or checksum."""


def sha256_file(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def file_entries(local_dir: Path) -> dict[str, dict[str, Any]]:
    """{relative path: {size, sha256}} for every file under local_dir except the manifest."""
    out = {}
    for p in sorted(local_dir.rglob("*")):
        if p.is_file() and p.name != MANIFEST:
            out[p.relative_to(local_dir).as_posix()] = {"size": p.stat().st_size, "sha256": sha256_file(p)}
    return out


class RunStore:
    def __init__(self, url: str | Path):
        self.url = str(url).rstrip("/")
        self.fs, root = fsspec.core.url_to_fs(self.url)
        self.root = root.rstrip("/")
        self.is_local = isinstance(self.fs, LocalFileSystem)

    def path(self, *parts: str) -> str:
        return "/".join([self.root, *parts])

    def local_path(self, *parts: str) -> Path:
        if not self.is_local:
            raise ValueError(f"{self.url} is not a local store")
        return Path(self.path(*parts))

    def exists(self, rel: str) -> bool:
        return self.fs.exists(self.path(rel))

    # -- small files ---------------------------------------------------------------------------
    def write_bytes(self, rel: str, data: bytes) -> None:
        """Write a file so that readers see the old content or the new one, never a prefix."""
        dest = self.path(rel)
        if self.is_local:
            Path(dest).parent.mkdir(parents=True, exist_ok=True)
            tmp = f"{dest}.tmp-{uuid.uuid4().hex[:8]}"
            try:
                with open(tmp, "wb") as f:
                    f.write(data)
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(tmp, dest)
            except BaseException:
                Path(tmp).unlink(missing_ok=True)
                raise
        else:
            # Single-PUT object writes are atomic on S3-compatible stores.
            self.fs.pipe_file(dest, data)

    def read_bytes(self, rel: str) -> bytes:
        return self.fs.cat_file(self.path(rel))

    def write_json(self, rel: str, obj: Any) -> None:
        self.write_bytes(rel, json.dumps(obj, indent=2, sort_keys=True).encode())

    def read_json(self, rel: str) -> Any:
        return json.loads(self.read_bytes(rel))

    def write_text(self, rel: str, text: str) -> None:
        self.write_bytes(rel, text.encode())

    # -- directory artifacts -------------------------------------------------------------------
    def staging_dir(self, rel: str) -> Path:
        """A fresh local directory to build artifact `rel` in before `publish_dir`."""
        if self.is_local:
            parent = self.local_path(rel).parent
            parent.mkdir(parents=True, exist_ok=True)
            tmp = parent / f".tmp-{Path(rel).name}-{uuid.uuid4().hex[:8]}"
        else:
            tmp = Path(os.environ.get("TMPDIR", "/tmp")) / f"rlfleet-stage-{uuid.uuid4().hex}"
        tmp.mkdir(parents=True)
        return tmp

    def publish_dir(self, src: Path, rel: str, meta: dict[str, Any] | None = None) -> dict[str, Any]:
        """Publish a local directory as artifact `rel`; the manifest is the last thing to appear."""
        manifest = {"artifact": rel, "created": time.time(), "files": file_entries(src), **(meta or {})}
        if self.is_local:
            (src / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True))
            dest = self.local_path(rel)
            if dest.exists():  # a stale, unpublished or superseded copy: replace it whole
                trash = dest.with_name(f".trash-{dest.name}-{uuid.uuid4().hex[:8]}")
                os.replace(dest, trash)
                shutil.rmtree(trash, ignore_errors=True)
            os.replace(src, dest)
        else:
            if self.fs.exists(self.path(rel)):
                self.remove(rel)
            for name in manifest["files"]:
                self.fs.put_file(str(src / name), self.path(rel, name))
            self.write_json(f"{rel}/{MANIFEST}", manifest)
            shutil.rmtree(src, ignore_errors=True)
        return manifest

    def manifest(self, rel: str, verify: bool = False) -> dict[str, Any] | None:
        """The artifact's manifest if it is complete, else None. verify=True checks sizes and sha256."""
        mpath = f"{rel}/{MANIFEST}"
        if not self.exists(mpath):
            return None
        try:
            manifest = self.read_json(mpath)
        except (json.JSONDecodeError, OSError) as e:
            raise CorruptArtifact(f"{rel}: unreadable manifest: {e}") from e
        for name, entry in manifest.get("files", {}).items():
            p = self.path(rel, name)
            if not self.fs.exists(p) or self.fs.size(p) != entry["size"]:
                raise CorruptArtifact(f"{rel}/{name}: missing or wrong size")
            if verify and self._sha256(p) != entry["sha256"]:
                raise CorruptArtifact(f"{rel}/{name}: checksum mismatch")
        return manifest

    def _sha256(self, path: str) -> str:
        if self.is_local:
            return sha256_file(path)
        h = hashlib.sha256()
        with self.fs.open(path, "rb") as f:
            while chunk := f.read(_CHUNK):
                h.update(chunk)
        return h.hexdigest()

    def complete_steps(self, kind: str) -> list[int]:
        """Steps N for which `<kind>/step_N` has a manifest (not verified)."""
        base = self.path(kind)
        if not self.fs.exists(base):
            return []
        steps = []
        for entry in self.fs.ls(base, detail=False):
            name = entry.rstrip("/").rsplit("/", 1)[-1]
            if name.startswith("step_") and name[5:].isdigit() and self.fs.exists(f"{entry}/{MANIFEST}"):
                steps.append(int(name[5:]))
        return sorted(steps)

    def remove(self, rel: str) -> None:
        p = self.path(rel)
        if not self.fs.exists(p):
            return
        if self.is_local:
            trash = Path(p).with_name(f".trash-{Path(p).name}-{uuid.uuid4().hex[:8]}")
            os.replace(p, trash)  # the manifest disappears with the rename, atomically
            shutil.rmtree(trash, ignore_errors=True)
        else:
            self.fs.rm(self.path(rel, MANIFEST))
            self.fs.rm(p, recursive=True)


def step_dir(kind: str, step: int) -> str:
    return f"{kind}/step_{step}"
