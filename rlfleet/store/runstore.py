"""The run store: one output_dir over fsspec, where every artifact is published atomically.

A directory artifact (`rollouts/step_3`, `weights/step_3`, ...) is complete only when its
`manifest.json` exists and every file it lists has the recorded size and sha256. On a local
filesystem the directory is built under a temp name and renamed into place; on object storage
the files are uploaded first (large ones as multipart uploads, which S3 shows only once
completed) and the manifest written last, so readers never trust a partial upload.

Remote stores take their endpoint, credentials and region from the usual AWS environment
variables (AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, ...), never from the URL or a config file, so
nothing secret lands in resolved configs or logs. Their listings are not cached: other processes
(the trainer, the controller) publish into the same prefix and must be seen at once.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import fsspec
from fsspec.implementations.local import LocalFileSystem

from rlfleet.store.layout import MANIFEST, step_of

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
    """{relative path: {size, sha256}} for every file under local_dir except the manifest.

    Files are hashed in parallel (hashlib releases the GIL): a checkpoint is a few large files."""
    files = [p for p in sorted(local_dir.rglob("*")) if p.is_file() and p.name != MANIFEST]
    with ThreadPoolExecutor(min(len(files), os.cpu_count() or 1, 8) or 1) as pool:
        digests = list(pool.map(sha256_file, files))
    return {
        p.relative_to(local_dir).as_posix(): {"size": p.stat().st_size, "sha256": d}
        for p, d in zip(files, digests, strict=True)
    }


def cache_root(url: str) -> Path:
    """The local directory of a remote store: logs, pidfiles, configs, staged weights.

    `$RLFLEET_CACHE_DIR/<hash of the url>/`, default `~/.cache/rlfleet/...`; vLLM and the trainer's
    `from_pretrained` read from here, never from the object store.
    """
    base = os.environ.get("RLFLEET_CACHE_DIR") or Path.home() / ".cache" / "rlfleet"
    return Path(base) / hashlib.sha256(url.encode()).hexdigest()[:16]


def _is_remote(url: str) -> bool:
    return fsspec.core.split_protocol(url)[0] not in (None, "file", "local")


def local_dir(url: str | Path) -> Path:
    """Where a run's local-only files live: the output_dir itself, or the cache of a remote store."""
    url = str(url).rstrip("/")
    return cache_root(url) if _is_remote(url) else Path(LocalFileSystem._strip_protocol(url))


def run_store(output_dir: str | Path) -> RunStore:
    """A run's store from its output_dir: the one place the package opens one (tests and
    benchmarks construct RunStore directly). Not cached: fsspec caches the filesystem instance,
    and a cached store would outlive a credentials change that clears that cache."""
    return RunStore(output_dir)


class RunStore:
    def __init__(self, url: str | Path, part_size: int | None = None):
        """part_size: bytes per multipart-upload part on S3 (s3fs's default, 50 MiB, when None)."""
        self.url = str(url).rstrip("/")
        protocol = fsspec.core.split_protocol(self.url)[0]
        opts = {"use_listings_cache": False} if _is_remote(self.url) else {}
        self.fs, root = fsspec.core.url_to_fs(self.url, **opts)
        self.root = root.rstrip("/")
        self.is_local = isinstance(self.fs, LocalFileSystem)
        self._put_opts = {"chunksize": part_size} if part_size and protocol in ("s3", "s3a") else {}

    def path(self, *parts: str) -> str:
        return "/".join([self.root, *parts])

    def uri(self, *parts: str) -> str:
        """A path a person (or another fsspec client) can open: with its protocol when remote."""
        p = self.path(*parts)
        return p if self.is_local else self.fs.unstrip_protocol(p)

    @property
    def local_dir(self) -> Path:
        return local_dir(self.url)

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

    def append_bytes(self, rel: str, data: bytes) -> None:
        """Append to a log, without fsync: a killed process's writes are in the page cache, and a
        reader of a log skips a torn last line. On object stores s3fs rewrites the object (keep
        such logs small: orchestrator/partials.py rotates its own)."""
        dest = self.path(rel)
        if self.is_local:
            Path(dest).parent.mkdir(parents=True, exist_ok=True)
            with open(dest, "ab") as f:
                f.write(data)
        else:
            with self.fs.open(dest, "ab") as f:
                f.write(data)

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
            # Concurrent, streamed uploads (multipart for large files, which S3 shows only once complete).
            names = list(manifest["files"])
            self.fs.put([str(src / n) for n in names], [self.path(rel, n) for n in names], **self._put_opts)
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
        sizes = self.sizes(rel) if manifest.get("files") else {}
        for name, entry in manifest.get("files", {}).items():
            if sizes.get(name) != entry["size"]:
                raise CorruptArtifact(f"{rel}/{name}: missing or wrong size")
            if verify and self._sha256(self.path(rel, name)) != entry["sha256"]:
                raise CorruptArtifact(f"{rel}/{name}: checksum mismatch")
        return manifest

    def published(self, rel: str) -> dict[str, Any]:
        """The manifest of an artifact a reader needs (checksums verified); FileNotFoundError when
        it was never published."""
        if (manifest := self.manifest(rel, verify=True)) is None:
            raise FileNotFoundError(f"{rel} is not published")
        return manifest

    def sizes(self, rel: str) -> dict[str, int]:
        """{relative name: size} of every file under `rel`, in one listing (one LIST call on S3)."""
        base = self.path(rel)
        found = self.fs.find(base, detail=True)
        prefix = self.fs._strip_protocol(base).rstrip("/") + "/"
        return {p[len(prefix) :]: info["size"] for p, info in found.items() if p.startswith(prefix)}

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
        if not self.is_local:  # one listing instead of a request per step
            return sorted({s for s in map(_manifest_step, self.sizes(kind)) if s is not None})
        if not self.fs.exists(base):
            return []
        steps = []
        for entry in self.fs.ls(base, detail=False):
            step = step_of(entry.rstrip("/").rsplit("/", 1)[-1])
            if step is not None and self.fs.exists(f"{entry}/{MANIFEST}"):
                steps.append(step)
        return sorted(steps)

    def step_dirs(self, kind: str) -> list[int]:
        """Every `<kind>/step_N` that exists, complete or not (e.g. the leftovers of a cut upload)."""
        if not self.fs.exists(self.path(kind)):
            return []
        names = (e.rstrip("/").rsplit("/", 1)[-1] for e in self.fs.ls(self.path(kind), detail=False))
        return sorted(s for n in names if (s := step_of(n)) is not None)

    def json_steps(self, kind: str) -> list[int]:
        """N of every `<kind>/step_N.json` (steps/, metrics/, sync/), in order."""
        if not self.exists(kind):
            return []
        names = [p.rsplit("/", 1)[-1] for p in self.fs.ls(self.path(kind), detail=False)]
        return sorted(s for n in names if (s := step_of(n, ".json")) is not None)

    def staged(self, kind: str) -> list[str]:
        """Staging dirs under `<kind>/` that were never published (a writer died mid-write; a local
        store's only: a remote one stages under this machine's temp dir)."""
        if not self.is_local or not self.local_path(kind).is_dir():
            return []
        return [f"{kind}/{p.name}" for p in sorted(self.local_path(kind).glob(".tmp-step_*")) if p.is_dir()]

    def remove(self, rel: str) -> None:
        p = self.path(rel)
        if not self.fs.exists(p):
            return
        if self.is_local:
            trash = Path(p).with_name(f".trash-{Path(p).name}-{uuid.uuid4().hex[:8]}")
            os.replace(p, trash)  # the manifest disappears with the rename, atomically
            shutil.rmtree(trash, ignore_errors=True)
        else:
            if self.fs.exists(self.path(rel, MANIFEST)):  # first: the artifact stops being complete
                self.fs.rm(self.path(rel, MANIFEST))
            self.fs.rm(p, recursive=True)


def _manifest_step(name: str) -> int | None:
    """N for `step_N/manifest.json`, else None."""
    head, _, tail = name.partition("/")
    return step_of(head) if tail == MANIFEST else None
