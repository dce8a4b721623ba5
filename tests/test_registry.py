"""The registry of launched servers and `reap()` (rlgen/_registry.py, rlgen/_server.py).

Real servers are rlgen's CPU backend; the identity rules (pid reuse, other hosts, stale records)
are tested on hand-written records around `sleep` processes, since no server behaviour is involved.
Each test has a private cache dir (so it never sees a real user's servers) and a unique marker in
the environment; afterwards no process may carry that marker.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest
from _owner import read_line, spawn_owner

from rlgen.server import _registry
from rlgen.server._process import launch_server, list_servers, reap

pytestmark = pytest.mark.usefixtures("isolated")  # private cache dir; no process left behind

# An owner ("kernel") process that launches a server and prints its pid, then waits on stdin.


def cpu_server(model_path: str) -> list[str]:
    return [sys.executable, "-m", "rlgen.cpu_server", "--model-path", model_path]


def dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def sleeper() -> subprocess.Popen[bytes]:
    """A stand-in "server": a process in its own session, as launch_server starts them."""
    return subprocess.Popen(["sleep", "1000"], start_new_session=True)


def record(
    pid: int, *, create_time: float, owner_pid: int, owner_start_time: float, hostname: str | None = None
) -> _registry.ServerRecord:
    rec = _registry.ServerRecord(
        pid=pid,
        pgid=pid,
        create_time=create_time,
        port=1,
        host="127.0.0.1",
        owner_pid=owner_pid,
        owner_start_time=owner_start_time,
        argv=["sleep", "1000"],
        log_path="/dev/null",
        started_at=time.time(),
    )
    if hostname is not None:
        rec = _registry.ServerRecord(**{**rec.to_dict(), "hostname": hostname})
    _registry.write_record(rec)
    return rec


def alive(proc: subprocess.Popen[bytes]) -> bool:
    return proc.poll() is None


# ---------------------------------------------------------------------------------------------
# With real servers


@pytest.mark.timeout(90)
def test_reap_stops_a_server_whose_owner_died_and_spares_a_live_owners_server(model_path: str) -> None:
    # The owner launches without the parent-death signal, as on a platform that has none.
    owner = spawn_owner(cpu_server(model_path), pdeathsig=False)
    mine = launch_server(cpu_server(model_path), startup_timeout=80)  # starts while the owner's does
    try:
        orphan = json.loads(read_line(owner, timeout=80))
        orphan_ctime = psutil.Process(orphan["pid"]).create_time()
        assert {s["pid"]: s["status"] for s in list_servers()} == {orphan["pid"]: "running", mine.pid: "running"}

        owner.kill()
        owner.wait()
        time.sleep(0.5)
        assert _registry.process_alive(orphan["pid"], orphan_ctime), "without PDEATHSIG the server outlives its owner"
        statuses = {s["pid"]: s["status"] for s in list_servers()}
        assert statuses == {orphan["pid"]: "orphaned", mine.pid: "running"}

        dry = reap(dry_run=True)
        assert [(r["pid"], r["action"]) for r in dry] == [(orphan["pid"], "would stop")]
        assert _registry.process_alive(orphan["pid"], orphan_ctime)

        reaped = reap(grace=5)
        assert [(r["pid"], r["status"], r["action"], r["leftover_pids"]) for r in reaped] == [
            (orphan["pid"], "orphaned", "stopped", [])
        ]
        assert not _registry.process_alive(orphan["pid"], orphan_ctime)
        assert [r.pid for r in _registry.read_records()] == [mine.pid]
        assert mine.alive()
    finally:
        if owner.poll() is None:
            owner.kill()
            owner.wait()
        mine.close()
    assert _registry.read_records() == []


# ---------------------------------------------------------------------------------------------
# Identity rules, on hand-written records


@pytest.mark.timeout(30)
def test_an_owner_pid_now_used_by_another_process_counts_as_dead() -> None:
    server = sleeper()
    try:
        ctime = psutil.Process(server.pid).create_time()
        # Our own pid, but not our create time: the owner's pid was reused by this process.
        record(server.pid, create_time=ctime, owner_pid=os.getpid(), owner_start_time=ctime - 1000)
        assert [s["status"] for s in list_servers()] == ["orphaned"]
        assert [r["action"] for r in reap(grace=1)] == ["stopped"]
        assert server.wait(timeout=5) == -signal.SIGTERM
    finally:
        server.kill()
        server.wait()


@pytest.mark.timeout(30)
def test_reap_deletes_the_record_of_a_gone_server_without_signalling_a_process_that_reused_its_pid() -> None:
    bystander = sleeper()  # holds the recorded pid now, but was created at another time
    try:
        record(bystander.pid, create_time=123.0, owner_pid=dead_pid(), owner_start_time=1.0)
        assert [s["status"] for s in list_servers()] == ["gone"]
        reaped = reap(grace=1)
        assert [(r["status"], r["action"]) for r in reaped] == [("gone", "record removed")]
        assert _registry.read_records() == []
        time.sleep(0.2)
        assert alive(bystander)
    finally:
        bystander.kill()
        bystander.wait()


@pytest.mark.timeout(30)
def test_reap_leaves_live_owners_and_other_hosts_alone() -> None:
    ours, foreign = sleeper(), sleeper()
    try:
        me, my_start = _registry.owner_identity()
        record(ours.pid, create_time=psutil.Process(ours.pid).create_time(), owner_pid=me, owner_start_time=my_start)
        record(
            foreign.pid,
            create_time=psutil.Process(foreign.pid).create_time(),
            owner_pid=dead_pid(),
            owner_start_time=1.0,
            hostname="some-other-machine",
        )
        assert sorted(s["status"] for s in list_servers()) == ["other host", "running"]
        assert reap(grace=1) == []
        assert alive(ours) and alive(foreign)
        assert len(_registry.read_records()) == 2
    finally:
        for proc in (ours, foreign):
            proc.kill()
            proc.wait()


def test_unreadable_registry_files_are_skipped() -> None:
    _registry.registry_dir().mkdir(parents=True)
    (_registry.registry_dir() / "123.json").write_text("{not json")
    assert list_servers() == [] and reap() == []
    assert (_registry.registry_dir() / "123.json").exists()


def test_the_registry_directory_is_tightened_to_0700_when_it_exists_with_wider_permissions() -> None:
    directory = _registry.registry_dir()
    directory.mkdir(parents=True, mode=0o755)
    directory.chmod(0o755)
    assert _registry.private_registry_dir() == directory
    assert directory.stat().st_mode & 0o777 == 0o700
