"""The run store on object storage, against a real S3-compatible HTTP server (moto, server mode).

Credentials and the endpoint reach every client (this process, the trainer, vLLM) only through
AWS_* environment variables, as they would in production.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import boto3
import pytest
import s3fs
import torch
from transformers import AutoModelForCausalLM

from rlfleet.store import CorruptArtifact, RunStore, cache_root, stage, step_dir
from rlfleet.store.writable import check_output_dir
from rlfleet.trainer.checkpoint import CheckpointManager, prune_checkpoints
from rlfleet.trainer.files import latest_checkpoint, prune_steps
from rlfleet.trainer.parallel import Parallel
from rlfleet.trainer.resume import resume_step
from rlfleet.weights.filesystem import publish_weights
from rlfleet.weights.tickets import newest_weights
from tests.helpers import flow_run_logs
from tests.s3server import moto_server

SECRET = f"rlfleet-test-secret-{uuid.uuid4().hex}"
MiB = 1 << 20


@pytest.fixture(scope="module")
def moto_log(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("moto") / "moto.log"


@pytest.fixture(scope="module")
def s3_endpoint(moto_log):
    with moto_server(moto_log) as url:
        yield url


@pytest.fixture
def s3_env(s3_endpoint, monkeypatch, tmp_path, tmp_path_factory):
    """AWS_* variables for the loopback server, a fresh bucket, and a cache dir under tmp_path."""
    for var in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL_S3", "AWS_CONFIG_FILE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "rlfleet-test-key")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_endpoint)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("RLFLEET_CACHE_DIR", str(tmp_path / "cache"))
    # the run's own temp dir, but short: vLLM binds its zmq sockets there, and a unix socket's
    # path holds 107 bytes (an xdist worker's tmp_path already takes ~80). Kept, as tmp_path is:
    # the wandb service this process starts lives on with its socket there.
    monkeypatch.setenv("TMPDIR", str(tmp_path_factory.mktemp("s3tmp")))
    s3fs.S3FileSystem.clear_instance_cache()
    bucket = f"rlfleet-{uuid.uuid4().hex[:12]}"
    boto3.client("s3").create_bucket(Bucket=bucket)
    yield bucket
    s3fs.S3FileSystem.clear_instance_cache()


def _stage_files(tmp_path: Path, files: dict[str, bytes]) -> Path:
    src = tmp_path / f"src-{uuid.uuid4().hex[:8]}"
    for name, data in files.items():
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        (src / name).write_bytes(data)
    return src


def _publish(store: RunStore, tmp_path: Path, rel: str, files: dict[str, bytes]) -> dict:
    return store.publish_dir(_stage_files(tmp_path, files), rel, {"step": int(rel.rsplit("_", 1)[1])})


def test_endpoint_and_credentials_come_from_the_environment(s3_env, moto_log):
    store = RunStore(f"s3://{s3_env}/run")
    store.write_text("hello.txt", "hi")
    # the object went to the loopback server named only by AWS_ENDPOINT_URL
    assert f"PUT /{s3_env}/run/hello.txt " in moto_log.read_text()
    assert store.read_bytes("hello.txt") == b"hi"
    assert store.uri("hello.txt") == f"s3://{s3_env}/run/hello.txt"
    assert SECRET not in repr(store.fs.storage_options)
    assert check_output_dir(f"s3://{s3_env}/run") == []
    assert not store.exists(".rlfleet-probe")  # the writability probe cleans up


def test_preflight_rejects_bad_remote_output_dirs(s3_env):
    [msg] = check_output_dir(f"s3://rlfleet-test-key:{SECRET}@{s3_env}/run")
    assert "credentials do not belong in the URL" in msg and SECRET not in msg
    [msg] = check_output_dir("s3://no-such-bucket-rlfleet/run")
    assert msg.startswith("output_dir: cannot write to s3://no-such-bucket-rlfleet/run")
    assert SECRET not in msg


def test_a_log_is_appended_to_on_s3(s3_env):
    """The rollout stream's log of its samples in flight (orchestrator/partials.py) appends."""
    store = RunStore(f"s3://{s3_env}/run")
    store.append_bytes("buffer/partials/00000000.jsonl", b'{"a": 1}\n')
    store.append_bytes("buffer/partials/00000000.jsonl", b'{"b": 2}\n')
    assert store.read_bytes("buffer/partials/00000000.jsonl") == b'{"a": 1}\n{"b": 2}\n'


def test_multipart_publish_manifest_and_verified_stage(s3_env, tmp_path):
    store = RunStore(f"s3://{s3_env}/run", part_size=5 * MiB)
    big = os.urandom(11 * MiB)  # 3 parts
    files = {"a.json": b'{"x": 1}', "sub/model.safetensors": big}
    manifest = _publish(store, tmp_path, "weights/step_0", files)
    assert manifest["files"]["sub/model.safetensors"] == {
        "size": len(big),
        "sha256": hashlib.sha256(big).hexdigest(),
    }
    assert store.manifest("weights/step_0", verify=True) == manifest
    assert store.complete_steps("weights") == [0]
    assert store.sizes("weights/step_0") == {
        "a.json": 8,
        "sub/model.safetensors": len(big),
        "manifest.json": store.fs.size(store.path("weights/step_0/manifest.json")),
    }

    local = stage(store, "weights/step_0")
    assert local == cache_root(store.url) / "weights" / "step_0"
    assert (local / "sub/model.safetensors").read_bytes() == big
    mtime = (local / "sub/model.safetensors").stat().st_mtime_ns
    assert stage(store, "weights/step_0") == local  # same manifest: the cached copy is reused
    assert (local / "sub/model.safetensors").stat().st_mtime_ns == mtime

    # same size, other bytes: the size check passes, the checksums catch it, nothing half-staged
    _publish(store, tmp_path, "weights/step_1", {"w.bin": b"abcdefgh"})
    store.fs.pipe_file(store.path("weights/step_1/w.bin"), b"abcdXfgh")
    assert store.manifest("weights/step_1") is not None
    with pytest.raises(CorruptArtifact, match="checksum"):
        store.manifest("weights/step_1", verify=True)
    with pytest.raises(CorruptArtifact, match="w.bin"):
        stage(store, "weights/step_1")
    assert sorted(p.name for p in local.parent.iterdir()) == ["step_0"]
    store.fs.pipe_file(store.path("weights/step_1/w.bin"), b"abcd")  # truncated
    with pytest.raises(CorruptArtifact, match="wrong size"):
        store.manifest("weights/step_1")

    # the cache keeps the newest `keep` snapshots
    for s in (2, 3, 4):
        _publish(store, tmp_path, step_dir("weights", s), {"w.bin": bytes([s]) * 10})
        stage(store, step_dir("weights", s), keep=2)
    assert sorted(p.name for p in local.parent.iterdir()) == ["step_3", "step_4"]
    with pytest.raises(FileNotFoundError):
        stage(store, "weights/step_9")


PUBLISHER = """
import sys
from pathlib import Path
from rlfleet.store import RunStore
store = RunStore(sys.argv[1], part_size=5 * 2**20)
store.fs.max_concurrency = 1  # one part at a time: a wide window to cut the upload in
store.publish_dir(Path(sys.argv[2]), sys.argv[3], {"step": 1})
"""


def test_upload_killed_midway_leaves_previous_step_newest(s3_env, tmp_path, caplog):
    url = f"s3://{s3_env}/run"
    store = RunStore(url)
    _publish(store, tmp_path, "weights/step_0", {"config.json": b"{}", "model.safetensors": b"w0" * 1000})
    src = _stage_files(tmp_path, {"config.json": b"{}", "model.safetensors": os.urandom(40 * MiB)})

    s3 = boto3.client("s3")
    key = "run/weights/step_1/model.safetensors"
    proc = subprocess.Popen([sys.executable, "-c", PUBLISHER, url, str(src), "weights/step_1"])
    parts, deadline = 0, time.monotonic() + 60
    while parts < 2:  # SIGKILL once the multipart upload has 2 of its 8 parts
        assert proc.poll() is None and time.monotonic() < deadline, "publisher ended before the cut"
        uploads = s3.list_multipart_uploads(Bucket=s3_env, Prefix=key).get("Uploads", [])
        if uploads:
            parts = len(
                s3.list_parts(Bucket=s3_env, Key=key, UploadId=uploads[0]["UploadId"]).get("Parts", [])
            )
        time.sleep(0.005)
    proc.send_signal(signal.SIGKILL)
    assert proc.wait() == -signal.SIGKILL

    store = RunStore(url)
    assert store.exists("weights/step_1/config.json")  # the upload really was cut midway
    assert not store.exists("weights/step_1/model.safetensors")  # an unfinished multipart shows nothing
    assert s3.list_multipart_uploads(Bucket=s3_env, Prefix=key).get("Uploads")
    assert store.manifest("weights/step_1") is None
    assert store.complete_steps("weights") == [0]
    with caplog.at_level(logging.WARNING):
        step, path = newest_weights(store, 1)
    assert step == 0 and "using step 0's" in caplog.text
    assert Path(path) == cache_root(url) / "weights" / "step_0"
    assert (Path(path) / "model.safetensors").read_bytes() == b"w0" * 1000

    # once a newer step is complete, retention removes the old one and the cut one's leftovers
    _publish(store, tmp_path, "weights/step_2", {"config.json": b"{}", "model.safetensors": b"w2"})
    assert prune_steps(store, "weights", keep=1) == [0, 1]
    assert store.complete_steps("weights") == [2] and store.step_dirs("weights") == [2]


def test_credentials_from_a_prefect_secret_block(prefect_api, s3_env, s3_endpoint, monkeypatch):
    from prefect.blocks.system import Secret

    from rlfleet.tasks.storage import load_credentials_block

    name = f"rlfleet-s3-{uuid.uuid4().hex[:8]}"
    settings = {
        "aws_access_key_id": "rlfleet-test-key",
        "aws_secret_access_key": SECRET,
        "endpoint_url": s3_endpoint,
        "region_name": "us-east-1",
    }
    Secret(value=settings).save(name)
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_ENDPOINT_URL", "AWS_DEFAULT_REGION"):
        monkeypatch.delenv(var)
    monkeypatch.setenv("RLFLEET_S3_CREDENTIALS_BLOCK", name)
    s3fs.S3FileSystem.clear_instance_cache()

    exported = load_credentials_block()
    assert sorted(exported) == [
        "AWS_ACCESS_KEY_ID",
        "AWS_DEFAULT_REGION",
        "AWS_ENDPOINT_URL",
        "AWS_SECRET_ACCESS_KEY",
    ]
    assert os.environ["AWS_ENDPOINT_URL"] == s3_endpoint  # children (trainer, vLLM) inherit these
    store = RunStore(f"s3://{s3_env}/run")
    store.write_text("from-block.txt", "ok")
    assert store.read_bytes("from-block.txt") == b"ok"
    assert load_credentials_block() == []  # variables already set win over the block


def _damage(store: RunStore, rel: str) -> None:
    """Flip one byte of a checkpoint file in place (same size): only the checksum can tell."""
    data = bytearray(store.read_bytes(rel))
    data[len(data) // 2] ^= 0xFF
    store.fs.pipe_file(store.path(rel), bytes(data))


def test_retention_keeps_last_n_and_the_resume_checkpoint(s3_env, tiny_model, caplog):
    store = RunStore(f"s3://{s3_env}/run")
    model = AutoModelForCausalLM.from_pretrained(tiny_model)
    opt = torch.optim.AdamW(model.parameters())

    def ckpt(step: int) -> None:
        manager = CheckpointManager(store, Parallel(), model, opt, str(tiny_model), keep=0, interval=1)
        manager.save(step, {"next_step": step + 1}, last=True)
        manager.close()

    for step in range(5):
        publish_weights(store, step, model, str(tiny_model))
        prune_steps(store, "weights", keep=2)
    assert store.complete_steps("weights") == [3, 4]

    for step in range(4):
        ckpt(step)
        prune_checkpoints(store, keep=2)
    assert store.complete_steps("checkpoints") == [2, 3]
    assert prune_checkpoints(store, keep=0) == []  # 0 keeps everything

    _damage(store, "checkpoints/step_3/optimizer.pt")
    ckpt(4)
    _damage(store, "checkpoints/step_4/optimizer.pt")
    with caplog.at_level(logging.WARNING):
        assert latest_checkpoint(store)["step"] == 2
    # keep=1 would leave only step 4, which is corrupt: step 2, the one a resume uses, stays
    assert prune_checkpoints(store, keep=1) == [3]
    assert store.complete_steps("checkpoints") == [2, 4]
    assert resume_step(store) == 3

    ckpt(5)
    assert prune_checkpoints(store, keep=1) == [2, 4]
    assert store.complete_steps("checkpoints") == [5]
    assert resume_step(store) == 6

    # the trainer names the checkpoint it just wrote: that one is kept as the resume point, unread
    ckpt(6)
    _damage(store, "checkpoints/step_6/optimizer.pt")
    assert prune_checkpoints(store, keep=1, written=6) == [5]
    assert store.complete_steps("checkpoints") == [6]


def _files_holding(secret: bytes, roots: list[Path]) -> list[str]:
    return [str(p) for root in roots for p in root.rglob("*") if p.is_file() and secret in p.read_bytes()]


@pytest.mark.e2e
def test_rl_run_on_s3_completes_resumes_and_leaks_no_secret(
    tiny_model, prefect_api, s3_env, tmp_path, caplog, capfd
):
    from prefect.logging.handlers import APILogWorker
    from prefect.settings import PREFECT_HOME

    from rlfleet.flows.rl import rl
    from tests.helpers import rl_config, task_run_names

    url = f"s3://{s3_env}/run"
    store = RunStore(url)
    cache = cache_root(url)
    assert cache.is_relative_to(tmp_path / "cache")
    retention = {"trainer.keep-weights": "1", "trainer.keep-checkpoints": "1"}

    first = rl(config=rl_config(tiny_model, url, max_steps=2, **retention), return_state=True)
    assert first.is_completed(), first
    summary = store.read_json("summary.json")
    assert [s["step"] for s in summary["steps"]] == [0, 1]
    assert summary["config"] == f"{url}/configs/rl.toml"
    assert store.read_bytes("reward_curve.png")[:8] == b"\x89PNG\r\n\x1a\n"
    for name in ("rl", "trainer", "inference"):
        assert store.exists(f"configs/{name}.toml") and (cache / "configs" / f"{name}.toml").is_file()
    # keep_weights = 1, and the step the replicas served when step 1 was published: a replica
    # relaunched then starts from its files (weights/filesystem.py)
    assert store.complete_steps("weights") == [0, 1] and store.complete_steps("checkpoints") == [1]
    # vLLM reloaded step 1 from the verified local copy, not from S3
    assert (cache / "weights" / "step_1" / "model.safetensors").is_file()
    assert (
        store.read_bytes("logs/inference/replica_0.log")
        == (cache / "logs/inference/replica_0.log").read_bytes()
    )
    assert store.fs.find(store.path("prefect", "results")), "task results persisted in the run store"
    assert not list((cache / "run").glob("*.pid")), "child processes left pidfiles behind"
    assert not Path("s3:").exists(), "an s3:// output_dir must never become a local relative path"
    metrics_before = {s: store.read_bytes(f"metrics/step_{s}.json") for s in (0, 1)}

    second = rl(config=rl_config(tiny_model, url, max_steps=4, **retention), return_state=True)
    assert second.is_completed(), second
    names = asyncio.run(task_run_names(second.state_details.flow_run_id))
    assert {"rollout-2", "rollout-3", "train-3"} <= names
    assert not {"rollout-0", "rollout-1", "train-0", "train-1"} & names
    for s in (0, 1):
        assert store.read_bytes(f"metrics/step_{s}.json") == metrics_before[s]
    assert "starting at step 2" in (cache / "logs/trainer/rank_0.log").read_text()
    assert [s["step"] for s in store.read_json("summary.json")["steps"]] == [0, 1, 2, 3]
    assert store.manifest("rollouts/step_3")["policy_step"] == 2
    assert store.complete_steps("weights") == [2, 3] and store.complete_steps("checkpoints") == [3]

    # the secret key is in no object of the run, no local file, no Prefect log or database row
    secret = SECRET.encode()
    leaked = [p for p in store.fs.find(s3_env) if secret in store.fs.cat_file(p)]
    leaked += _files_holding(secret, [tmp_path, Path(os.environ["TMPDIR"]), Path(PREFECT_HOME.value())])
    APILogWorker.drain_all(timeout=10)
    logs = [
        x.message for x in flow_run_logs(first.state_details.flow_run_id, second.state_details.flow_run_id)
    ]
    assert logs, "the flow runs' logs reached the Prefect API"
    leaked += [m for m in logs if SECRET in m]
    out, err = capfd.readouterr()
    assert not leaked and SECRET not in caplog.text + out + err, leaked
