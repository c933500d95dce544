"""Process logs of a run whose store is remote: copied from this machine's cache into the store."""

from __future__ import annotations

from rlfleet.store import RunStore, layout


def sync_logs(store: RunStore) -> list[str]:
    """Copy this machine's process logs of a remote store's run into its `logs/`; local: no-op."""
    logs = store.local_dir / layout.LOGS
    if store.is_local or not logs.is_dir():
        return []
    done = []
    for f in sorted(logs.rglob("*")):
        if f.is_file():
            rel = f"{layout.LOGS}/{f.relative_to(logs).as_posix()}"
            store.fs.put_file(str(f), store.path(rel))  # one object per log, whole or not at all
            done.append(rel)
    return done
