"""Scale-out on real SGLang and real GPUs (issue 16): `Engine(replicas=2, gpus=...)` behind a real
sglang-router, and SGLang's own `tp_size=2` / `dp_size=2`. Each: start, generate, update weights
(greedy outputs change everywhere they are served), `paused()` (outputs after = outputs before),
close, and the memory back on every GPU involved.

GPU only (skipped elsewhere). `RLGEN_TEST_GPUS` picks the GPUs (default: every visible one); on a
machine with one GPU the replicas share it (`gpus=[0, 0]`: two servers on GPU 0) and the
tp/dp tests skip. Free memory is read per GPU with torch.cuda.mem_get_info in a fresh process
(the driver's per-process view is empty in some containers), before start and after close.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import psutil
import pytest
from _checkpoints import perturbed_norms

import rlgen

pytestmark = [pytest.mark.gpu, pytest.mark.slow,
              pytest.mark.skipif(shutil.which("nvidia-smi") is None, reason="needs an NVIDIA GPU")]

PROMPTS = [f"Tell me one fact about the number {i}." for i in range(16)]
GREEDY = {"max_new_tokens": 16, "temperature": 0.0}
MEMORY_SLACK_MIB = 1024  # free memory after close may differ from before by allocator noise, not by a server


def _visible_gpus() -> list[int]:
    wanted = os.environ.get("RLGEN_TEST_GPUS")
    if wanted:
        return [int(g) for g in wanted.split(",")]
    out = subprocess.run(["nvidia-smi", "--query-gpu=index", "--format=csv,noheader"], capture_output=True,
                         text=True, timeout=30).stdout
    return [int(x) for x in out.split() if x.strip().isdigit()]


def _free_mib(gpus: list[int]) -> dict[int, int]:
    """Free memory per GPU, read in a fresh process (so this one holds no CUDA context)."""
    code = ("import json, sys, torch; print(json.dumps({g: torch.cuda.mem_get_info(g)[0] >> 20 "
            "for g in map(int, sys.argv[1:])}))")
    out = subprocess.run([sys.executable, "-c", code, *map(str, sorted(set(gpus)))], capture_output=True,
                         text=True, timeout=120, check=True).stdout
    return {int(k): v for k, v in json.loads(out.strip().splitlines()[-1]).items()}


def _logprobs(url: str) -> list[float]:
    """The logprob of every token of fixed texts (PROMPTS, each with an answer) under the weights
    `url` holds, asked directly in one batched request: a reading of the weights that does not
    hinge on greedy near-ties."""
    texts = [f"{p} It is a small number with a long history." for p in PROMPTS]
    body = json.dumps({"text": texts, "sampling_params": {"max_new_tokens": 1, "temperature": 0.0},
                       "return_logprob": True, "logprob_start_len": 0}).encode()
    req = urllib.request.Request(f"{url}/generate", data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as resp:
        entries = json.loads(resp.read())
    return [float(t[0]) for e in entries for t in e["meta_info"]["input_token_logprobs"] if t[0] is not None]


def _mean_abs(a: list[float], b: list[float]) -> float:
    assert len(a) == len(b) and a
    return sum(abs(x - y) for x, y in zip(a, b)) / len(a)


def _through_engine(eng: rlgen.Engine) -> list[str]:
    res = eng.generate(PROMPTS, **GREEDY)
    return [str(t) for t in res.df.completion.tolist()]


def _differ(a: list[str], b: list[str]) -> int:
    return sum(x != y for x, y in zip(a, b))


SAME_WEIGHTS = 0.05      # mean |logprob difference| per token below this: the same weights (bf16 noise)
CHANGED_WEIGHTS = 0.5    # above this: other weights (the noised norms move it by whole nats)


def _exercise(eng: rlgen.Engine, model_path: str, tmp_path: Path, servers: list[str]) -> list[int]:
    """Generate, load changed weights, pause and resume; return every pid to check after close.

    Each server in `servers` (the workers; or the one URL of a tp/dp server) is read directly: the
    logprobs of fixed texts. Changed weights must move them on every server by more than
    CHANGED_WEIGHTS per token; afterwards the servers must agree with each other, and `paused()`
    must leave each one where it was, within SAME_WEIGHTS. Greedy texts are not compared exactly
    across servers or calls: SGLang is not deterministic by default (bf16 results depend on the
    batch), and the noised model's greedy choices are near ties (seen on the H200: two workers
    with the same weights, asked the same batch, split on 1 of 16 greedy texts)."""
    before = _through_engine(eng)
    old = [_logprobs(url) for url in servers]
    changed = perturbed_norms(model_path, tmp_path / "perturbed")
    eng.update_weights_from_disk(str(changed), weight_version="perturbed")
    after = _through_engine(eng)
    print(f"greedy texts changed by the new weights, through the Engine: {_differ(after, before)} of {len(PROMPTS)}")
    assert _differ(after, before) >= len(PROMPTS) // 2
    new = [_logprobs(url) for url in servers]
    for url, o, n in zip(servers, old, new):
        moved, apart = _mean_abs(n, o), _mean_abs(n, new[0])
        print(f"{url}: new vs old weights {moved:.3f} nats/token; vs {servers[0]} {apart:.4f}")
        assert moved > CHANGED_WEIGHTS, f"{url} still serves the old weights"
        assert apart < SAME_WEIGHTS, f"{url} and {servers[0]} serve different weights"
    with eng.paused():
        pass
    for url, n in zip(servers, new):
        shift = _mean_abs(_logprobs(url), n)
        print(f"{url}: after paused() vs before {shift:.4f} nats/token")
        assert shift < SAME_WEIGHTS, f"{url} answers differently after paused()"
    resumed = _through_engine(eng)
    print(f"greedy texts through the Engine after paused(): {_differ(resumed, after)} of {len(PROMPTS)} differ")
    info = eng.info
    print(f"gpu_memory_per_gpu {info['gpu_memory_per_gpu']}; memory_usage {info['memory_usage']}")
    router = info["router"]
    pids = [p for p in [info["pid"], *(w.get("pid") for w in (router or {}).get("workers", []))] if p]
    return [q for p in pids if psutil.pid_exists(p) for q in [p, *(c.pid for c in psutil.Process(p).children(True))]]


def _assert_closed(eng: rlgen.Engine, pids: list[int], gpus: list[int], free_before: dict[int, int]) -> None:
    assert eng.state is rlgen.EngineState.CLOSED
    assert not [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    free_after = _free_mib(gpus)
    print(f"free MiB per GPU: before {free_before}, after close {free_after}")
    for g in set(gpus):
        assert free_after[g] >= free_before[g] - MEMORY_SLACK_MIB, f"GPU {g} did not get its memory back"
    assert rlgen.list_servers() == []


@pytest.mark.timeout(900)
@pytest.mark.skipif(importlib.util.find_spec("sglang_router") is None, reason="needs sglang-router")
def test_two_replicas_behind_the_router_on_gpus(isolated: str, model_path: str, tmp_path: Path) -> None:
    visible = _visible_gpus()
    gpus = visible[:2] if len(visible) >= 2 else [visible[0], visible[0]]
    free_before = _free_mib(gpus)
    eng = rlgen.Engine(model_path, backend="sglang", replicas=2, gpus=gpus, enable_memory_saver=True,
                       fast_start=True, progress=False)
    try:
        info: dict[str, Any] = eng.info
        workers = info["router"]["workers"]
        assert len(workers) == 2 and all(w["healthy"] for w in workers)
        assert info["memory_usage"] is not None and len(info["memory_usage"]) == 2  # one rank per worker
        per_gpu = info["gpu_memory_per_gpu"]
        if per_gpu is not None:  # where the driver shows processes: every GPU used holds a server
            assert set(per_gpu) == set(gpus)
        pids = _exercise(eng, model_path, tmp_path, [w["url"] for w in workers])
    finally:
        eng.close()
    _assert_closed(eng, pids, gpus, free_before)


@pytest.mark.timeout(900)
@pytest.mark.parametrize("option", ["tp_size", "dp_size"])
def test_tensor_and_data_parallel_on_two_gpus(isolated: str, model_path: str, tmp_path: Path, option: str) -> None:
    visible = _visible_gpus()
    if len(visible) < 2:
        pytest.skip(f"{option}=2 needs two GPUs; this machine shows {len(visible)}")
    gpus = visible[:2]
    free_before = _free_mib(gpus)
    eng = rlgen.Engine(model_path, backend="sglang", enable_memory_saver=True, fast_start=True, progress=False,
                       env={"CUDA_VISIBLE_DEVICES": ",".join(map(str, gpus))}, **{option: 2})
    try:
        info = eng.info
        ranks = 2 if option == "dp_size" else 1  # SGLang reports one state per data-parallel rank
        assert info["memory_usage"] is not None and len(info["memory_usage"]) == ranks
        if info["gpu_memory_per_gpu"] is not None:
            assert set(info["gpu_memory_per_gpu"]) == set(gpus)
        pids = _exercise(eng, model_path, tmp_path, [eng.url])  # the ranks share one URL
    finally:
        eng.close()
    _assert_closed(eng, pids, gpus, free_before)
