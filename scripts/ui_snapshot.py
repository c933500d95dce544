"""Screenshots of the Prefect UI after the tiny job with one injected trainer kill.

Starts a Prefect server of its own (a temporary PREFECT_HOME), runs `rlfleet rl` on the tiny job
against it and SIGKILLs the trainer once mid-run (the run relaunches it from its checkpoint),
then saves headless-Chromium (Debian's `chromium`) screenshots of the runs list, the flow run
(graph and logs), its artifacts and the live metrics table.

    python scripts/ui_snapshot.py --out ui-shots --steps 12 --kill-at 6
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rlfleet.procs import pid_alive  # noqa: E402
from tests.helpers import free_port  # noqa: E402

CHROMIUM = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run"]
CHROMIUM += ["--disable-background-networking", "--disable-component-update", "--disable-sync"]
CHROMIUM += ["--hide-scrollbars", "--window-size=1600,1100", "--virtual-time-budget=20000"]


def wait_healthy(url: str, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(1)
    raise TimeoutError(f"Prefect server at {url} not healthy after {timeout_s} s")


def kill_trainer_when(out: Path, step: int, timeout_s: float = 900) -> float:
    """SIGKILL the trainer's process group once `metrics/step_<step>.json` exists."""
    deadline = time.monotonic() + timeout_s
    while not (out / f"metrics/step_{step}.json").exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"step {step} never finished")
        time.sleep(0.05)
    pid = pid_alive(out / "run/trainer.pid")
    if pid is None:
        raise RuntimeError("the trainer is not running")
    os.killpg(pid, signal.SIGKILL)
    return time.time()


def shot(browser: str, url: str, path: Path, profile: Path) -> None:
    subprocess.run(
        [browser, *CHROMIUM, f"--user-data-dir={profile}", f"--screenshot={path}", url],
        check=True,
        capture_output=True,
        timeout=120,
    )
    print("saved", path, "<-", url)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="ui-shots")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--kill-at", type=int, default=6, help="kill the trainer once this step's metrics exist")
    a = ap.parse_args()
    browser = shutil.which("chromium") or sys.exit("Debian's chromium is needed: apt-get install chromium")
    shots = Path(a.out).resolve()
    shots.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp_s:
        tmp = Path(tmp_s)
        port = free_port()
        api = f"http://127.0.0.1:{port}/api"
        env = {**os.environ, "PREFECT_HOME": str(tmp / "prefect"), "PREFECT_API_URL": api}
        server = subprocess.Popen(
            [sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1", "--port", str(port)],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        try:
            wait_healthy(api)
            out = tmp / "run"
            model = ROOT / "models" / "tiny"
            if not (model / "config.json").exists():
                subprocess.run(
                    [sys.executable, "-m", "rlfleet.cli", "model", "tiny", "--out", str(model)], check=True
                )
            run = subprocess.Popen(
                [sys.executable, "-m", "rlfleet.cli", "rl", "@", str(ROOT / "examples/tiny/rl.toml")]
                + ["--max-steps", str(a.steps), "--output-dir", str(out), "--model.path", str(model)]
                + [
                    "--run-name",
                    "ui-snapshot",
                    "--wandb.mode",
                    "offline",
                    "--trainer.checkpoint-interval",
                    "4",
                ],
                env=env,
                cwd=ROOT,
            )
            killed = kill_trainer_when(out, a.kill_at)
            print(f"trainer killed at {time.strftime('%H:%M:%S', time.localtime(killed))}")
            if run.wait() != 0:
                sys.exit(f"the run failed (exit {run.returncode})")
            summary = json.loads((out / "summary.json").read_text())
            run_id = summary["prefect_flow_run_id"]
            ui = f"http://127.0.0.1:{port}"
            profile = tmp / "chromium"
            pages = {"runs.png": f"{ui}/runs", "flow_run.png": f"{ui}/runs/flow-run/{run_id}"}
            for kind in ("summary", "metrics", "reward-curve", "progress"):  # each one's latest version
                (latest,) = httpx.post(
                    f"{api}/artifacts/latest/filter",
                    json={"artifacts": {"key": {"any_": [f"ui-snapshot-{kind}"]}}},
                ).json()
                pages[f"artifact_{kind}.png"] = f"{ui}/artifacts/artifact/{latest['latest_id']}"
            for name, url in pages.items():
                shot(browser, url, shots / name, profile)
            (shots / "run.json").write_text(
                json.dumps(
                    {"flow_run_id": run_id, "recoveries": summary["recoveries"], "pages": pages}, indent=2
                )
            )
        finally:
            os.killpg(server.pid, signal.SIGTERM)
            server.wait(timeout=30)


if __name__ == "__main__":
    main()
