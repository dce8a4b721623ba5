"""Launching, watching and stopping a server process (rlgen/_server.py), with real subprocesses.

Servers are rlgen's CPU backend (`python -m rlgen.cpu_server`) driven by its fault modes
(RLGEN_CPU_FAULT); a plain `python -c` stand-in is used only where the backend cannot produce the
behaviour (a grandchild that leaves the process group). Every test runs with its own cache dir (so
the registry is private) and a unique marker in the environment that every process it starts
inherits; afterwards no process may carry that marker.
"""

from __future__ import annotations

import http.client
import importlib.util
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil
import pytest
from _owner import read_line, spawn_owner

from rlgen.core._errors import ServerDiedError, ServerStartupError, ServerStartupTimeout
from rlgen.server import _log as _server_log
from rlgen.server import _process as _server
from rlgen.server import _process_tree, _registry
from rlgen.server._process import PHASES, ServerState, launch_server

pytestmark = pytest.mark.usefixtures("isolated")  # private cache dir; no process left behind

# A "kernel" that owns a server: launches it, prints its pid/port, survives SIGINT the way ipykernel
# does (Ctrl-C interrupts a cell, not the kernel), and closes the server when stdin closes.


# ---------------------------------------------------------------------------------------------
# Fixtures and helpers


def cpu_server(model_path: str) -> list[str]:
    return [sys.executable, "-m", "rlgen.cpu_server", "--model-path", model_path]


# A minimal server for behaviours the CPU backend cannot produce: answers 200 to every GET and,
# as a server without the POST routes asked for (an SGLang before /freeze_gc), 404 to every POST;
# with --hang-post it never answers a POST.
STAND_IN_SCRIPT = r"""
import http.server, subprocess, sys, time
if "--grandchild" in sys.argv:
    child = subprocess.Popen(["sleep", "1000"], start_new_session=True)
    print(f"grandchild pid={child.pid}", flush=True)
class Ok(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers()
    def do_POST(self):
        if "--hang-post" in sys.argv:
            time.sleep(1000)
        self.send_response(404); self.end_headers()
    def log_message(self, *args): pass
port = int(sys.argv[sys.argv.index("--port") + 1])
http.server.HTTPServer(("127.0.0.1", port), Ok).serve_forever()
"""


def stand_in(*, grandchild_in_new_session: bool = False, hang_post: bool = False) -> list[str]:
    return [sys.executable, "-c", STAND_IN_SCRIPT, *(["--grandchild"] if grandchild_in_new_session else []),
            *(["--hang-post"] if hang_post else [])]


def rlgen_lines(log_path: Path) -> list[str]:
    """The lines rlgen itself wrote into a server log (which `log_tail` leaves out)."""
    return [line for line in log_path.read_text().splitlines() if line.startswith(_server_log.LOG_HEADER)]


def faults(*names: str, **extra: str) -> dict[str, str]:
    return {"RLGEN_CPU_FAULT": ",".join(names), **extra}


class ChildExitWatcher:
    """Notes when each child of this process exits, without reaping it (waitid with WNOWAIT),
    so a test can measure how long rlgen took to notice."""

    def __init__(self) -> None:
        self.exits: dict[int, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> ChildExitWatcher:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        children: set[int] = set()
        while not self._stop.is_set():
            children |= {c.pid for c in psutil.Process().children()}
            for pid in children - self.exits.keys():
                try:
                    exited = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
                except ChildProcessError:  # already reaped by its owner: it exited before now
                    exited = True
                if exited:
                    self.exits[pid] = time.monotonic()
            time.sleep(0.01)


def grandchild_pid(log: str) -> int:
    match = re.search(r"grandchild pid=(\d+)", log)
    assert match, f"no 'grandchild pid=N' line in the log:\n{log}"
    return int(match.group(1))


def get(url: str, path: str, timeout: float = 10.0) -> int:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=timeout)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        response.read()
        return response.status
    finally:
        conn.close()


def gone(pid: int, create_time: float, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while _registry.process_alive(pid, create_time):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)
    return True


def start_owner(
    model_path: str, *, env: dict[str, str] | None = None, pdeathsig: bool = True
) -> tuple[subprocess.Popen[str], dict]:
    """Start an owner ("kernel") process in its own session; return it and its server's info."""
    owner = spawn_owner(cpu_server(model_path), env=env, pdeathsig=pdeathsig)
    line = read_line(owner, timeout=60)
    return owner, json.loads(line)


# ---------------------------------------------------------------------------------------------
# Starting


@pytest.mark.timeout(60)
def test_launch_returns_a_healthy_server_and_reports_phases_in_order(model_path: str) -> None:
    seen: list[str] = []
    # The delay before binding keeps the server in a log-announced phase for a few polls.
    env = faults(RLGEN_CPU_STARTUP_DELAY="1.5")
    server = launch_server(cpu_server(model_path), env=env, on_phase=lambda phase, elapsed: seen.append(phase))
    try:
        assert server.state is ServerState.READY and server.alive()
        assert get(server.url, "/health_generate") == 200
        assert server.exit_code is None
        server.assert_alive()
        # Phases only move forward, start at "launching", end at "ready", and at least one phase
        # in between was read from the log.
        indices = [PHASES.index(p) for p in seen]
        assert indices == sorted(indices)
        assert seen[0] == "launching" and seen[-1] == "ready"
        assert set(seen) - {"launching", "ready"}
        assert server.log_path.is_file() and "Load weight begin" in server.log_tail()
        assert server.argv[-4:] == ["--host", "127.0.0.1", "--port", str(server.port)]
        assert server.pids()[0] == server.pid
    finally:
        report = server.close()
    assert report.clean and not report.escalated and report.exit_code is not None
    assert server.close() is report  # idempotent: the second close does nothing, same report
    assert server.state is ServerState.CLOSED and not server.alive()
    assert _registry.read_records() == []


@pytest.mark.timeout(60)
def test_a_launched_server_has_its_gc_frozen_with_its_api_key_by_the_time_the_launch_returns(model_path: str) -> None:
    # The CPU backend, like SGLang, requires the key on /freeze_gc: a POST without it gets 401,
    # and the log would hold rlgen's note instead of the server's line.
    with launch_server([*cpu_server(model_path), "--api-key=s3cret"], startup_timeout=50) as server:
        log = server.log_path.read_text()
        notes = rlgen_lines(server.log_path)
    assert "Freezing GC in CPU backend process. gen0: " in log
    assert len(notes) == 1 and notes[0].startswith("[rlgen] attempt 1 on port"), notes  # the header alone


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    ("hang_post", "freeze_gc", "note"),
    [(False, True, "HTTP 404"), (True, True, "no answer"), (False, False, None)],
    ids=["404", "no answer", "freeze_gc=False"],
)
def test_a_server_whose_gc_is_not_frozen_still_launches_and_its_log_says_why(
    monkeypatch: pytest.MonkeyPatch, hang_post: bool, freeze_gc: bool, note: str | None
) -> None:
    # 404: an SGLang before the route. No answer: the wait is cut to 1 s here. freeze_gc=False (the
    # sglang-router): no POST at all, so the stand-in's 404 leaves no note.
    monkeypatch.setattr(_server, "_FREEZE_GC_TIMEOUT_S", 1.0)
    with launch_server(stand_in(hang_post=hang_post), freeze_gc=freeze_gc, startup_timeout=20) as server:
        assert server.state is ServerState.READY and server.alive()
        notes = [line for line in rlgen_lines(server.log_path) if "/freeze_gc" in line]
    expected = [] if note is None else [f"[rlgen] POST /freeze_gc: {note}; the server's garbage collector is left unfrozen"]
    assert notes == expected


@pytest.mark.timeout(60)
def test_server_that_dies_at_start_raises_at_once_with_exit_code_hint_and_log_tail(model_path: str) -> None:
    with ChildExitWatcher() as watcher, pytest.raises(ServerStartupError) as info:
        launch_server(cpu_server(model_path), env=faults("die_at_start"), startup_timeout=50)
    raised_at = time.monotonic()
    err = info.value
    assert not isinstance(err, ServerStartupTimeout)
    assert err.exit_code == 1
    assert "mem_fraction" in err.hint and "nvidia-smi" in err.hint
    assert "CUDA out of memory" in err.log_tail
    assert err.log_path and Path(err.log_path).is_file()
    assert "exited with code 1" in str(err) and err.log_path in str(err)
    # Raised within about one poll interval (0.5 s) of the process's exit.
    assert len(watcher.exits) == 1
    assert raised_at - next(iter(watcher.exits.values())) < 1.0
    assert _registry.read_records() == []


@pytest.mark.timeout(60)
def test_server_that_never_binds_times_out_near_the_budget_and_leaves_nothing(model_path: str) -> None:
    budget = 6.0
    t0 = time.monotonic()
    with pytest.raises(ServerStartupTimeout) as info:
        launch_server(cpu_server(model_path), env=faults("hang_at_start"), startup_timeout=budget)
    elapsed = time.monotonic() - t0
    assert 0.9 * budget <= elapsed < budget + 3.0  # the +3 s: stopping the hung process
    err = info.value
    assert err.exit_code is None
    assert "startup_timeout=6" in str(err) and "raise startup_timeout=" in err.hint
    assert "loading weights" in str(err)  # the last phase reached, from "Load weight begin"
    assert _registry.read_records() == []


@pytest.mark.timeout(30)
def test_port_grabbed_by_another_process_is_retried_on_a_fresh_port(monkeypatch: pytest.MonkeyPatch) -> None:
    # Stand-in server: the CPU backend binds only after loading its model, which would make each
    # failed attempt cost a model load; the retry logic is the same for any server.
    squatter = socket.socket()  # another process's listener, one that never answers
    squatter.bind(("127.0.0.1", 0))
    squatter.listen()
    taken = squatter.getsockname()[1]
    picks = iter([taken, taken])
    real_free_port = _server.free_port
    monkeypatch.setattr(_server, "free_port", lambda host: next(picks, None) or real_free_port(host))
    try:
        with launch_server(stand_in(), startup_timeout=20) as server:
            assert server.port != taken
            assert get(server.url, "/health") == 200
            for attempt in (1, 2):
                log = (server.log_path.parent / f"server.attempt{attempt}.log").read_text()
                assert f"on port {taken}" in log and "address already in use" in log.lower()
    finally:
        squatter.close()


@pytest.mark.timeout(30)
def test_port_clash_on_every_retry_gives_up_with_the_port_hint(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        taken = squatter.getsockname()[1]
        monkeypatch.setattr(_server, "free_port", lambda host: taken)
        with pytest.raises(ServerStartupError) as info:
            launch_server(stand_in(), startup_timeout=20)
    assert "already in use" in info.value.hint and info.value.exit_code == 1
    assert info.value.log_path is not None
    assert len(list(Path(info.value.log_path).parent.glob("server.attempt*.log"))) == 3  # 1 + 3 tries
    assert _registry.read_records() == []


def test_fixed_port_that_is_taken_fails_before_spawning_anything() -> None:
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        port = squatter.getsockname()[1]
        with pytest.raises(ServerStartupError) as info:
            launch_server(stand_in(), port=port)
    assert "already in use" in info.value.hint
    assert _registry.read_records() == []


@pytest.mark.timeout(60)
def test_ctrl_c_during_startup_stops_the_server_and_reraises(model_path: str) -> None:
    # Ctrl-C in a notebook is a SIGINT to the kernel process; send one to ourselves mid-wait.
    pids: list[int] = []
    already = {p.pid for p in psutil.Process().children()}  # e.g. a session-wide server of another suite

    def remember_pid(phase: str, elapsed: float) -> None:
        pids.extend(p.pid for p in psutil.Process().children() if p.pid not in pids and p.pid not in already)

    timer = threading.Timer(3.0, os.kill, args=(os.getpid(), signal.SIGINT))
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            launch_server(
                cpu_server(model_path),
                env=faults(RLGEN_CPU_STARTUP_DELAY="60"),
                on_phase=remember_pid,
                startup_timeout=50,
            )
    finally:
        timer.cancel()
    assert pids, "the server was never seen running"
    assert not any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE for p in pids)
    assert _registry.read_records() == []


def test_invalid_arguments_are_rejected_before_anything_starts() -> None:
    argv = [sys.executable, "-c", "pass"]
    with pytest.raises(ValueError, match="--port"):
        launch_server([*argv, "--port", "1"])
    with pytest.raises(ValueError, match="port"):
        launch_server(argv, port=70000)
    with pytest.raises(ValueError, match="startup_timeout"):
        launch_server(argv, startup_timeout=0)
    with pytest.raises(TypeError, match="argv"):
        launch_server("python -m rlgen.cpu_server")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="grace"):
        launch_server(argv, grace=-1)
    with pytest.raises(TypeError, match="freeze_gc"):
        launch_server(argv, freeze_gc="yes")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("log_line", "expected"),
    [
        ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2 GiB", "lower mem_fraction"),
        ("RuntimeError: Not enough memory. Please try to increase --mem-fraction-static.", "raise mem_fraction"),
        ("OSError: [Errno 98] error while attempting to bind on address: address already in use", "port"),
        ("ModuleNotFoundError: No module named 'sglang'", "pip install 'rlgen[sglang]'"),
        ("RuntimeError: CUDA error: no kernel image is available for execution on the device", "CUDA build"),
        ("RuntimeError: The NVIDIA driver is too old: CUDA driver version is insufficient", "CUDA build"),
        ("OSError: Incorrect path_or_model_id: '/nope'. Please provide either the path", "model path"),
        ("OSError: Repo id must be in the form 'repo_name' or 'namespace/repo_name': '/nope'.", "model path"),
        ("ValueError: Couldn't instantiate the backend tokenizer from one of:", "model path"),
        ("ModuleNotFoundError: No module named 'orjson'", "pip install orjson"),
        ("[2026-11-30 09:05:12] Ignore import error when loading sglang.srt.models.inkling: No module named 'helion'", ""),
        ("ValueError: Loaded weights leave no GPU memory for the KV cache under --mem-fraction-static=0.2.", "one after"),
        ("all good", ""),
    ],
)
def test_known_failure_signatures_in_the_log_give_a_one_line_hint(tmp_path: Path, log_line: str, expected: str) -> None:
    log = tmp_path / "server.log"
    log.write_text(f"[rlgen] attempt 1: python -m sglang.launch_server --model-path /x\nline\n{log_line}\n")
    hint = _server_log.match_hint(log)
    assert (expected in hint) if expected else hint == ""


def test_a_server_whose_scheduler_crashed_is_not_blamed_on_something_outside_rlgen(tmp_path: Path) -> None:
    # The log of notebook 04's first SGLang run (NaN weights): SGLang SIGKILLed its own tree after
    # the sampler's device-side assert, and the old hint blamed the OOM killer.
    log = tmp_path / "server.log"
    log.write_text(
        "[2026-12-01 15:10:28] Decode batch. #running-req: 128\n"
        "/pytorch/aten/src/ATen/native/cuda/TensorCompare.cu:109: _assert_async_cuda_kernel: block: [0,0,0], thread: "
        "[0,0,0] Assertion `probability tensor contains either `inf`, `nan` or element < 0` failed.\n"
        "[2026-12-01 15:10:28] Scheduler hit an exception: Traceback (most recent call last):\n"
        "torch.AcceleratorError: CUDA error: device-side assert triggered\n"
        "[2026-12-01 15:10:33] kill_process_tree called: parent_pid=1638, include_parent=True, pid=1638\n")
    hint = _server_log.died_hint(-signal.SIGKILL, log)
    assert "NaN or inf probabilities" in hint and "outside rlgen" not in hint
    log.write_text("[2026-12-01 15:10:28] Scheduler hit an exception: Traceback (most recent call last):\n"
                   "ValueError: something else\n")
    assert "scheduler crashed" in _server_log.died_hint(-signal.SIGKILL, log)


def test_gpu_memory_check_answers_none_without_a_gpu() -> None:
    if _process_tree._gpu_pids() is not None:
        pytest.skip("this machine has a GPU driver")
    assert _server.wait_gpu_memory_released([os.getpid()], timeout=1.0) is None


# ---------------------------------------------------------------------------------------------
# Watching and stopping


@pytest.mark.timeout(60)
def test_close_kills_a_server_that_ignores_sigterm_within_grace_and_sweeps_its_grandchild(model_path: str) -> None:
    server = launch_server(cpu_server(model_path), env=faults("ignore_sigterm", "spawn_grandchild"))
    grandchild = grandchild_pid(server.log_tail())
    grandchild_ctime = psutil.Process(grandchild).create_time()
    assert grandchild in server.pids()
    t0 = time.monotonic()
    report = server.close(grace=1.0)
    elapsed = time.monotonic() - t0
    assert 1.0 <= elapsed < 1.0 + 2.0
    assert report.escalated and report.exit_code == -signal.SIGKILL and report.clean
    assert gone(grandchild, grandchild_ctime, timeout=0)


@pytest.mark.timeout(30)
def test_close_sweeps_a_grandchild_that_left_the_process_group() -> None:
    # Stand-in: the CPU backend's grandchild stays in the group; this one calls setsid, so only
    # the psutil sweep of the tree recorded at launch can find it.
    server = launch_server(stand_in(grandchild_in_new_session=True), startup_timeout=20)
    grandchild = grandchild_pid(server.log_tail())
    assert os.getpgid(grandchild) != server.pgid
    ctime = psutil.Process(grandchild).create_time()
    report = server.close(grace=2.0)
    assert report.clean
    assert gone(grandchild, ctime, timeout=0)


@pytest.mark.timeout(90)
def test_two_servers_run_side_by_side_and_a_crash_of_one_leaves_the_other_serving(model_path: str) -> None:
    # Launched from pool threads that end right after: the parent-death signal follows the
    # *thread* that forked, so the servers only survive if rlgen forked from a long-lived thread.
    with ThreadPoolExecutor(max_workers=2) as pool:
        a, b = pool.map(lambda _: launch_server(cpu_server(model_path), startup_timeout=80), range(2))
    try:
        time.sleep(0.5)
        assert a.alive() and b.alive() and a.port != b.port and a.log_path != b.log_path
        assert get(a.url, "/health") == 200 and get(b.url, "/health") == 200
        assert {r.pid for r in _registry.read_records()} == {a.pid, b.pid}

        assert a.pid is not None
        os.kill(a.pid, signal.SIGKILL)  # a crash; the owner notices it through a failed request
        deadline = time.monotonic() + 5
        while a.alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        with pytest.raises(ServerDiedError) as info:
            a.assert_alive()
        assert info.value.exit_code == -signal.SIGKILL and "SIGKILL" in str(info.value)
        assert "out-of-memory killer" in info.value.hint and "sglang.Engine.shutdown()" in info.value.hint
        assert not a.alive() and a.exit_code == -signal.SIGKILL
        assert b.alive() and get(b.url, "/health") == 200
        b.assert_alive()
    finally:
        a_report, b_report = a.close(), b.close()
    assert a_report.clean and a_report.exit_code == -signal.SIGKILL
    assert b_report.clean and not b_report.escalated
    assert _registry.read_records() == []


# ---------------------------------------------------------------------------------------------
# The owner's process group and the owner's death


@pytest.mark.timeout(60)
def test_interrupting_the_owners_process_group_does_not_reach_the_server(model_path: str) -> None:
    owner, info = start_owner(model_path)
    try:
        os.killpg(owner.pid, signal.SIGINT)  # what Jupyter's "Interrupt kernel" sends
        assert read_line(owner, timeout=10).strip() == "interrupted"
        time.sleep(0.5)
        assert psutil.Process(info["pid"]).status() != psutil.STATUS_ZOMBIE
        assert get(f"http://127.0.0.1:{info['port']}", "/health") == 200
    finally:
        assert owner.stdin is not None
        owner.stdin.close()  # the owner closes its server and exits
        assert owner.wait(timeout=20) == 0
    assert not psutil.pid_exists(info["pid"]) or psutil.Process(info["pid"]).status() == psutil.STATUS_ZOMBIE


@pytest.mark.timeout(60)
def test_sigkilling_the_owner_kills_the_server_and_reap_sweeps_what_is_left(model_path: str) -> None:
    owner, info = start_owner(model_path, env=faults("spawn_grandchild"))
    server_ctime = psutil.Process(info["pid"]).create_time()
    owner.kill()  # no cleanup code runs in the owner: only PR_SET_PDEATHSIG can act
    owner.wait()
    assert gone(info["pid"], server_ctime, timeout=5)
    # PDEATHSIG covers the direct child only; whatever else of its group survived, reap() stops it.
    reaped = _server.reap()
    assert [(r["pid"], r["status"], r["action"]) for r in reaped] == [(info["pid"], "gone", "record removed")]
    assert _registry.read_records() == []


def test_gpu_memory_per_process_and_per_gpu_is_read_from_nvidia_smi(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    if importlib.util.find_spec("pynvml") is not None:
        pytest.skip("pynvml is installed: it is asked before nvidia-smi")
    fake = tmp_path / "nvidia-smi"
    fake.write_text(
        "#!/bin/sh\n"
        'case "$1" in\n'
        "  --query-gpu=index,uuid) printf '0, GPU-aaa\\n1, GPU-bbb\\n' ;;\n"
        "  --query-gpu=name) printf 'NVIDIA H200\\nNVIDIA H200\\n' ;;\n"
        "  --query-compute-apps=gpu_uuid,pid,used_memory)\n"
        "    printf 'GPU-aaa, 101, 300\\nGPU-bbb, 202, [N/A]\\nGPU-aaa, 101, 20\\nGPU-bbb, 101, 7\\n' ;;\n"
        "  *) exit 2 ;;\n"
        "esac\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    from rlgen.server._process_tree import (
        _gpu_pids,
        gpu_memory_by_device,
        gpu_memory_by_pid,
        gpu_memory_mib,
        gpu_memory_per_gpu,
        gpu_name,
    )

    assert gpu_memory_by_device() == {0: {101: 320}, 1: {202: 0, 101: 7}}
    assert gpu_memory_by_pid() == {101: 327, 202: 0}
    assert _gpu_pids() == {101, 202}
    assert gpu_memory_mib([101, 999]) == 327
    assert gpu_memory_mib([999]) is None  # the driver shows none of them: cannot tell
    assert gpu_memory_per_gpu([101, 202]) == {0: 320, 1: 7}
    assert gpu_memory_per_gpu([202]) == {1: 0}  # listed without a figure: on that GPU, amount unknown (0)
    assert gpu_memory_per_gpu([999]) is None
    assert gpu_name() == "NVIDIA H200"


def test_old_default_log_directories_are_pruned_but_a_running_servers_is_kept(isolated: str) -> None:
    root = _registry.servers_dir()
    old = [root / f"20260101-0000{i:02d}-1-0" for i in range(_server.KEEP_RUN_DIRS + 5)]
    for d in old:
        d.mkdir(parents=True)
        (d / "server.log").write_text("old\n")
    running = old[0]  # the oldest, but its server is still registered
    _registry.write_record(_registry.ServerRecord(
        pid=999_999, pgid=999_999, create_time=0.0, port=1, host="127.0.0.1", owner_pid=1, owner_start_time=0.0,
        argv=["x"], log_path=str(running / "server.log"), started_at=0.0))
    new = _server._new_run_dir(None)
    left = {d.name for d in root.iterdir() if d.is_dir() and d.name != "registry"}
    newest_old = {d.name for d in old[-(_server.KEEP_RUN_DIRS - 1):]}  # the new one takes a place
    assert left == newest_old | {new.name, running.name}
    custom = _server._new_run_dir(root.parent / "mine")  # a directory the user chose is never pruned
    assert custom.is_dir() and {d.name for d in root.iterdir() if d.is_dir() and d.name != "registry"} == left
