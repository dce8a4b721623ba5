"""rlgen.rewards._exec: calling a user's function many times, in worker processes, threads or inline.

Real worker processes throughout (no stand-ins for the pool): what is tested is what a hung, crashing
or interrupted function does to them. The functions are defined inside the tests, as in a notebook
cell, so they travel by value with cloudpickle.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import psutil
import pytest

from rlgen.rewards import _exec as _reward_exec
from rlgen.rewards import _exec_pool
from rlgen.rewards._exec import Call, Outcome, RunInterrupted, close_pools, run_calls

REPO = str(Path(__file__).resolve().parents[1])


def calls_of(*values: object) -> list[Call]:
    return [Call((v,)) for v in values]


def statuses(outcomes: list[Outcome]) -> list[str]:
    return [o.status for o in outcomes]


def gone(pids: set[int], within: float = 5.0) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if not any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE for p in pids):
            return True
        time.sleep(0.05)
    return False


def interrupt_main_thread_after(seconds: float) -> threading.Timer:
    main = threading.main_thread().ident
    assert main is not None
    timer = threading.Timer(seconds, lambda: signal.pthread_kill(main, signal.SIGINT))
    timer.start()
    return timer


# ---------------------------------------------------------------------------------------------
# Process mode


@pytest.mark.timeout(60)
def test_a_lambda_and_a_closure_defined_here_run_in_worker_processes_and_come_back_in_order() -> None:
    offset = 100

    def add_offset(x: int, *, times: int = 1) -> int:
        return (x + offset) * times

    calls = [Call((i,), {"times": 2}) for i in range(50)]
    assert [o.value for o in run_calls(add_offset, calls)] == [(i + 100) * 2 for i in range(50)]
    outcomes = run_calls(lambda s: len(s), calls_of("a", "bb", "ccc"))
    assert outcomes == [Outcome("ok", n, seconds=o.seconds) for n, o in zip([1, 2, 3], outcomes)]
    assert all(0 <= o.seconds < 1 for o in outcomes)
    pids = {o.value for o in run_calls(lambda _: os.getpid(), calls_of(*range(20)))}
    assert os.getpid() not in pids


@pytest.mark.timeout(60)
def test_each_call_runs_on_a_workers_main_thread_where_signal_alarm_works_and_is_left_alone() -> None:
    # math-verify's own timeouts use signal.alarm, which raises outside the main thread
    def with_alarm(_: int) -> str:
        def on_alarm(signum: int, frame: object) -> None:
            raise TimeoutError("alarm")

        previous = signal.signal(signal.SIGALRM, on_alarm)
        signal.alarm(1)
        try:
            time.sleep(10)
        except TimeoutError:
            return f"the alarm fired on {threading.current_thread().name}"
        finally:
            signal.alarm(0)
            signal.signal(signal.SIGALRM, previous)
        return "the alarm did not fire"

    assert [o.value for o in run_calls(with_alarm, calls_of(1, 2), timeout=8)] == ["the alarm fired on MainThread"] * 2
    # in thread mode the same function cannot even install its handler: the reason process is the default
    (in_thread,) = run_calls(with_alarm, calls_of(1), mode="thread")
    assert in_thread.status == "error" and in_thread.error is not None and "main thread" in in_thread.error


@pytest.mark.timeout(60)
def test_a_call_that_sleeps_or_spins_forever_is_killed_at_its_timeout_and_the_rest_of_its_batch_is_scored() -> None:
    def maybe_hang(x: int) -> int:
        if x == 3:
            time.sleep(3600)
        if x == 7:
            while True:  # pure Python: no signal-based timeout inside the call would be needed to stop it
                pass
        return x * x

    t0 = time.monotonic()
    outcomes = run_calls(maybe_hang, calls_of(*range(20)), timeout=1, workers=1, batch_size=20)
    elapsed = time.monotonic() - t0
    assert statuses(outcomes) == ["timeout" if i in (3, 7) else "ok" for i in range(20)]
    assert [o.value for i, o in enumerate(outcomes) if i not in (3, 7)] == [i * i for i in range(20) if i not in (3, 7)]
    assert "did not finish within 1 s" in (outcomes[3].error or "") and "killed" in (outcomes[3].error or "")
    assert 1 <= outcomes[3].seconds < 2.5
    assert elapsed < 6  # two timeouts and two replacement workers, one after the other


@pytest.mark.timeout(60)
def test_a_timeout_kills_the_workers_whole_process_group_not_only_the_worker(tmp_path: Path) -> None:
    pid_file = tmp_path / "child.pid"

    def start_a_child_and_hang(path: str) -> None:
        child = subprocess.Popen(["sleep", "3600"])  # in the worker's process group
        with open(path, "w") as f:
            f.write(str(child.pid))
        time.sleep(3600)

    (outcome,) = run_calls(start_a_child_and_hang, calls_of(str(pid_file)), timeout=1)
    assert outcome.status == "timeout"
    child = int(pid_file.read_text())
    survived = not gone({child})
    if survived:
        os.kill(child, signal.SIGKILL)  # leave no sleeper behind
    assert not survived, f"the function's child process ({child}) outlived the worker killed at the timeout"


@pytest.mark.timeout(60)
def test_a_worker_that_dies_marks_only_the_call_it_was_running_and_the_pool_recovers() -> None:
    def die(how: str) -> str:
        if how == "segfault":
            import ctypes

            ctypes.string_at(0)
        if how == "exit":
            os._exit(3)
        if how == "sigkill":
            os.kill(os.getpid(), signal.SIGKILL)
        return how

    plan = ["ok"] * 3 + ["segfault"] + ["ok"] * 3 + ["exit"] + ["ok"] * 3 + ["sigkill"] + ["ok"] * 3
    outcomes = run_calls(die, calls_of(*plan), workers=2, batch_size=4)
    assert statuses(outcomes) == ["ok" if how == "ok" else "error" for how in plan]
    assert outcomes[3].error == "WorkerDied: exit code -11 (SIGSEGV)"
    assert "string_at" in (outcomes[3].traceback or "")  # faulthandler's stack of the crash
    assert outcomes[7].error == "WorkerDied: exit code 3"
    assert outcomes[11].error == "WorkerDied: exit code -9 (SIGKILL)"
    assert run_calls(die, calls_of("ok", "ok"))[1].value == "ok"


@pytest.mark.timeout(60)
def test_an_exception_is_an_error_with_its_type_message_and_the_functions_traceback() -> None:
    def divide(x: int) -> float:
        return 1 / x

    ok, failed = run_calls(divide, calls_of(2, 0))
    assert ok.value == 0.5
    assert failed.status == "error" and failed.error == "ZeroDivisionError: division by zero"
    assert failed.traceback is not None and "return 1 / x" in failed.traceback and failed.value is None
    assert "in divide" in failed.traceback.splitlines()[1]  # starts at the function, not the machinery


@pytest.mark.timeout(60)
def test_a_return_value_that_cannot_travel_back_is_an_error_that_says_what_to_return() -> None:
    (outcome,) = run_calls(lambda _: threading.Lock(), calls_of(1))
    assert outcome.status == "error" and outcome.error is not None
    assert outcome.error.startswith("PicklingError: the return value (a lock)")
    assert "return plain values" in outcome.error


@pytest.mark.timeout(60)
def test_arguments_that_cannot_travel_are_errors_for_their_calls_only() -> None:
    outcomes = run_calls(lambda x: type(x).__name__, [Call((1,)), Call((threading.Lock(),)), Call(("s",))])
    assert statuses(outcomes) == ["ok", "error", "ok"]
    assert "arguments could not be sent" in (outcomes[1].error or "")


def test_a_function_that_cannot_be_pickled_is_refused_before_anything_runs_with_what_to_do() -> None:
    lock = threading.Lock()
    with pytest.raises(TypeError, match="mode='thread'"):
        run_calls(lambda x: lock.locked(), calls_of(1))


@pytest.mark.timeout(60)
def test_async_functions_are_awaited_in_the_worker_at_most_concurrency_at_once() -> None:
    state = {"running": 0, "peak": 0}

    async def slow(x: int) -> tuple[int, int]:
        state["running"] += 1
        state["peak"] = max(state["peak"], state["running"])
        await asyncio.sleep(0.2)
        state["running"] -= 1
        return x, state["peak"]

    t0 = time.monotonic()
    outcomes = run_calls(slow, calls_of(*range(12)), workers=1, concurrency=4)
    elapsed = time.monotonic() - t0
    assert [o.value[0] for o in outcomes] == list(range(12))
    assert max(o.value[1] for o in outcomes) == 4
    assert elapsed < 2.4  # 3 waves of 0.2 s, not 12 calls one after another


@pytest.mark.timeout(60)
def test_an_async_call_that_awaits_forever_is_cancelled_in_its_worker_which_goes_on() -> None:
    async def maybe_hang(x: int) -> int:
        if x == 0:
            await asyncio.sleep(3600)
        await asyncio.sleep(0.01)
        return os.getpid()

    outcomes = run_calls(maybe_hang, calls_of(*range(6)), workers=1, concurrency=2, timeout=1)
    assert statuses(outcomes) == ["timeout"] + ["ok"] * 5
    assert "cancelled" in (outcomes[0].error or "")
    assert len({o.value for o in outcomes[1:]}) == 1  # one worker served them all: nobody was killed


@pytest.mark.timeout(60)
def test_an_async_call_that_blocks_its_event_loop_is_stopped_by_killing_the_worker() -> None:
    async def maybe_block(x: int) -> int:
        if x == 0:
            time.sleep(3600)  # no await: the worker's own cancellation cannot run
        return x

    outcomes = run_calls(maybe_block, calls_of(*range(4)), workers=1, concurrency=1, timeout=1)
    assert statuses(outcomes) == ["timeout", "ok", "ok", "ok"]
    assert "killed" in (outcomes[0].error or "")


@pytest.mark.timeout(60)
def test_workers_are_reused_across_runs_until_the_environment_changes(monkeypatch: pytest.MonkeyPatch) -> None:
    def pids() -> set[int]:
        return {o.value for o in run_calls(lambda _: os.getpid(), calls_of(*range(8)), workers=2)}

    first = pids()
    assert pids() == first
    monkeypatch.setenv("RLGEN_TEST_REWARD_EXEC", "changed")  # a reward reading os.environ must see it
    second = pids()
    assert not second & first and gone(first)
    close_pools()
    assert gone(second)


@pytest.mark.timeout(60)
def test_runs_from_several_threads_at_once_get_their_own_workers_and_leave_a_bounded_pool() -> None:
    results: dict[int, tuple[bool, set[int]]] = {}

    def run(k: int) -> None:
        outcomes = run_calls(lambda x: (x * k, os.getpid()), calls_of(*range(200)), workers=2)
        results[k] = ([o.value[0] for o in outcomes] == [i * k for i in range(200)], {o.value[1] for o in outcomes})

    threads = [threading.Thread(target=run, args=(k,)) for k in (2, 3, 5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(50)
    assert [results[k][0] for k in (2, 3, 5)] == [True] * 3
    assert sum(len(pids) for _, pids in results.values()) == len(set().union(*(pids for _, pids in results.values())))
    assert len(_exec_pool._idle) <= max(_reward_exec._cpu_count(), 2)


@pytest.mark.timeout(60)
def test_a_worker_imports_neither_rlgen_nor_pandas_to_run_a_function() -> None:
    close_pools()  # workers of earlier tests imported this test module, and so rlgen
    (outcome,) = run_calls(lambda _: sorted(m for m in ("rlgen", "pandas", "torch") if m in sys.modules), calls_of(1))
    assert outcome.value == []


_OWNER = textwrap.dedent("""
    import os, sys, threading, time
    from rlgen.rewards._exec import Call, run_calls
    pids = {o.value for o in run_calls(lambda _: os.getpid(), [Call((i,)) for i in range(8)], workers=2)}
    print(" ".join(map(str, sorted(pids))), flush=True)
    if sys.argv[1] == "busy":  # the workers are running hung calls when the owner dies
        threading.Thread(target=run_calls, args=(lambda _: time.sleep(3600), [Call((i,)) for i in range(2)]),
                         kwargs=dict(timeout=None, workers=2), daemon=True).start()
        time.sleep(0.5)
        print("busy", flush=True)
        time.sleep(3600)
""")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("how", ["exits normally", "is SIGKILLed while its workers run calls"])
def test_no_worker_outlives_the_process_that_started_it(how: str) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")]))}
    owner = subprocess.Popen([sys.executable, "-c", _OWNER, "busy" if "SIGKILL" in how else "idle"], env=env,
                             stdout=subprocess.PIPE, text=True)
    assert owner.stdout is not None
    pids = {int(p) for p in owner.stdout.readline().split()}
    assert len(pids) == 2
    if "SIGKILL" in how:
        assert owner.stdout.readline().strip() == "busy"
        owner.kill()
    assert owner.wait(30) in (0, -signal.SIGKILL)
    assert gone(pids)


@pytest.mark.timeout(60)
def test_ctrl_c_in_process_mode_kills_the_busy_workers_and_raises_with_what_finished() -> None:
    def slow(x: int) -> int:
        time.sleep(0.25)
        return os.getpid()

    run_calls(slow, calls_of(0, 1), workers=2)  # warm workers: the interrupt lands mid-run, not mid-start
    timer = interrupt_main_thread_after(1.0)
    t0 = time.monotonic()
    with pytest.raises(RunInterrupted) as caught:
        run_calls(slow, calls_of(*range(40)), workers=2)
    elapsed = time.monotonic() - t0
    timer.cancel()
    assert elapsed < 2.0
    assert isinstance(caught.value, KeyboardInterrupt)
    got = statuses(caught.value.outcomes)
    assert len(got) == 40 and set(got) == {"ok", "cancelled"}
    assert 2 <= got.count("ok") < 20 and got.index("cancelled") > 1
    assert gone({o.value for o in caught.value.outcomes if o.status == "ok"}, within=3)
    assert _exec_pool._idle == []  # both were running calls: killed, not kept


# ---------------------------------------------------------------------------------------------
# Thread mode


@pytest.mark.timeout(60)
def test_thread_mode_gives_up_on_a_hung_call_at_its_timeout_says_it_goes_on_and_scores_the_rest() -> None:
    release = threading.Event()

    def maybe_hang(x: int) -> int:
        if x == 2:
            release.wait(30)
        return x

    t0 = time.monotonic()
    outcomes = run_calls(maybe_hang, calls_of(*range(10)), mode="thread", timeout=0.5, workers=2)
    elapsed = time.monotonic() - t0
    release.set()
    assert statuses(outcomes) == ["timeout" if i == 2 else "ok" for i in range(10)]
    assert "goes on in its thread" in (outcomes[2].error or "")
    assert elapsed < 3


@pytest.mark.timeout(60)
def test_thread_mode_reports_exceptions_and_runs_async_functions_concurrently_on_rlgens_loop() -> None:
    from rlgen.core import _loop

    async def slow(x: int) -> bool:
        await asyncio.sleep(0.2)
        if x == 3:
            raise ValueError("bad row")
        return _loop.in_loop_thread()

    t0 = time.monotonic()
    outcomes = run_calls(slow, calls_of(*range(8)), mode="thread", concurrency=8)
    assert time.monotonic() - t0 < 1.5
    assert statuses(outcomes) == ["error" if i == 3 else "ok" for i in range(8)]
    assert outcomes[3].error == "ValueError: bad row" and "bad row" in (outcomes[3].traceback or "")
    assert all(o.value is True for i, o in enumerate(outcomes) if i != 3)


@pytest.mark.timeout(60)
def test_thread_mode_cancels_an_async_call_that_outlives_its_timeout() -> None:
    async def maybe_hang(x: int) -> int:
        if x == 0:
            await asyncio.sleep(3600)
        return x

    outcomes = run_calls(maybe_hang, calls_of(0, 1, 2), mode="thread", timeout=0.5)
    assert statuses(outcomes) == ["timeout", "ok", "ok"]
    assert "coroutine was cancelled" in (outcomes[0].error or "")


@pytest.mark.timeout(60)
def test_ctrl_c_in_thread_mode_returns_promptly_with_what_finished() -> None:
    def slow(x: int) -> int:
        time.sleep(0.2)
        return x

    timer = interrupt_main_thread_after(0.7)
    t0 = time.monotonic()
    with pytest.raises(RunInterrupted) as caught:
        run_calls(slow, calls_of(*range(40)), mode="thread", workers=2)
    timer.cancel()
    assert time.monotonic() - t0 < 1.5
    got = statuses(caught.value.outcomes)
    assert set(got) == {"ok", "cancelled"} and 2 <= got.count("ok") < 20


# ---------------------------------------------------------------------------------------------
# Inline mode, progress, arguments


def test_inline_mode_lets_exceptions_through_to_the_caller_for_debugging() -> None:
    def divide(x: int) -> float:
        return 1 / x

    assert [o.value for o in run_calls(divide, calls_of(1, 2), mode="inline")] == [1.0, 0.5]
    with pytest.raises(ZeroDivisionError):
        run_calls(divide, calls_of(1, 0), mode="inline")


def test_inline_mode_runs_async_functions_on_rlgens_loop_and_has_no_timeout() -> None:
    async def later(x: int) -> int:
        await asyncio.sleep(0.3)
        return x + 1

    assert [o.value for o in run_calls(later, calls_of(1, 2), mode="inline", timeout=0.1)] == [2, 3]


def test_ctrl_c_in_inline_mode_raises_with_what_finished() -> None:
    def slow(x: int) -> int:
        time.sleep(0.1)
        return x

    timer = interrupt_main_thread_after(0.35)
    with pytest.raises(RunInterrupted) as caught:
        run_calls(slow, calls_of(*range(20)), mode="inline")
    timer.cancel()
    got = statuses(caught.value.outcomes)
    assert got[:2] == ["ok", "ok"] and got[-1] == "cancelled"


@pytest.mark.timeout(60)
@pytest.mark.parametrize("mode", ["process", "thread", "inline"])
def test_progress_is_reported_as_calls_finish_and_adds_up_to_all_of_them(mode: str) -> None:
    seen: list[int] = []
    outcomes = run_calls(lambda x: x, calls_of(*range(300)), mode=mode, on_progress=seen.append)  # type: ignore[arg-type]
    assert sum(seen) == 300 and len(seen) > 1 and len(outcomes) == 300


def test_no_calls_start_nothing() -> None:
    assert run_calls(lambda x: x, []) == []


@pytest.mark.parametrize("kwargs, error", [
    ({"fn": 3}, TypeError),
    ({"mode": "fork"}, ValueError),
    ({"timeout": 0}, ValueError),
    ({"timeout": -1.0}, ValueError),
    ({"timeout": True}, ValueError),
    ({"workers": 0}, ValueError),
    ({"batch_size": 0}, ValueError),
    ({"concurrency": 0}, ValueError),
    ({"calls": [(1,)]}, TypeError),
    ({"calls": "abc"}, TypeError),
    ({"on_progress": 1}, TypeError),
])
def test_bad_arguments_are_refused_before_anything_runs(kwargs: dict, error: type) -> None:
    ran: list[int] = []
    arguments = {"fn": ran.append, "calls": calls_of(1), **kwargs}
    with pytest.raises(error):
        run_calls(arguments.pop("fn"), arguments.pop("calls"), **arguments)
    assert ran == []


@pytest.mark.timeout(60)
def test_a_forked_copy_of_the_caller_leaves_the_callers_workers_alone() -> None:
    first = {o.value for o in run_calls(lambda _: os.getpid(), calls_of(*range(4)), workers=2)}
    child = os.fork()
    if child == 0:  # what multiprocessing's fork does: the copy has the pool's sockets, not its workers
        code = 1
        try:
            close_pools()
            code = 2 if first & {o.value for o in run_calls(lambda _: os.getpid(), calls_of(1), workers=1)} else 0
        finally:
            os._exit(code)  # never back into pytest
    assert os.waitpid(child, 0)[1] == 0
    assert {o.value for o in run_calls(lambda _: os.getpid(), calls_of(*range(4)), workers=2)} == first


@pytest.mark.timeout(60)
def test_a_traceback_from_a_worker_shows_the_source_of_a_function_defined_in_a_notebook_cell() -> None:
    import linecache

    cell = "def parse(x):\n    return int(x)  # the line the traceback must show\n"
    name = "/tmp/ipykernel_0/not-on-disk-cell.py"  # as IPython names cells: in linecache, not on disk
    linecache.cache[name] = (len(cell), None, cell.splitlines(keepends=True), name)
    namespace: dict[str, object] = {}
    exec(compile(cell, name, "exec"), namespace)
    (failed,) = run_calls(namespace["parse"], calls_of("x"))  # type: ignore[arg-type]
    assert failed.status == "error" and failed.traceback is not None
    assert "return int(x)  # the line the traceback must show" in failed.traceback
