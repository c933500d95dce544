"""One controller per run: the run lock."""

from __future__ import annotations

import os

import pytest

from rlfleet.config.loader import ConfigError
from rlfleet.runs.lock import acquire_run_lock, reap_earlier_life, release_run_lock
from rlfleet.store import RunStore


def test_one_controller_per_run(tmp_path):
    store = RunStore(tmp_path)
    acquire_run_lock(store)
    acquire_run_lock(store)  # re-entrant for the same process
    lock = store.local_path("run", "controller.pid")
    parent = os.getppid()
    from rlfleet.procs import write_pidfile

    write_pidfile(lock, parent)  # a live process that is not us holds the run
    with pytest.raises(ConfigError, match=f"pid {parent}"):
        acquire_run_lock(store)
    lock.write_text("999999999\n0\n")  # a dead controller's lock is stale, not a block
    acquire_run_lock(store)
    release_run_lock(store)
    assert not lock.exists()


def test_a_rerun_reaps_what_a_killed_controller_left_before_it_checks_the_ports(tiny_model, tmp_path):
    """The trainer and servers of a controller killed a moment ago may still hold their ports when
    the rerun starts; the rerun kills them (they are named by the run's pidfiles) and waits, instead
    of refusing the port. While a live controller owns the run, nothing is touched."""
    import socket
    import subprocess
    import sys

    from rlfleet.procs import pid_alive, write_pidfile
    from rlfleet.runs.configs import resolve
    from tests.helpers import free_port, rl_config

    port = free_port()
    cfg = rl_config(tiny_model, tmp_path / "run", max_steps=1, **{"inference.port": str(port)})
    holder = (  # the dead controller's vLLM, still listening on the replica's port
        "import socket, sys, time\n"
        f"s = socket.socket(); s.bind(('127.0.0.1', {port})); s.listen(); print('up', flush=True)\n"
        "time.sleep(600)\n"
    )
    orphan = subprocess.Popen([sys.executable, "-c", holder], stdout=subprocess.PIPE, start_new_session=True)
    try:
        assert orphan.stdout.readline() == b"up\n"
        run = tmp_path / "run" / "run"
        write_pidfile(run / "inference_0.pid", orphan.pid)
        write_pidfile(run / "controller.pid", os.getppid())  # a live controller owns the run
        reap_earlier_life(str(tmp_path / "run"))
        assert pid_alive(run / "inference_0.pid") == orphan.pid  # not ours to kill
        with pytest.raises(ConfigError, match=rf"already running \(controller pid {os.getppid()}\)"):
            resolve(cfg)  # the live controller is the reason, not the port its replica holds
        (run / "controller.pid").write_text("999999999\n0\n")  # that controller was killed

        resolve(cfg)  # no "port in use": the orphan was reaped first
        assert orphan.wait(timeout=30) is not None and not (run / "inference_0.pid").exists()
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))
    finally:
        orphan.kill()
        orphan.wait()


CONTROLLER = """
import sys, time
from prefect.server.api.server import SubprocessASGIServer
from rlfleet.flows.server import hold_temporary_server
from rlfleet.store import RunStore

server = SubprocessASGIServer()
server.start(timeout=180)
hold_temporary_server(RunStore(sys.argv[1]))
print(server.server_process.pid, flush=True)
time.sleep(600)
"""


def test_a_killed_controllers_temporary_prefect_server_dies_with_it(tmp_path):
    """A controller without PREFECT_API_URL starts Prefect's temporary server, a subprocess Prefect
    spawns outside the guard (it outlived a SIGKILLed controller, parent 1, its port held, until a
    rerun reaped it). The controller names it to its sentinel: it goes with the controller, whether
    or not anyone reruns, within the 15 s a killed controller's processes get."""
    import signal
    import subprocess
    import sys

    import psutil

    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    env["PREFECT_HOME"] = str(tmp_path / "prefect")
    child = subprocess.Popen(
        [sys.executable, "-c", CONTROLLER, str(tmp_path / "run")], env=env, stdout=subprocess.PIPE, text=True
    )
    try:
        server = psutil.Process(int(child.stdout.readline()))  # up and adopted
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    server.wait(timeout=15)  # raises if it still runs
    assert (tmp_path / "run" / "run" / "prefect_server.pid").exists(), "named for a rerun's reap too"
    reap_earlier_life(str(tmp_path / "run"))  # what a rerun does: nothing left to kill
    assert not (tmp_path / "run" / "run" / "prefect_server.pid").exists()


STARTING_CONTROLLER = """
import sys
from rlfleet.flows.server import start_temporary_server
from rlfleet.store import RunStore

start_temporary_server(RunStore(sys.argv[1]))
"""


def test_a_controller_killed_while_prefects_server_starts_takes_it_down(tmp_path):
    """Killed in the ~15 s the temporary server takes to start, before any flow ran, the controller
    has already named it (the chaos soak found such servers running unnamed): it goes too."""
    import signal
    import subprocess
    import sys

    import psutil

    from rlfleet.procs import pid_alive, wait_until

    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    env["PREFECT_HOME"] = str(tmp_path / "prefect")
    pidfile = tmp_path / "run" / "run" / "prefect_server.pid"
    child = subprocess.Popen([sys.executable, "-c", STARTING_CONTROLLER, str(tmp_path / "run")], env=env)
    try:
        server_pid = wait_until(lambda: pid_alive(pidfile), 120, 0.01, "the server to be named")
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    server = psutil.Process(server_pid)
    server.wait(timeout=15)  # raises if it still runs: named, it went with the controller


KEEPING_CONTROLLER = """
import sys
from prefect import get_client
from prefect.server.api.server import SubprocessASGIServer
from rlfleet.flows.server import ServerKeeper, start_temporary_server
from rlfleet.progress import Progress
from rlfleet.store import RunStore

store = RunStore(sys.argv[1])
start_temporary_server(store)
keeper = ServerKeeper(store, Progress()).start()
with get_client(sync_client=True) as client:
    client.read_flows()  # connected once, as a flow's client is: a refused connection is retried
    print(SubprocessASGIServer().server_process.pid, flush=True)
    sys.stdin.readline()  # the server is killed meanwhile
    client.read_flows()  # retried until the server is back
    print("answered after restarts:", keeper.restarts, flush=True)
    sys.stdin.readline()
"""


def test_a_killed_temporary_server_comes_back_on_its_port_named(tmp_path):
    """SIGKILLed under a running controller, Prefect's temporary server is started again on its
    port: the client's calls go on (they failed the run minutes later before), and the new server
    is the one the run's pidfile names, for a rerun to reap."""
    import signal
    import subprocess
    import sys

    import psutil

    from rlfleet.procs import pid_alive

    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    env["PREFECT_HOME"] = str(tmp_path / "prefect")
    env["PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS"] = "180"  # as `rlfleet` sets it: a busy box
    pidfile = tmp_path / "run" / "run" / "prefect_server.pid"
    child = subprocess.Popen(
        [sys.executable, "-c", KEEPING_CONTROLLER, str(tmp_path / "run")],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        first = int(child.stdout.readline())
        os.kill(first, signal.SIGKILL)
        child.stdin.write("go\n")
        child.stdin.flush()
        assert child.stdout.readline().strip() == "answered after restarts: 1"
        second = pid_alive(pidfile)
        assert second is not None and second != first
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    server = psutil.Process(second)
    reap_earlier_life(str(tmp_path / "run"))
    server.wait(timeout=30)
