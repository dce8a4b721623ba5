"""rlgen behind a real sglang-router: two real CPU-backend workers behind `python -m
sglang_router.launch_router`, and an Engine attached to the router with `Engine.connect`.

One module fixture starts the three processes once (the workers in parallel); the tests share
them, and the last two kill a worker, then the router. Every test has a timeout; the fixture
stops what is left and checks that no process it started outlives the module.

The router runs with:
- `--policy round_robin`: the default (cache_aware) sends prompts that share a prefix to one worker
  until its load is 64 requests above the other's, so a small test would never reach the second worker;
- `--disable-circuit-breaker`: after a few failures on a worker (a killed one here) the breaker
  answers 503 "no available workers" for 60 s even once the worker is back (docs/sglang-api.md
  section 6), which would make a test's outcome depend on the tests before it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
import torch
from _checkpoints import perturbed_norms
from _cpu_server_process import free_port  # ports below the ephemeral range: see its docstring
from _processes import MARKER_VAR, REPO_ROOT, wait_for_no_marked_processes

import rlgen

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("sglang_router") is None,
                       reason="needs sglang-router (pip install 'rlgen[dev]' installs sglang-router==0.3.2)"),
]

PROMPTS = ["What is the capital of France?", "Write a haiku about rain.", "List three fruits.", "What is 7*6?"]
GREEDY = {"max_new_tokens": 8, "temperature": 0.0}


def _get(url: str, timeout: float = 5) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return json.loads(resp.read() or b"null")


def _healthy(url: str) -> bool:
    with urllib.request.urlopen(f"{url}/health", timeout=5) as resp:
        return bool(resp.status == 200)


def _post(url: str, body: dict[str, Any], timeout: float = 60) -> Any:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return json.loads(resp.read() or b"null")


def _greedy_texts(worker: str, prompts: list[str] = PROMPTS) -> list[str]:
    """What a worker generates for `prompts` when asked directly (one batched request)."""
    return [e["text"] for e in _post(f"{worker}/generate", {"text": prompts, "sampling_params": GREEDY})]


def _wait(what: str, ready: Any, timeout: float, procs: list[subprocess.Popen[bytes]]) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for proc in procs:
            if proc.poll() is not None:
                raise RuntimeError(f"{what}: {proc.args} exited with {proc.returncode}")
        with contextlib.suppress(OSError, ValueError):
            if ready():
                return
        time.sleep(0.2)
    raise TimeoutError(f"{what} not ready in {timeout} s")


@dataclasses.dataclass
class Fleet:
    """The processes of the module: two workers and the routers in front of them."""

    workers: list[str]                         # URLs, in the order given to the routers
    procs: dict[str, subprocess.Popen[bytes]]  # URL -> process (routers included)
    log_dir: Path
    env: dict[str, str]
    router: str = ""                           # the module's router (start_router's first)

    def start(self, url: str, argv: list[str], log: str) -> None:
        with open(self.log_dir / log, "wb") as out:
            self.procs[url] = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=self.env,
                                               start_new_session=True)

    def start_routers(self, *flag_sets: list[str]) -> list[str]:
        """Routers in front of both workers, one per flag set (round robin, circuit breaker off: see
        the module's docstring), each ready once it lists both workers healthy."""
        from sglang_router.router_args import RouterArgs

        no_breaker = ["--disable-circuit-breaker"] if "disable_circuit_breaker" in {
            f.name for f in dataclasses.fields(RouterArgs)} else []
        urls = []
        for flags in flag_sets:
            port = free_port()
            urls.append(f"http://127.0.0.1:{port}")
            self.start(urls[-1], [sys.executable, "-m", "sglang_router.launch_router", "--host", "127.0.0.1",
                                  "--port", str(port), "--worker-urls", *self.workers, "--policy", "round_robin",
                                  *no_breaker, "--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port()),
                                  "--log-level", "warn", *flags], f"router-{port}.log")
        for url in urls:
            def both_listed(url: str = url) -> bool:
                listed = _get(f"{url}/workers")["workers"]
                return sorted(w["url"] for w in listed if w["is_healthy"]) == sorted(self.workers)

            _wait(f"the router {url} with both workers", both_listed, 60, list(self.procs.values()))
        return urls


@pytest.fixture(scope="module")
def fleet(model_path: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    marker = uuid.uuid4().hex
    env = {**os.environ, MARKER_VAR: marker,
           "PYTHONPATH": os.pathsep.join(filter(None, [REPO_ROOT, os.environ.get("PYTHONPATH")]))}
    fleet = Fleet(workers=[], procs={}, log_dir=tmp_path_factory.mktemp("router"), env=env)
    try:
        for i in range(2):
            port = free_port()
            fleet.workers.append(f"http://127.0.0.1:{port}")
            fleet.start(fleet.workers[-1], [sys.executable, "-m", "rlgen.cpu_server", "--model-path", model_path,
                                            "--port", str(port), "--enable-memory-saver"], f"worker{i}.log")
        for url in fleet.workers:
            _wait(f"worker {url}", lambda url=url: _healthy(url), 120, list(fleet.procs.values()))
        (fleet.router,) = fleet.start_routers([])
        yield fleet
    finally:
        for proc in fleet.procs.values():
            if proc.poll() is None:
                proc.terminate()
        for proc in fleet.procs.values():
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)
        left = wait_for_no_marked_processes(marker, timeout=5.0)
        for proc in left:
            with contextlib.suppress(psutil.Error):
                proc.kill()
        assert not left, f"processes left behind: {[p.pid for p in left]}"


@pytest.fixture(scope="module")
def eng(fleet: Fleet) -> Iterator[rlgen.Engine]:
    engine = rlgen.Engine.connect(fleet.router, progress=False)
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def direct(fleet: Fleet) -> Iterator[rlgen.Engine]:
    """An Engine attached to the first worker itself, for what a direct server answers."""
    engine = rlgen.Engine.connect(fleet.workers[0], progress=False)
    yield engine
    engine.close()


# ---------------------------------------------------------------------------------------------


@pytest.mark.timeout(180)  # the first test also starts the fleet
def test_connect_detects_the_router_and_lists_its_two_workers(eng: rlgen.Engine, direct: rlgen.Engine,
                                                               fleet: Fleet) -> None:
    router = eng.info["router"]
    assert router["url"] == fleet.router
    assert sorted(w["url"] for w in router["workers"]) == sorted(fleet.workers)
    assert all(w["healthy"] for w in router["workers"])
    assert "router" in repr(eng)
    # The facts the router does not answer come from the workers: their capacity adds up.
    assert eng.server_info["router"]["router_manager"] is True
    assert len(eng.server_info["internal_states"]) == 2 and eng.context_length == direct.context_length
    assert direct.info["router"] is None and "router" not in repr(direct)


@pytest.mark.timeout(120)
def test_generate_returns_the_rows_a_worker_gives_directly(eng: rlgen.Engine, direct: rlgen.Engine) -> None:
    # greedy, n > 1, logprobs: the same rows, columns and order as the worker itself gives
    via, ref = (e.generate(PROMPTS, n=2, logprobs=True, **GREEDY) for e in (eng, direct))
    assert list(via.df.columns) == list(ref.df.columns)
    same = ["prompt_index", "sample_index", "prompt", "completion", "finish_reason", "completion_tokens", "weight_version"]
    assert via.df[same].equals(ref.df[same])
    assert via.id_lists("response") == ref.id_lists("response")
    assert torch.allclose(via.logprobs, ref.logprobs, atol=1e-4)
    assert via.df.rid.is_unique
    # seeded sampling with n > 1 (one request per sample behind the router, seed + j each): the same draws
    kwargs = {"n": 3, "max_new_tokens": 8, "temperature": 1.0, "seed": 11, "ignore_eos": True}
    drawn, ref_drawn = eng.generate(PROMPTS[:2], **kwargs), direct.generate(PROMPTS[:2], **kwargs)
    assert drawn.id_lists("response") == ref_drawn.id_lists("response")
    assert len(set(map(tuple, drawn.id_lists("response")))) > 2  # n distinct samples, not n copies
    # score: per-prompt logprob_start_len goes as a scalar in each single request
    assert torch.allclose(eng.score(via).logprobs, direct.score(ref).logprobs, atol=1e-4)


@pytest.mark.timeout(120)
def test_stream_and_streamed_generate_through_the_router(eng: rlgen.Engine, fleet: Fleet) -> None:
    expected = _greedy_texts(fleet.workers[1], PROMPTS[:2])
    assert "".join(eng.stream(PROMPTS[0], **GREEDY)) == expected[0]
    res = eng.generate(PROMPTS[:2], n=2, stream=True, **GREEDY)
    assert res.df.completion.tolist() == [expected[0]] * 2 + [expected[1]] * 2
    assert res.df.ttft_s.notna().all()


@pytest.mark.timeout(180)
def test_update_weights_reaches_every_worker_and_the_original_restores_them(
        eng: rlgen.Engine, fleet: Fleet, model_path: str, tmp_path: Path) -> None:
    before = _greedy_texts(fleet.workers[0])  # the workers serve the same weights (the test above)
    changed = perturbed_norms(model_path, tmp_path / "perturbed")
    assert eng.update_weights_from_disk(changed, weight_version="perturbed-1") == "perturbed-1"
    after = []
    for worker in fleet.workers:  # each worker itself, not through the router
        assert _get(f"{worker}/model_info")["weight_version"] == "perturbed-1"
        after.append(_greedy_texts(worker))
        assert sum(a != b for a, b in zip(after[-1], before)) >= 3, f"{worker} still serves the old weights"
    assert after[0] == after[1]
    res = eng.generate(PROMPTS, **GREEDY)
    assert set(res.df.weight_version) == {"perturbed-1"} and res.df.completion.tolist() == after[0]
    eng.update_weights_from_disk(model_path, weight_version="original")
    assert [_greedy_texts(w) for w in fleet.workers] == [before, before]


@pytest.mark.timeout(120)
def test_memory_release_and_resume_reach_every_worker(eng: rlgen.Engine, fleet: Fleet) -> None:
    before = _greedy_texts(fleet.workers[0])
    with eng.paused():
        for worker in fleet.workers:
            with pytest.raises(urllib.error.HTTPError) as err:  # released: the worker refuses to generate
                _greedy_texts(worker)
            assert err.value.code == 503
    assert [_greedy_texts(w) for w in fleet.workers] == [before, before]  # weights reloaded on both


@pytest.mark.timeout(60)
def test_a_control_request_that_fails_on_the_workers_names_each_of_them(eng: rlgen.Engine, fleet: Fleet) -> None:
    with pytest.raises(rlgen.WorkerRequestError) as err:
        eng.update_weights_from_disk("/nonexistent/checkpoint", retries=0)
    assert sorted(err.value.failures) == sorted(fleet.workers) and err.value.succeeded == []
    assert set(err.value.statuses.values()) == {400}
    assert all(w in str(err.value) for w in fleet.workers)
    assert _get(f"{fleet.workers[0]}/model_info")["weight_version"] == "original"


@pytest.mark.timeout(150)
def test_a_worker_killed_mid_run_is_retried_by_the_router_or_its_rows_fail_with_its_url(
        eng: rlgen.Engine, fleet: Fleet) -> None:
    """What the router does with the requests of a worker that dies under them: it sends each again,
    to the worker its policy picks (up to --retry-max-retries times). The dead worker stays in the
    rotation until health checks mark it down, so a request whose tries all land on it fails with
    HTTP 500 "error sending request for url (<the dead worker>/generate)".

    Made deterministic with two more routers in front of the same workers, both running a call
    when the worker is killed: one whose health checks notice the death within a second while its
    retries last longer (every row comes back, whole), and one without retries (the call fails
    with that 500, and every row is there: finished, or marked with the error).
    """
    survivor, victim = fleet.workers
    retrying, no_retries = fleet.start_routers(
        ["--health-check-interval-secs", "1", "--health-failure-threshold", "1", "--retry-max-retries", "10"],
        ["--disable-retries"],
    )
    engines = {url: rlgen.Engine.connect(url, tokenizer=eng.tokenizer, progress=False) for url in (retrying, no_retries)}
    prompts = [f"Tell me a story about the number {i}." for i in range(6)]
    long = {"max_new_tokens": 24, "temperature": 0.0, "ignore_eos": True}
    outcome: dict[str, Any] = {}

    def run(url: str) -> None:
        try:
            outcome[url] = engines[url].generate(prompts, n=2, **long)
        except BaseException as err:
            outcome[url] = err

    threads = [threading.Thread(target=run, args=(url,)) for url in engines]
    for thread in threads:
        thread.start()

    def running(url: str) -> int:
        return int(_get(f"{url}/server_info")["internal_states"][0]["num_running_reqs"])

    _wait("requests running on both workers", lambda: running(victim) > 0 and running(survivor) > 0, 60, [])
    fleet.procs[victim].send_signal(signal.SIGKILL)
    fleet.procs[victim].wait(timeout=10)
    for thread in threads:
        thread.join(timeout=100)
        assert not thread.is_alive()
    expected = [t for e in _post(f"{survivor}/generate", {"text": prompts, "sampling_params": long}) for t in [e["text"]] * 2]

    # Retried: every row, whole, as the surviving worker generates it.
    res = outcome[retrying]
    assert isinstance(res, rlgen.Rollouts), f"generate failed: {res!r}"
    assert len(res) == 12 and res.df.error.isna().all() and (res.df.completion_tokens == 24).all()
    assert res.df.completion.tolist() == expected

    # Not retried: the call fails with the router's 500 naming the dead worker; no row is missing.
    err = outcome[no_retries]
    assert isinstance(err, rlgen.ServerRequestError) and err.status == 500, repr(err)
    assert f"{victim}/generate" in str(err)
    rows = engines[no_retries].last_result
    assert rows is not None and len(rows) == 12
    done = rows.df.error.isna()
    assert not done.all()
    assert rows.df.completion[done].tolist() == [t for t, d in zip(expected, done) if d]
    assert (rows.df.finish_reason[~done] == "abort").all()
    for engine in engines.values():
        engine.close()

    # A control request now fails on the dead worker, after the live one did it; the error names it.
    with pytest.raises(rlgen.WorkerRequestError) as failed:
        eng.flush_cache()
    assert list(failed.value.failures) == [victim] and failed.value.statuses == {victim: None}
    assert failed.value.succeeded == [survivor] and victim in str(failed.value)


@pytest.mark.timeout(60)
def test_the_router_killed_fails_with_a_clear_error_and_close_leaves_nothing_running(
        eng: rlgen.Engine, fleet: Fleet) -> None:
    children_before = {p.pid for p in psutil.Process().children(recursive=True)}
    fleet.procs[fleet.router].send_signal(signal.SIGKILL)
    fleet.procs[fleet.router].wait(timeout=10)
    with pytest.raises(rlgen.RequestError, match=f"cannot reach the server at {fleet.router}"):
        eng.generate(PROMPTS[:1], **GREEDY)
    assert eng.info["router"]["error"]  # the last listing, and why it is not a new one
    eng.close()
    assert eng.state is rlgen.EngineState.CLOSED
    assert eng._client._session is None and not eng._client._worker_clients  # type: ignore[attr-defined]
    children_after = {p.pid for p in psutil.Process().children(recursive=True) if p.status() != psutil.STATUS_ZOMBIE}
    assert children_after <= children_before - {fleet.procs[fleet.router].pid}  # the Engine started nothing
