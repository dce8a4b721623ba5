"""`rlgen.Engine(model, backend="cpu", replicas=2)`: two real CPU-backend servers and a real
sglang-router, launched and owned by one Engine (rlgen/_replicas.py). The `isolated` fixture checks
that no process outlives a test."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import signal
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import psutil
import pytest
from _checkpoints import perturbed_norms

import rlgen

pytestmark = pytest.mark.skipif(importlib.util.find_spec("sglang_router") is None,
                                reason="needs sglang-router (pip install sglang-router)")

PROMPTS = ["What is the capital of France?", "Write a haiku about rain.", "List three fruits.", "What is 7*6?"]
GREEDY = {"max_new_tokens": 8, "temperature": 0.0}


def _greedy_texts(worker: str, key: str) -> list[str]:
    """What one worker generates for PROMPTS when asked directly (one batched request)."""
    body = json.dumps({"text": PROMPTS, "sampling_params": GREEDY}).encode()
    req = urllib.request.Request(f"{worker}/generate", data=body,
                                 headers={"Content-Type": "application/json", "Authorization": f"Bearer {key}"})
    with urllib.request.urlopen(req, timeout=60) as resp:
        return [e["text"] for e in json.loads(resp.read())]


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_replicas_start_generate_update_weights_and_close(isolated: str, model_path: str, tmp_path: Path) -> None:
    # The router binds every address: the Engine generates an API key, the workers require it
    # (and bind loopback only), the router requires it and sends it to them (its --api-key).
    eng = rlgen.Engine(model_path, backend="cpu", replicas=2, progress=False, host="0.0.0.0")
    try:
        key = eng.api_key
        assert key
        router = eng.info["router"]
        workers = router["workers"]
        assert router["url"] == eng.url and router["pid"] and Path(router["log_path"]).is_file()
        assert len(workers) == 2 and all(w["healthy"] for w in workers)
        assert all(w["pid"] and Path(w["log_path"]).is_file() and w["url"].startswith("http://127.0.0.1:")
                   for w in workers)
        assert len({w["url"] for w in workers} | {eng.url}) == 3
        for url in (workers[0]["url"], eng.url):  # a worker and the router refuse a request without the key
            with pytest.raises(urllib.error.HTTPError, match="401"):
                urllib.request.urlopen(urllib.request.Request(f"{url}/generate", data=b"{}"), timeout=10)
        pids: list[Any] = [router["pid"], *(w["pid"] for w in workers)]
        # Each worker's GC was frozen (with the key: they require it); the router got no /freeze_gc.
        assert all("Freezing GC in CPU backend process." in Path(w["log_path"]).read_text() for w in workers)
        assert "/freeze_gc" not in Path(router["log_path"]).read_text()

        # Greedy, n=2, through the router: the same text as a worker asked directly.
        direct = _greedy_texts(workers[0]["url"], key)
        assert _greedy_texts(workers[1]["url"], key) == direct
        res = eng.generate(PROMPTS, n=2, **GREEDY)
        assert len(res.df) == 8 and res.df.completion.tolist() == [t for t in direct for _ in range(2)]

        # A weight update reaches both workers (each asked directly).
        changed = perturbed_norms(model_path, tmp_path / "perturbed")
        eng.update_weights_from_disk(changed, weight_version="perturbed-1")
        after = [_greedy_texts(w["url"], key) for w in workers]
        assert after[0] == after[1] and sum(a != b for a, b in zip(after[0], direct)) >= 3
    finally:
        eng.close()
    assert not [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    assert rlgen.list_servers() == []


@pytest.mark.slow
@pytest.mark.timeout(90)
def test_a_worker_that_fails_at_start_is_named_and_nothing_is_left(isolated: str, model_path: str) -> None:
    with pytest.raises(rlgen.ServerStartupError) as err:
        rlgen.Engine(model_path, backend="cpu", replicas=2, progress=False, env={"RLGEN_CPU_FAULT": "die_at_start"})
    message = str(err.value)
    assert message.startswith("replica worker 0 of 2: ") and "CUDA out of memory" in message
    assert err.value.log_path and "CUDA out of memory" in Path(err.value.log_path).read_text()
    assert rlgen.list_servers() == []


@pytest.mark.timeout(30)
def test_replicas_refuses_keep_alive_and_a_missing_router(isolated: str, model_path: str,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match="keep_alive"):
        rlgen.Engine(model_path, backend="cpu", replicas=2, keep_alive="5m")
    with pytest.raises(ValueError, match="replicas must be"):
        rlgen.Engine(model_path, backend="cpu", replicas=0)
    with pytest.raises(ValueError, match="gpus"):
        rlgen.Engine(model_path, backend="cpu", gpus=[0])
    with pytest.raises(ValueError, match="router_args"):
        rlgen.Engine(model_path, backend="cpu", router_args={"retry_max_retries": 3})
    with pytest.raises(ValueError, match="set by rlgen"):
        rlgen.Engine(model_path, backend="cpu", replicas=2, router_args={"policy": "random"})
    with pytest.raises(TypeError, match="router_args must be a dict"):
        rlgen.Engine(model_path, backend="cpu", replicas=2, router_args=["--retry-max-retries", "3"])  # type: ignore[arg-type]
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "sglang_router" else find_spec(name, *a))
    with pytest.raises(rlgen.EngineError, match="pip install sglang-router"):
        rlgen.Engine(model_path, backend="cpu", replicas=2)


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize("router_args", [None, {"disable_retries": True, "health_check_interval_secs": 60}],
                         ids=["router-retries", "rlgen-resends"])
def test_a_worker_killed_mid_call_leaves_the_call_whole_on_the_live_worker(
        isolated: str, model_path: str, router_args: dict[str, Any] | None) -> None:
    """A worker's process group SIGKILLed while 64 prompts run: the router (rlgen's default health
    checks and retries) or, with the router's retries off, rlgen's own re-send puts its rows on the
    live worker, so the call returns every row whole; `info` then reports the dead worker unhealthy,
    with its exit code."""
    eng = rlgen.Engine(model_path, backend="cpu", replicas=2, progress=False, router_args=router_args)
    try:
        workers = eng.info["router"]["workers"]
        victim, survivor = workers[1], workers[0]
        prompts = [f"Tell me a story about the number {i}." for i in range(64)]
        sampling = {"max_new_tokens": 24, "temperature": 0.0, "ignore_eos": True}
        killed = threading.Event()

        def running(url: str) -> int:
            with urllib.request.urlopen(f"{url}/server_info", timeout=5) as resp:
                return int(json.loads(resp.read())["internal_states"][0]["num_running_reqs"])

        def kill_soon() -> None:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                with contextlib.suppress(OSError, ValueError, KeyError):
                    if running(victim["url"]) > 0 and running(survivor["url"]) > 0:
                        break
                time.sleep(0.05)
            time.sleep(0.5)
            os.killpg(os.getpgid(victim["pid"]), signal.SIGKILL)
            killed.set()

        killer = threading.Thread(target=kill_soon, daemon=True)
        killer.start()
        t0 = time.monotonic()
        try:
            res = eng.generate(prompts, **sampling)
        except rlgen.RequestError as err:
            rows = eng.last_result
            reasons = rows.df.finish_reason.value_counts().to_dict() if rows is not None else None
            pytest.fail(f"generate failed after {time.monotonic() - t0:.1f} s: {err!r}; finish reasons {reasons}")
        killer.join(timeout=60)
        assert killed.is_set(), "the worker was not killed while the call ran"
        assert len(res) == 64 and res.df.error.isna().all()
        assert not res.df.finish_reason.isin(["abort", "error"]).any()
        assert (res.df.completion_tokens == 24).all()
        resent = eng._client.resent  # type: ignore[attr-defined]
        print(f"call: {time.monotonic() - t0:.1f} s, re-sent by rlgen: {resent}")
        if router_args is not None:  # the router did not retry: rlgen did
            assert resent > 0

        # What rlgen saw: the owned worker's process is dead, whatever the router still says.
        after = {w["url"]: w for w in eng.info["router"]["workers"]}
        assert after[victim["url"]]["healthy"] is False and after[victim["url"]]["exit_code"] == -signal.SIGKILL
        assert after[survivor["url"]]["healthy"] is True and after[survivor["url"]]["exit_code"] is None
        # The next call goes to the survivor alone.
        assert len(eng.generate(prompts[:4], max_new_tokens=4, temperature=0.0)) == 4
    finally:
        eng.close()
