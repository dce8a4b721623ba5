"""Kept servers (`Engine(keep_alive=...)`): reattach instead of launching, the idle watchdog, options
that differ, a dead kept server, privacy of the records, reap and list_servers, and a real Jupyter
kernel restart. Real CPU-backend servers and watchdog processes throughout; `isolated` gives each
test its own registry and fails it if any process is left behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

import rlgen
from rlgen.server import _keep_alive, _registry

pytestmark = pytest.mark.slow
# The kernel-restart test also runs on real SGLang on the GPU machine (RLGEN_TEST_BACKEND=sglang);
# the others inject faults into CPU-backend servers.
BACKEND = os.environ.get("RLGEN_TEST_BACKEND", "cpu")


def kept_engine(model_path: str, keep_alive: str | float = "60s", **kwargs) -> rlgen.Engine:
    return rlgen.Engine(model_path, backend="cpu", progress=False, keep_alive=keep_alive, **kwargs)


def wait_gone(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
            return True
        time.sleep(0.1)
    return False


def watchdog_of(pid: int) -> int:
    state = _registry.read_kept(pid)
    assert state is not None and state["watchdog"], state
    return int(state["watchdog"][0])


@pytest.mark.timeout(180)
def test_a_kept_server_outlives_its_engine_and_the_next_engine_reattaches_within_2_s(isolated, model_path):
    first = kept_engine(model_path)
    pid = first.info["pid"]
    assert first.reattached is False
    first.close()
    assert psutil.pid_exists(pid)  # detached, not stopped
    # Private: the registry is 0700, its files 0600, another user's state is ignored, and the
    # server refuses requests without its key (it holds GPU memory for anyone who reaches the port).
    directory = _registry.registry_dir()
    assert directory.stat().st_mode & 0o777 == 0o700
    for path in directory.iterdir():
        assert path.stat().st_mode & 0o777 == 0o600, path
    if os.getuid() == 0:  # as root, hand the state file to another user: it must be ignored
        os.chown(_registry.kept_path(pid), 4242, 4242)
        assert _registry.read_kept(pid) is None
        os.chown(_registry.kept_path(pid), 0, 0)
    with pytest.raises(rlgen.ServerRequestError, match="401"):
        rlgen.Engine.connect(f"http://127.0.0.1:{first.info['port']}", progress=False)
    t0 = time.monotonic()
    second = kept_engine(model_path)
    reattach_s = time.monotonic() - t0
    try:
        assert second.reattached and second.info["pid"] == pid
        assert reattach_s < 2.0, f"reattaching took {reattach_s:.2f} s"
        assert second.generate("Hi", max_new_tokens=2, ignore_eos=True).df.completion_tokens.tolist() == [2]
        assert second.info["kept"]["attached_pids"] == [os.getpid()]
        assert f"pid={pid} kept" in repr(second)
    finally:
        second.close(stop=True)
    assert wait_gone(pid, 10) and rlgen.list_servers() == []


@pytest.mark.timeout(180)
def test_the_idle_watchdog_stops_a_kept_server_no_client_comes_back_to(isolated, model_path):
    eng = kept_engine(model_path, keep_alive=1.5)
    pid, watchdog = eng.info["pid"], watchdog_of(eng.info["pid"])
    time.sleep(3)  # attached: the idle clock does not run
    assert psutil.pid_exists(pid)
    assert eng.generate("Hi", max_new_tokens=1).df.completion_tokens.tolist() == [1]
    eng.close()
    t0 = time.monotonic()
    assert wait_gone(pid, 15), "the kept server outlived its keep_alive"
    assert 1.0 < time.monotonic() - t0 < 10
    assert wait_gone(watchdog, 10) and rlgen.list_servers() == []


@pytest.mark.timeout(180)
def test_two_engines_share_a_kept_server_and_it_stays_while_either_is_attached(isolated, model_path):
    import subprocess
    import sys

    eng = kept_engine(model_path, keep_alive=1.5)
    pid = eng.info["pid"]
    # Another process (another kernel) attaches, then detaches: this one is still attached.
    code = (f"import rlgen; e = rlgen.Engine({model_path!r}, backend='cpu', progress=False, keep_alive=1.5); "
            "assert e.reattached; e.close()")
    subprocess.run([sys.executable, "-c", code], timeout=120, check=True, capture_output=True)
    time.sleep(3)
    assert psutil.pid_exists(pid), "the server was stopped while an engine was still attached"
    assert eng.generate("Hi", max_new_tokens=1).df.completion_tokens.tolist() == [1]
    eng.close()
    assert wait_gone(pid, 15)


@pytest.mark.timeout(180)
def test_a_dead_kernel_starts_the_idle_clock_too(isolated, model_path, tmp_path):
    import subprocess
    import sys

    code = (f"import rlgen, os; e = rlgen.Engine({model_path!r}, backend='cpu', progress=False, keep_alive=1.5); "
            "print(e.info['pid'], flush=True); os._exit(0)")  # no close(), no finalizers: as a killed kernel
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    pid = int(out.stdout.split()[-1])
    assert wait_gone(pid, 20), "a kept server whose kernel died never stopped"


@pytest.mark.timeout(240)
def test_other_options_start_a_new_server_and_say_why_and_reap_and_list_servers_treat_kept_ones_right(
        isolated, model_path, capfd):
    first = kept_engine(model_path, keep_alive="10m")
    [entry] = rlgen.list_servers()
    assert entry["kept"]["attached_pids"] == [os.getpid()] and entry["kept"]["idle_s"] is None
    first.close()
    time.sleep(1.0)
    [entry] = rlgen.list_servers()
    kept = entry["kept"]
    assert kept["attached_pids"] == [] and 0.5 < kept["idle_s"] < 10 and 590 < kept["time_left_s"] < 600
    assert "api_key" not in kept and kept["keep_alive_s"] == 600
    assert rlgen.reap() == [] and psutil.pid_exists(first.info["pid"])  # left alone until it expires
    second = rlgen.Engine(model_path, backend="cpu", keep_alive="60s", enable_metrics=True)
    try:
        assert not second.reattached and second.info["pid"] != first.info["pid"]
        err = capfd.readouterr().err
        assert f"kept server pid {first.info['pid']} not reused: this call adds --enable-metrics" in err
    finally:
        second.close(stop=True)
        stopped = rlgen.reap(kept=True)  # asked: kept servers are stopped too
    assert [(s["pid"], s["action"]) for s in stopped] == [(first.info["pid"], "stopped")]
    assert wait_gone(first.info["pid"], 10)


@pytest.mark.timeout(180)
def test_a_kept_server_that_died_is_replaced_not_reattached(isolated, model_path):
    first = kept_engine(model_path)
    pid, watchdog = first.info["pid"], watchdog_of(first.info["pid"])
    first.close()
    os.kill(pid, signal.SIGKILL)
    assert wait_gone(pid, 10)
    second = kept_engine(model_path)
    try:
        assert not second.reattached and second.info["pid"] != pid
        assert second.generate("Hi", max_new_tokens=1).df.completion_tokens.tolist() == [1]
    finally:
        second.close(stop=True)
    assert wait_gone(watchdog, 10)


# What a reattaching kernel must not import: torch (3.8-4.3 s on the GPU machine; imported where
# tensors are asked for), and what the profile of Engine() there found under it and
# transformers' AutoTokenizer (torch._dynamo ~6 s, sympy 3.0 s, transformers.generation 2.6 s,
# sklearn 2.5 s; a bare `import torch` on the CPU machine loads neither sympy nor torch._dynamo, so
# torch is checked by name). What else is loaded is reported for information.
HEAVY = ("torch", "torch._dynamo", "sympy", "sklearn", "transformers.generation")
REPORTED = ("transformers", "tokenizers", "jinja2", "numpy", "pandas", "pyarrow", "aiohttp", "psutil")


@pytest.mark.timeout(240)
def test_a_fresh_interpreter_reattaches_without_torch_dynamo_sympy_sklearn_or_transformers_generation(
        isolated, model_path):
    import json

    first = kept_engine(model_path)  # launches, and loads the tokenizer through AutoTokenizer once (its record)
    pid = first.info["pid"]
    first.close()
    code = (
        "import json, sys, time\nt0 = time.monotonic()\nimport rlgen\nt1 = time.monotonic()\n"
        f"eng = rlgen.Engine({model_path!r}, backend='cpu', progress=False, keep_alive='60s')\n"
        "t2 = time.monotonic()\n"
        f"loaded = sorted(m for m in {HEAVY + REPORTED!r} if m in sys.modules)\n"
        "tokens = eng.generate('Hi', max_new_tokens=2, ignore_eos=True).df.completion_tokens.tolist()\n"
        "print(json.dumps({'reattached': eng.reattached, 'pid': eng.info['pid'], 'import_s': t1 - t0,\n"
        "                  'engine_s': t2 - t1, 'start_times': eng.start_times, 'loaded': loaded,\n"
        "                  'tokenizer': type(eng.tokenizer).__name__, 'tokens': tokens}))\n"
        "eng.close()\n"
    )
    try:
        run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180)
        assert run.returncode == 0, run.stderr[-3000:]
        out = json.loads(run.stdout.splitlines()[-1])
        assert out["reattached"] and out["pid"] == pid and out["tokens"] == [2]
        heavy = [m for m in HEAVY if m in out["loaded"]]
        assert not heavy, f"a reattaching Engine() imported {heavy}"
        print(f"fresh interpreter: import rlgen {out['import_s']:.2f} s, Engine() {out['engine_s']:.2f} s "
              f"({ {k: round(v, 2) for k, v in out['start_times'].items()} }), tokenizer {out['tokenizer']}; "
              f"still imported: {[m for m in REPORTED if m in out['loaded']]}")
    finally:
        rlgen.reap(kept=True)
    assert wait_gone(pid, 10)


def test_keep_alive_durations_read_as_people_write_them():
    assert _keep_alive.parse_duration("15m") == 900
    assert _keep_alive.parse_duration("90s") == 90 and _keep_alive.parse_duration(90) == 90
    assert _keep_alive.parse_duration("1h30m") == 5400
    for bad in ("soon", "", -1, 0, True):
        with pytest.raises(ValueError, match="keep_alive"):
            _keep_alive.parse_duration(bad)  # type: ignore[arg-type]


def gpu_free_mib() -> int:
    """Free memory on GPU 0 as the driver reports it, read in a fresh process (no CUDA context here)."""
    code = "import torch; print(torch.cuda.mem_get_info(0)[0] // 2**20)"
    return int(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)


@pytest.mark.timeout(300 if BACKEND == "cpu" else 900)
def test_after_a_real_jupyter_kernel_restart_the_new_kernel_reattaches_and_generates(isolated, model_path):
    pytest.importorskip("jupyter_client")
    from test_notebook import Kernel

    on_gpu = BACKEND != "cpu"
    free_before = gpu_free_mib() if on_gpu else 0
    cell_timeout = 120 if BACKEND == "cpu" else 600  # a cold SGLang start on a fresh machine: minutes
    kernel = Kernel()
    try:
        start = (f"import rlgen, time\nt = time.monotonic()\n"
                 f"eng = rlgen.Engine({model_path!r}, backend={BACKEND!r}, progress=False, keep_alive='60s')\n")
        first = kernel.run(start + "print(eng.info['pid'], eng.reattached, eng.generate('Hi', max_new_tokens=2, ignore_eos=True).df.completion_tokens.tolist())",
                           timeout=cell_timeout)
        assert first["status"] == "ok", first
        pid, reattached, tokens = first["stdout"].split(maxsplit=2)
        assert reattached == "False" and tokens.strip() == "[2]"
        kernel.km.restart_kernel(now=True)  # "Restart kernel": the old one is killed
        kernel.kc.wait_for_ready(timeout=60)
        second = kernel.run(start + "s = eng.start_times\n"
                            "print(eng.info['pid'], eng.reattached, round(s['server_s'], 2), round(s['tokenizer_s'], 2), "
                            "round(s['total_s'], 2), eng.generate('Hi', max_new_tokens=2, ignore_eos=True).df.completion_tokens.tolist())",
                            timeout=cell_timeout)
        assert second["status"] == "ok", second
        pid2, reattached2, server_s, tokenizer_s, total_s, tokens2 = second["stdout"].split(maxsplit=5)
        assert (pid2, reattached2, tokens2.strip()) == (pid, "True", "[2]")
        # What rlgen adds to reattach: finding the kept server, attaching, connecting. A fresh
        # kernel also imports transformers and loads the tokenizer (seconds on a small CPU
        # machine; docs/archive/benchmarks-rounds-2026-12.md, "Reattach"), which any Engine start pays.
        assert float(server_s) < 2.0, f"reattaching took {server_s} s"
        print(f"{BACKEND}, fresh kernel: reattach {server_s} s, tokenizer {tokenizer_s} s, Engine() {total_s} s")
        kernel.run("eng.close(stop=True)", timeout=cell_timeout)
    finally:
        kernel.shutdown()
    assert wait_gone(int(pid), 30)
    if on_gpu:  # the stopped server's memory is back (within what other processes may hold)
        deadline = time.monotonic() + 30
        while (free_after := gpu_free_mib()) < free_before - 1024 and time.monotonic() < deadline:
            time.sleep(1)
        print(f"GPU free before {free_before} MiB, after stop {free_after} MiB")
        assert free_after >= free_before - 1024
