"""`rlgen.Engine(model, backend="cpu", replicas=2)`: two real CPU-backend servers and a real
sglang-router, launched and owned by one Engine (rlgen/_replicas.py). The `isolated` fixture checks
that no process outlives a test."""

from __future__ import annotations

import importlib.util
import json
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
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "sglang_router" else find_spec(name, *a))
    with pytest.raises(rlgen.EngineError, match="pip install sglang-router"):
        rlgen.Engine(model_path, backend="cpu", replicas=2)
