import hashlib
import os
import uuid

import fsspec
import pytest

from rlfleet.store import runstore
from rlfleet.store.layout import MANIFEST, step_dir, step_of
from rlfleet.store.records import read_rollout_manifest
from rlfleet.store.runstore import CorruptArtifact, RunStore


def _stage(store, rel, files):
    src = store.staging_dir(rel)
    for name, data in files.items():
        p = src / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
    return src


def _files_under(path):
    return sorted(p.relative_to(path).as_posix() for p in path.rglob("*") if p.is_file())


def test_json_round_trip(tmp_path):
    store = RunStore(tmp_path / "run")
    obj = {"step": 3, "nested": {"x": [1, 2.5, None, "s"]}, "ok": True}
    store.write_json("state/progress.json", obj)
    assert store.read_json("state/progress.json") == obj
    assert store.exists("state/progress.json")
    store.write_text("note.txt", "héllo")
    assert store.read_bytes("note.txt") == "héllo".encode()


def test_write_bytes_overwrites_and_leaves_no_temp_files(tmp_path):
    store = RunStore(tmp_path)
    store.write_bytes("a/b.bin", b"old content")
    store.write_bytes("a/b.bin", b"new")
    assert store.read_bytes("a/b.bin") == b"new"
    assert _files_under(tmp_path) == ["a/b.bin"]


def test_write_bytes_crash_keeps_old_content(tmp_path, monkeypatch):
    store = RunStore(tmp_path)
    store.write_bytes("state.json", b'{"step": 1}')

    def crash(src, dst):
        raise OSError("simulated crash before rename")

    monkeypatch.setattr(runstore.os, "replace", crash)
    with pytest.raises(OSError, match="simulated crash"):
        store.write_bytes("state.json", b'{"step": 2, "partial": ')
    monkeypatch.undo()

    assert store.read_bytes("state.json") == b'{"step": 1}'
    assert store.read_json("state.json") == {"step": 1}
    # whatever was left behind has a temp name, never the destination's
    others = [f for f in _files_under(tmp_path) if f != "state.json"]
    assert all(f.startswith("state.json.tmp-") for f in others)


def test_publish_dir_manifest_and_staging_cleanup(tmp_path):
    store = RunStore(tmp_path)
    files = {"data.bin": b"\x00\x01" * 100, "sub/meta.txt": b"hello"}
    src = _stage(store, step_dir("rollouts", 1), files)
    assert src.exists()
    manifest = store.publish_dir(src, step_dir("rollouts", 1), meta={"step": 1})

    assert not src.exists()
    assert manifest["artifact"] == "rollouts/step_1"
    assert manifest["step"] == 1
    assert manifest["files"] == {
        name: {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()} for name, data in files.items()
    }
    assert store.manifest("rollouts/step_1", verify=True) == manifest
    dest = tmp_path / "rollouts" / "step_1"
    assert _files_under(dest) == sorted([*files, MANIFEST])
    assert (dest / "sub" / "meta.txt").read_bytes() == b"hello"
    # nothing but the published artifact is left in rollouts/
    assert sorted(os.listdir(tmp_path / "rollouts")) == ["step_1"]


def test_complete_steps_only_lists_published(tmp_path):
    store = RunStore(tmp_path)
    assert store.complete_steps("rollouts") == []
    for step in (3, 1, 10):
        store.publish_dir(_stage(store, step_dir("rollouts", step), {"x": b"x"}), step_dir("rollouts", step))
    (tmp_path / "rollouts" / "step_2").mkdir()  # unpublished: no manifest
    (tmp_path / "rollouts" / "step_2" / "x").write_bytes(b"x")
    _stage(store, step_dir("rollouts", 4), {"x": b"x"})  # .tmp-step_4-... staging dir
    (tmp_path / "rollouts" / "notastep").mkdir()
    assert any(n.startswith(".tmp-") for n in os.listdir(tmp_path / "rollouts"))

    assert store.complete_steps("rollouts") == [1, 3, 10]
    assert store.manifest("rollouts/step_2") is None
    assert store.complete_steps("weights") == []


def test_manifest_detects_truncation(tmp_path):
    store = RunStore(tmp_path)
    store.publish_dir(_stage(store, "weights/step_1", {"w.bin": b"abcdefgh"}), "weights/step_1")
    (tmp_path / "weights" / "step_1" / "w.bin").write_bytes(b"abcd")
    with pytest.raises(CorruptArtifact, match="w.bin"):
        store.manifest("weights/step_1")
    with pytest.raises(CorruptArtifact, match="w.bin"):
        store.manifest("weights/step_1", verify=True)


def test_manifest_detects_changed_bytes_only_when_verifying(tmp_path):
    store = RunStore(tmp_path)
    store.publish_dir(_stage(store, "weights/step_1", {"w.bin": b"abcdefgh"}), "weights/step_1")
    (tmp_path / "weights" / "step_1" / "w.bin").write_bytes(b"abcdXfgh")
    assert store.manifest("weights/step_1") is not None  # size-only check passes
    with pytest.raises(CorruptArtifact, match="checksum"):
        store.manifest("weights/step_1", verify=True)


def test_manifest_detects_missing_file_and_bad_manifest(tmp_path):
    store = RunStore(tmp_path)
    store.publish_dir(_stage(store, "weights/step_1", {"a": b"1", "b": b"2"}), "weights/step_1")
    (tmp_path / "weights" / "step_1" / "b").unlink()
    with pytest.raises(CorruptArtifact):
        store.manifest("weights/step_1")
    (tmp_path / "weights" / "step_1" / MANIFEST).write_text("{not json")
    with pytest.raises(CorruptArtifact, match="unreadable manifest"):
        store.manifest("weights/step_1")


def test_republish_replaces_whole(tmp_path):
    store = RunStore(tmp_path)
    rel = "weights/step_5"
    store.publish_dir(_stage(store, rel, {"a.bin": b"a", "b.bin": b"b"}), rel)
    m2 = store.publish_dir(_stage(store, rel, {"c.bin": b"ccc"}), rel)
    dest = tmp_path / "weights" / "step_5"
    assert _files_under(dest) == ["c.bin", MANIFEST]
    assert store.manifest(rel, verify=True) == m2
    assert sorted(os.listdir(tmp_path / "weights")) == ["step_5"]  # no .trash- or .tmp- leftovers


def test_remove(tmp_path):
    store = RunStore(tmp_path)
    for step in (1, 2):
        store.publish_dir(_stage(store, step_dir("weights", step), {"w": b"w"}), step_dir("weights", step))
    store.remove("weights/step_1")
    assert store.complete_steps("weights") == [2]
    assert not store.exists("weights/step_1")
    assert store.manifest("weights/step_1") is None
    assert sorted(os.listdir(tmp_path / "weights")) == ["step_2"]
    store.remove("weights/step_1")  # idempotent


@pytest.fixture
def memory_store(tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    url = f"memory://rlfleet-test-{uuid.uuid4().hex}/run"
    store = RunStore(url)
    yield store
    fs = fsspec.filesystem("memory")
    if fs.exists(store.root):
        fs.rm(store.root, recursive=True)


def test_remote_store_publish_manifest_and_steps(memory_store, tmp_path):
    store = memory_store
    assert not store.is_local
    with pytest.raises(ValueError):
        store.local_path("x")

    files = {"data.bin": b"0123456789", "sub/m.txt": b"hi"}
    src = _stage(store, "rollouts/step_0", files)
    assert src.is_relative_to(tmp_path)
    manifest = store.publish_dir(src, "rollouts/step_0", meta={"step": 0})
    assert not src.exists()
    assert manifest["files"]["data.bin"] == {"size": 10, "sha256": hashlib.sha256(b"0123456789").hexdigest()}
    assert store.manifest("rollouts/step_0", verify=True) == manifest
    assert store.read_bytes("rollouts/step_0/sub/m.txt") == b"hi"

    # an upload without a manifest does not count
    store.write_bytes("rollouts/step_1/data.bin", b"partial")
    store.publish_dir(_stage(store, "rollouts/step_2", {"x": b"x"}), "rollouts/step_2")
    assert store.complete_steps("rollouts") == [0, 2]

    # republish replaces whole; truncation is detected
    store.publish_dir(_stage(store, "rollouts/step_0", {"new.bin": b"new"}), "rollouts/step_0")
    assert not store.exists("rollouts/step_0/data.bin")
    store.fs.pipe_file(store.path("rollouts/step_0/new.bin"), b"n")
    with pytest.raises(CorruptArtifact):
        store.manifest("rollouts/step_0")

    store.remove("rollouts/step_2")
    assert store.complete_steps("rollouts") == [0]
    store.write_json("state.json", {"a": 1})
    assert store.read_json("state.json") == {"a": 1}


def test_step_names_parse_only_as_the_layout_writes_them():
    assert step_of("step_12") == 12 and step_of("step_12.json", ".json") == 12
    assert step_of("step_12.json") is None and step_of("step_12", ".json") is None
    assert step_of(".tmp-step_1-ab12") is None and step_of("step_") is None and step_of("step_-1") is None


def test_a_resume_reads_an_older_rollout_manifest_under_the_one_name(tmp_path):
    """rlfleet before `mean_reward` wrote `reward_mean`; a resumed run reuses its first step's rollout."""
    store = RunStore(tmp_path)
    rel = step_dir("rollouts", 3)
    store.publish_dir(store.staging_dir(rel), rel, {"step": 3, "reward_mean": 0.25})
    manifest = read_rollout_manifest(store, 3)
    assert manifest["mean_reward"] == 0.25 and "reward_mean" not in manifest
    assert read_rollout_manifest(store, 4) is None
