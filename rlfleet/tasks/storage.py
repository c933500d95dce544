"""Prefect and the run store: result storage in it, and S3 credentials from a Prefect block.

Result storage goes to `<output_dir>/prefect/results/`, local or on S3. Prefect accepts a task's result storage only as a path or a saved block. A remote store gets a
`RemoteFileSystem` block named after its URL, saved once per process; it holds the URL and
nothing else, so s3fs takes endpoint and credentials from the AWS environment at use and no
secret is stored in Prefect's database.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from prefect.filesystems import RemoteFileSystem

from rlfleet.store import RunStore, layout

_SAVED: dict[str, str] = {}


def result_storage(store: RunStore) -> Path | str:
    """A `result_storage` value for tasks and flows writing into `store`'s `prefect/results/`."""
    base = store.uri(layout.PREFECT_RESULTS)
    if store.is_local:
        return Path(base)
    if base not in _SAVED:
        name = f"rlfleet-results-{hashlib.sha256(base.encode()).hexdigest()[:16]}"
        RemoteFileSystem(basepath=base).save(name, overwrite=True)
        _SAVED[base] = f"remote-file-system/{name}"
    return _SAVED[base]


CREDENTIALS_BLOCK_ENV = "RLFLEET_S3_CREDENTIALS_BLOCK"
_AWS_ENV = {
    "aws_access_key_id": "AWS_ACCESS_KEY_ID",
    "aws_secret_access_key": "AWS_SECRET_ACCESS_KEY",
    "aws_session_token": "AWS_SESSION_TOKEN",
    "endpoint_url": "AWS_ENDPOINT_URL",
    "region_name": "AWS_DEFAULT_REGION",
}


def load_credentials_block(name: str | None = None) -> list[str]:
    """Export the S3 settings of a Prefect `Secret` block as AWS_* variables of this process.

    The block (named by `name` or $RLFLEET_S3_CREDENTIALS_BLOCK) holds JSON with any of
    aws_access_key_id, aws_secret_access_key, aws_session_token, endpoint_url, region_name.
    Variables already set win. Child processes (trainer, vLLM) inherit them; nothing is written to
    a config or log. Returns the names of the variables set (never their values).
    """
    name = name or os.environ.get(CREDENTIALS_BLOCK_ENV)
    if not name:
        return []
    from prefect.blocks.system import Secret

    value = Secret.load(name).get()
    if not isinstance(value, dict):
        raise ValueError(f"Secret block {name!r} must hold a JSON object with AWS settings")
    unknown = sorted(set(value) - set(_AWS_ENV))
    if unknown:
        raise ValueError(
            f"Secret block {name!r}: unknown keys {unknown}; expected some of {sorted(_AWS_ENV)}"
        )
    exported = []
    for key, var in _AWS_ENV.items():
        if value.get(key) and not os.environ.get(var):
            os.environ[var] = str(value[key])
            exported.append(var)
    return exported
