"""Unit-level tests of the CPU backend (rlgen.cpu_server): the runner, validation, fault modes.

The wire protocol itself is checked by the conformance suite (tests/conformance); these tests
cover what that suite cannot see: batching invariance, the runner's stop and seed semantics,
that bad requests leave the server serving, and the RLGEN_CPU_* fault modes.
"""

from __future__ import annotations

import functools
import json
import os
import queue
import re
import signal
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _cpu_server_process import READY_LINE, Server, free_port, post, running_server

torch = pytest.importorskip("torch")

from rlgen.cpu_server._jobs import Job, SamplingParams, SeqOutput  # noqa: E402 - after the importorskip
from rlgen.cpu_server._model import default_num_threads  # noqa: E402
from rlgen.cpu_server._runner import Runner  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
PROMPTS = ["The capital of France is", "Once upon a time", "1, 2, 3, 4,"]


# ---- in-process runner ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def runner(model_path: str) -> Iterator[Runner]:
    threads = torch.get_num_threads()
    torch.set_num_threads(default_num_threads())  # as the server does; far faster on shared cores
    runner = Runner(model_path, random_seed=0)
    runner.start()
    yield runner  # its thread is a daemon: it goes away with the test process
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def solo(runner: Runner) -> dict[str, list[int]]:
    """Greedy output ids of each prompt generated alone (computed once)."""
    return {p: _run(runner, [_job(runner, p, **GREEDY)])[0].output_ids for p in PROMPTS}


def _job(runner: Runner, prompt: str | list[int], **params: Any) -> Job:
    ids = prompt if isinstance(prompt, list) else runner.tokenizer(prompt)["input_ids"]
    logprob = {k: params.pop(k) for k in ("return_logprob", "logprob_start_len", "top_logprobs_num", "stream") if k in params}
    return Job(rid=f"t{time.monotonic_ns()}", input_ids=list(ids), params=SamplingParams(**params), sink=_unset, **logprob)


def _unset(_: SeqOutput) -> None:
    raise AssertionError("sink not set")


def _run(runner: Runner, jobs: list[Job], on_update: Any = None) -> list[SeqOutput]:
    """Submit jobs together; return their final outputs in order."""
    updates: queue.Queue[tuple[int, SeqOutput]] = queue.Queue()
    for i, job in enumerate(jobs):
        job.sink = functools.partial(lambda index, out: updates.put((index, out)), i)
    runner.submit(jobs)
    finals: dict[int, SeqOutput] = {}
    while len(finals) < len(jobs):
        i, out = updates.get(timeout=60)
        if on_update is not None:
            on_update(i, out)
        if out.finished:
            finals[i] = out
    return [finals[i] for i in range(len(jobs))]


GREEDY = {"temperature": 0.0, "max_new_tokens": 12, "ignore_eos": True}


def test_batched_greedy_matches_unbatched(runner: Runner, solo: dict[str, list[int]]) -> None:
    together = [out.output_ids for out in _run(runner, [_job(runner, p, **GREEDY) for p in PROMPTS])]
    assert together == [solo[p] for p in PROMPTS]
    assert all(len(ids) == 12 for ids in together)


def test_a_request_joining_a_running_batch_gets_the_same_tokens(runner: Runner, solo: dict[str, list[int]]) -> None:
    first = _job(runner, PROMPTS[0], stream=True, **{**GREEDY, "max_new_tokens": 12})
    late = _job(runner, PROMPTS[1], **GREEDY)
    submitted: list[bool] = []

    def join_after_three_tokens(i: int, out: SeqOutput) -> None:
        if i == 0 and len(out.output_ids) == 3 and not submitted:
            submitted.append(True)
            late.sink = lambda o: results.put(o)
            runner.submit([late])

    results: queue.Queue[SeqOutput] = queue.Queue()
    (first_out,) = _run(runner, [first], on_update=join_after_three_tokens)
    late_out = results.get(timeout=60)
    while not late_out.finished:
        late_out = results.get(timeout=60)
    assert submitted and first_out.output_ids == solo[PROMPTS[0]] and late_out.output_ids == solo[PROMPTS[1]]


@pytest.mark.parametrize(("interval", "lengths"), [(1, [1, 2, 3, 4, 5, 6, 7]), (3, [1, 4, 7]), (8, [1, 7])])
def test_a_stream_sends_a_chunk_every_stream_interval_tokens_from_the_first_and_its_last(
        runner: Runner, interval: int, lengths: list[int]) -> None:
    seen: list[int] = []
    job = _job(runner, PROMPTS[0], stream=True, stream_interval=interval, **{**GREEDY, "max_new_tokens": 7})
    _run(runner, [job], on_update=lambda i, out: seen.append(len(out.output_ids)))
    assert seen == lengths  # SGLang's rule: len % interval == 1, and the finished sequence


def test_stop_string_is_trimmed_from_text_but_not_from_output_ids(runner: Runner) -> None:
    base = _run(runner, [_job(runner, PROMPTS[0], **{**GREEDY, "max_new_tokens": 16})])[0]
    words = base.text.split()
    assert len(words) >= 3, base.text
    stop = words[2]
    cut = base.text.find(stop)
    out = _run(runner, [_job(runner, PROMPTS[0], stop=(stop,), **{**GREEDY, "max_new_tokens": 16})])[0]
    assert out.finish_reason == {"type": "stop", "matched": stop}
    assert out.text == base.text[:cut]
    assert out.output_ids == base.output_ids[: len(out.output_ids)]
    assert stop in runner.tokenizer.decode(out.output_ids)  # the ids still hold the stop string

    kept = _run(runner, [_job(runner, PROMPTS[0], stop=(stop,), no_stop_trim=True, **{**GREEDY, "max_new_tokens": 16})])[0]
    assert stop in kept.text and kept.output_ids == out.output_ids


def test_stop_token_is_in_output_ids_but_not_in_text(runner: Runner, solo: dict[str, list[int]]) -> None:
    params = {**GREEDY, "ignore_eos": False}
    base = solo[PROMPTS[2]]
    assert not set(base) & set(runner.eos_token_ids)  # so ignore_eos changes nothing here
    stop_id = base[3]
    first = base.index(stop_id)
    out = _run(runner, [_job(runner, PROMPTS[2], stop_token_ids=frozenset({stop_id}), **params)])[0]
    assert out.finish_reason == {"type": "stop", "matched": stop_id}
    assert out.output_ids == base[: first + 1]
    assert out.text == runner.tokenizer.decode(base[:first], skip_special_tokens=True)
    # ignore_eos also disables stop_token_ids, as in SGLang's check_finished
    ignored = _run(runner, [_job(runner, PROMPTS[2], stop_token_ids=frozenset({stop_id}), **GREEDY)])[0]
    assert ignored.output_ids == base


def test_sampling_seed_is_reproducible_and_independent_of_the_batch(runner: Runner) -> None:
    params = {"temperature": 1.0, "max_new_tokens": 10, "ignore_eos": True}
    a = _run(runner, [_job(runner, PROMPTS[1], sampling_seed=7, **params)])[0].output_ids
    batch = _run(runner, [_job(runner, PROMPTS[0], **params), _job(runner, PROMPTS[1], sampling_seed=7, **params)])
    other_seed = _run(runner, [_job(runner, PROMPTS[1], sampling_seed=8, top_p=0.9, top_k=50, **params)])[0]
    assert batch[1].output_ids == a
    assert other_seed.output_ids != a


def test_logprob_start_len_shapes(runner: Runner) -> None:
    ids = runner.tokenizer(PROMPTS[0])["input_ids"]
    n = len(ids)
    common = {**GREEDY, "max_new_tokens": 3, "return_logprob": True, "top_logprobs_num": 2}
    for start, expected in [(0, n), (2, n - 2), (n - 1, 1)]:
        out = _run(runner, [_job(runner, ids, logprob_start_len=start, **common)])[0]
        assert out.input_token_logprobs is not None and len(out.input_token_logprobs) == expected
        assert out.input_token_logprobs[0] == (None, ids[start])
        assert [tid for _, tid in out.input_token_logprobs] == ids[start:]
        assert out.input_top_logprobs is not None and out.input_top_logprobs[0] is None
        # greedy: each output token is its own top-1
        assert out.output_top_logprobs is not None
        for (lp, tid), top in zip(out.output_token_logprobs or [], out.output_top_logprobs):
            assert top[0][1] == tid and abs(top[0][0] - lp) < 1e-5


def test_abort_finishes_a_running_sequence_with_what_it_has(runner: Runner) -> None:
    runner._step_delay = 0.02
    try:
        job = _job(runner, PROMPTS[0], stream=True, temperature=0.0, max_new_tokens=500, ignore_eos=True)

        def abort_after_five(i: int, out: SeqOutput) -> None:
            if len(out.output_ids) == 5:
                runner.abort(job.rid)

        (out,) = _run(runner, [job], on_update=abort_after_five)
    finally:
        runner._step_delay = 0.0
    assert out.finish_reason is not None and out.finish_reason["type"] == "abort"
    assert 5 <= len(out.output_ids) < 500


def _on_scheduler(runner: Runner, fn: Any, *, barrier: bool = True) -> Any:
    """Run `fn` on the runner's scheduler thread and return its result."""
    done: queue.Queue[tuple[Any, BaseException | None]] = queue.Queue()
    runner.call(fn, lambda result, error: done.put((result, error)), barrier=barrier)
    result, error = done.get(timeout=60)
    if error is not None:
        raise error
    return result


def test_prompts_with_cached_prefixes_get_the_tokens_and_logprobs_of_a_cold_prefill(runner: Runner) -> None:
    prefixes = ["The capital of France is", "Once upon a time"]
    prompts = [prefixes[0] + " a city that", prefixes[1] + ", far away, there", "Completely unrelated words"]
    ids = [runner.tokenizer(p)["input_ids"] for p in prompts]

    def job(prompt_ids: list[int]) -> Job:  # logprobs from the last prompt token on: cacheable
        return _job(runner, prompt_ids, **GREEDY, return_logprob=True, logprob_start_len=len(prompt_ids) - 1)

    cold = []
    for prompt_ids in ids:
        assert _on_scheduler(runner, runner.flush_cache, barrier=False)
        cold.append(_run(runner, [job(prompt_ids)])[0])
    assert [out.cached_tokens for out in cold] == [0, 0, 0]
    assert _on_scheduler(runner, runner.flush_cache, barrier=False)
    _run(runner, [_job(runner, p, max_new_tokens=1) for p in prefixes])
    # One batch: rows with cached prefixes of different lengths (padding between prefix and new
    # tokens) and a row without one.
    warm = _run(runner, [job(prompt_ids) for prompt_ids in ids])
    shared = [len(runner.tokenizer(p)["input_ids"]) for p in prefixes]
    assert [out.cached_tokens for out in warm] == [*shared, 0]
    for a, b in zip(cold, warm):
        assert b.output_ids == a.output_ids
        assert max(abs(x - y) for (x, _), (y, _) in zip(a.output_token_logprobs or [], b.output_token_logprobs or [])) < 1e-4


def test_flush_cache_is_refused_while_a_request_runs(runner: Runner) -> None:
    runner._step_delay = 0.02
    try:
        job = _job(runner, PROMPTS[0], stream=True, temperature=0.0, max_new_tokens=500, ignore_eos=True)

        def flush_then_abort(i: int, out: SeqOutput) -> None:
            if len(out.output_ids) == 3:
                runner.call(runner.flush_cache, lambda result, _: flushed.append(result), barrier=False)
            if flushed:
                runner.abort(job.rid)

        flushed: list[bool] = []
        _run(runner, [job], on_update=flush_then_abort)
    finally:
        runner._step_delay = 0.0
    assert flushed == [False]
    assert _on_scheduler(runner, runner.flush_cache, barrier=False) is True


def test_max_new_tokens_zero_generates_nothing(runner: Runner) -> None:
    (out,) = _run(runner, [_job(runner, PROMPTS[0], max_new_tokens=0, return_logprob=True, logprob_start_len=0)])
    assert out.output_ids == [] and out.finish_reason == {"type": "length", "length": 0}
    assert out.input_token_logprobs is not None and len(out.input_token_logprobs) > 1


@pytest.fixture(scope="module")
def server(model_path: str) -> Iterator[Server]:
    with running_server(model_path) as srv:
        yield srv


VALUE_ERROR = ("error",)  # {"error": {"message": ...}}
TYPE_ERROR = ("object", "message", "type", "param", "code")  # FastAPI validation ErrorResponse

BAD_REQUESTS = [
    ({"text": 5}, TYPE_ERROR),
    ({"text": "hi", "stream": "yes"}, TYPE_ERROR),
    ({"input_ids": [1, "a"]}, TYPE_ERROR),
    (b"{not json", TYPE_ERROR),
    ({}, VALUE_ERROR),
    ({"input_ids": []}, VALUE_ERROR),
    ({"text": "hi", "sampling_params": {"max_new_tokens": -1}}, VALUE_ERROR),
    ({"text": "hi", "sampling_params": {"temperature": -0.5}}, VALUE_ERROR),
    ({"text": "hi", "sampling_params": {"top_p": 0.0}}, VALUE_ERROR),
    ({"text": "hi", "sampling_params": {"top_p": 1.5}}, VALUE_ERROR),
    ({"text": "hi", "sampling_params": {"top_k": 0}}, VALUE_ERROR),
    ({"text": "hi", "sampling_params": {"min_new_tokens": 5, "max_new_tokens": 2}}, VALUE_ERROR),
    ({"text": "hi", "sampling_params": {"max_new_tokens": 10_000}}, VALUE_ERROR),
    ({"text": "hi", "sampling_params": {"no_such_param": 1}}, VALUE_ERROR),
    ({"text": "hi", "sampling_params": {"temperature": "hot"}}, VALUE_ERROR),
    ({"input_ids": [1, 10_000_000]}, VALUE_ERROR),
    ({"input_ids": [1, -3]}, VALUE_ERROR),
    ({"text": ["a", "b"], "rid": ["x"]}, VALUE_ERROR),
    ({"text": ["a", "b"], "rid": ["x", "x"]}, VALUE_ERROR),
    ({"text": "hi", "return_logprob": True, "logprob_start_len": 50}, VALUE_ERROR),
    ({"text": ["a"], "sampling_params": [{"n": 2}, {"n": 3}]}, VALUE_ERROR),
]


@pytest.mark.timeout(120)
def test_bad_requests_get_400_and_the_server_keeps_serving(server: Server) -> None:
    for body, keys in BAD_REQUESTS:
        status, answer = post(server.url + "/generate", body)
        assert status == 400, (body, answer)
        assert tuple(answer) == keys, (body, answer)
        if keys == VALUE_ERROR:
            assert answer["error"]["message"], (body, answer)
    status, answer = post(server.url + "/generate", {"text": "hi", "sampling_params": {"max_new_tokens": 2}})
    assert status == 200 and len(answer["output_ids"]) == 2


@pytest.mark.timeout(120)
def test_a_stream_with_bad_params_answers_200_with_an_error_event(server: Server) -> None:
    body = json.dumps({"text": "hi", "stream": True, "sampling_params": {"top_p": 2}}).encode()
    request = urllib.request.Request(server.url + "/generate", data=body, method="POST")
    with urllib.request.urlopen(request, timeout=60) as response:
        assert response.status == 200
        events = [line.decode().strip() for line in response if line.strip()]
    assert events[-1] == "data: [DONE]" and "error" in json.loads(events[0][len("data: ") :])


@pytest.mark.timeout(120)
def test_update_weights_from_disk_reloads_and_rejects_a_bad_path(server: Server, model_path: str) -> None:
    status, answer = post(server.url + "/update_weights_from_disk", {"model_path": "/no/such/dir"})
    assert status == 400 and answer["success"] is False and answer["message"]
    status, answer = post(server.url + "/update_weights_from_disk", {"model_path": model_path, "weight_version": "v2"})
    assert status == 200 and answer["success"] is True, answer
    with urllib.request.urlopen(server.url + "/model_info", timeout=10) as response:
        assert json.loads(response.read())["weight_version"] == "v2"


@pytest.mark.timeout(120)
def test_released_weights_refuse_generation_and_resume_without_values_until_reloaded(server: Server, model_path: str) -> None:
    # SGLang 0.5.17 with --enable-memory-saver: resume gives the weights' memory back, not their
    # values (greedy output was empty there); update_weights_from_disk restores them.
    body = {"text": "The capital of France is", "sampling_params": {"temperature": 0.0, "max_new_tokens": 6}}
    status, before = post(server.url + "/generate", body)
    assert status == 200 and before["text"]
    assert post(server.url + "/release_memory_occupation", {}) == (200, None)
    status, answer = post(server.url + "/generate", body)
    assert status == 503 and "memory is released" in answer["message"], answer
    status, answer = post(server.url + "/update_weights_from_disk", {"model_path": model_path})
    assert status == 400 and "released" in answer["message"], answer
    assert post(server.url + "/resume_memory_occupation", {}) == (200, None)
    status, resumed = post(server.url + "/generate", body)
    assert status == 200 and resumed["text"] == "" and resumed["output_ids"] != before["output_ids"]
    status, answer = post(server.url + "/update_weights_from_disk", {"model_path": model_path})
    assert status == 200 and answer["success"] is True, answer
    status, after = post(server.url + "/generate", body)
    assert status == 200 and after["output_ids"] == before["output_ids"]


@pytest.mark.timeout(120)
def test_freeze_gc_freezes_the_process_and_needs_the_api_key_like_the_other_admin_routes(model_path: str) -> None:
    def call(method: str, key: str | None) -> tuple[int, str]:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        request = urllib.request.Request(srv.url + "/freeze_gc", headers=headers, method=method)
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return response.status, response.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()

    with running_server(model_path, args=["--api-key", "k3y"]) as srv:
        assert call("POST", None) == (401, '{"error":"Unauthorized"}')
        assert call("POST", "wrong")[0] == 401
        assert call("POST", "k3y") == (200, "Garbage collection frozen.\n")  # SGLang's text
        assert srv.wait_for("Freezing GC in CPU backend process.", timeout=10)
        assert re.search(r"gen0: \d+->\d+, gen1: \d+->\d+, gen2: [1-9]\d*->\d+$", srv.lines[-1].strip()), srv.lines[-1]
        assert call("GET", "k3y") == (200, "Garbage collection frozen.\n")


@pytest.mark.timeout(120)
def test_binding_a_port_in_use_fails_clearly(server: Server, model_path: str) -> None:
    second = Server(model_path, server.port)
    try:
        assert not second.wait_for("The server is fired up"), "second server started on a taken port"
        assert "address already in use" in second.rest_of_output()
        assert second.proc.wait(timeout=30) != 0
    finally:
        second.kill()


# ---- fault modes ---------------------------------------------------------------------------------------


@pytest.mark.timeout(60)
def test_die_at_start_prints_an_oom_and_exits_1(model_path: str) -> None:
    srv = Server(model_path, free_port(), faults="die_at_start")
    try:
        assert srv.proc.wait(timeout=45) == 1
        output = srv.rest_of_output()
        assert "Load weight begin" in output
        assert "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 GiB" in output
    finally:
        srv.kill()


@pytest.mark.timeout(60)
def test_hang_at_start_with_ignored_sigterm_and_a_grandchild(model_path: str) -> None:
    srv = Server(model_path, free_port(), faults="hang_at_start,ignore_sigterm,spawn_grandchild")
    try:
        assert srv.wait_for("grandchild pid=")
        grandchild = int(srv.lines[-1].strip().split("grandchild pid=")[1])
        assert srv.wait_for("Load weight begin")
        os.kill(srv.proc.pid, signal.SIGTERM)
        time.sleep(1.0)
        assert srv.proc.poll() is None, "SIGTERM should be ignored"
        os.kill(grandchild, 0)  # alive, in the server's session
        assert os.getsid(grandchild) == os.getsid(srv.proc.pid)
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.1", srv.port), timeout=1).close()
    finally:
        srv.kill()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # the group kill took the grandchild too
        try:
            os.kill(grandchild, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        pytest.fail("grandchild survived the process-group kill")


@pytest.mark.timeout(90)
def test_die_mid_request_exits_13_without_answering(model_path: str) -> None:
    srv = Server(model_path, free_port(), faults="die_mid_request")
    try:
        assert srv.wait_for(READY_LINE), srv.rest_of_output()
        with pytest.raises((urllib.error.URLError, ConnectionError, OSError)):
            post(srv.url + "/generate", {"text": "hi"}, timeout=30)
        assert srv.proc.wait(timeout=30) == 13
    finally:
        srv.kill()
