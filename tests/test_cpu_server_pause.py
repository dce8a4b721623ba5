"""Pause and continue on the CPU backend, as SGLang 0.5.17 speaks them (docs/sglang-api.md 2.1).

What a client blocked on /generate receives when /pause_generation comes in each mode ("abort":
200 with finish_reason abort and the tokens so far, "Abort in waiting queue" for a queued request,
499 for one held at the gate; "in_place" and "retract": only a longer request), requests held while
paused and served after /continue_generation, weight updates while paused (at once, their
weight_version on the answers built after them, flush_cache refused while the pause keeps
requests), num_retractions, and the 400s. A real server process (its decode steps slowed down so
that requests are still running when the pause comes), and one in-process runner.
"""

from __future__ import annotations

import itertools
import json
import queue
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from _cpu_server_process import READY_LINE, Server, free_port, post
from _streams import Stream

torch = pytest.importorskip("torch")

from rlgen.cpu_server._jobs import Job, SamplingParams, SeqOutput  # noqa: E402 - after the importorskip
from rlgen.cpu_server._runner import Runner  # noqa: E402

PAUSED = {"message": "Generation paused successfully.", "status": "ok"}
CONTINUED = {"message": "Generation continued successfully.", "status": "ok"}
ABORTED = {"type": "abort", "message": "Aborted", "status_code": None, "err_type": None}
ABORTED_WAITING = {"type": "abort", "message": "Abort in waiting queue"}
VALIDATION_ERROR = ("object", "message", "type", "param", "code")  # FastAPI's 400 body
LONG = 200  # max_new_tokens of requests that must still be running when the pause comes


def _body(prompt: str, max_new_tokens: int, **extra: Any) -> dict[str, Any]:
    sampling = {"temperature": 0.0, "max_new_tokens": max_new_tokens, "ignore_eos": True}
    return {"text": prompt, "sampling_params": sampling, **extra}


@pytest.fixture(scope="module")
def server(model_path: str) -> Iterator[Server]:
    """Two running requests at most (a third waits in the scheduler's queue); 30 ms per decode step."""
    srv = Server(model_path, free_port(), extra_env={"RLGEN_CPU_STEP_DELAY": "0.03"},
                 args=["--max-running-requests", "2"])  # fmt: skip
    try:
        assert srv.wait_for(READY_LINE), srv.rest_of_output()
        yield srv
    finally:
        srv.kill()


class Call:
    """A POST on its own thread; `result()` is its (status, JSON body)."""

    def __init__(self, server: Server, path: str, body: dict[str, Any]) -> None:
        self._box: queue.Queue[tuple[int, Any]] = queue.Queue()
        threading.Thread(target=lambda: self._box.put(post(server.url + path, body, timeout=120)), daemon=True).start()

    @property
    def done(self) -> bool:
        return not self._box.empty()

    def result(self, timeout: float = 60) -> tuple[int, Any]:
        return self._box.get(timeout=timeout)


def _until(condition: Any, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def _loads(server: Server) -> tuple[int, int]:
    with urllib.request.urlopen(server.url + "/v1/loads", timeout=10) as response:
        load = json.loads(response.read())["loads"][0]
    return load["num_running_reqs"], load["num_waiting_reqs"]


def _pause(server: Server, body: Any) -> None:
    assert post(server.url + "/pause_generation", body) == (200, PAUSED)


def _continue(server: Server) -> None:
    assert post(server.url + "/continue_generation", {}) == (200, CONTINUED)


def _set_version(server: Server, version: str) -> None:
    status, _ = post(server.url + "/update_weight_version", {"new_version": version, "abort_all_requests": False})
    assert status == 200


def _assert_no_token_lost_or_doubled(stream: Stream, total: int) -> None:
    """Each chunk of a stream carries one more token than the one before, and extends it."""
    ids = [chunk["output_ids"] for chunk in stream.chunks]
    assert [len(i) for i in ids] == list(range(1, total + 1))
    assert all(later[: len(earlier)] == earlier for earlier, later in itertools.pairwise(ids))


def _assert_serves(server: Server) -> None:
    status, answer = post(server.url + "/generate", _body("Still there?", 2))
    assert status == 200 and answer["meta_info"]["finish_reason"] == {"type": "length", "length": 2}


# ---- abort ------------------------------------------------------------------------------------------


@pytest.mark.timeout(180)
def test_pause_abort_answers_every_request_with_its_tokens_so_far_and_holds_new_ones(server: Server, tok: Any) -> None:
    _set_version(server, "v-abort")
    streamed = Stream(server.url, _body("Tell me a long story.", LONG, return_logprob=True))
    whole = Call(server, "/generate", _body("Count to a thousand:", LONG, return_logprob=True))
    _until(lambda: _loads(server)[0] == 2, 60)
    queued = Stream(server.url, _body("Waiting in line.", LONG))  # a third: the scheduler's queue
    _until(lambda: _loads(server) == (2, 1), 60)
    streamed.wait_tokens(3)
    _pause(server, {"mode": "abort"})
    # The pause answers once every request has come back.
    _until(lambda: streamed.done and whole.done and queued.done, 5)
    status, answer = whole.result()
    assert status == 200
    for out in (streamed.final(), answer):
        meta, ids = out["meta_info"], out["output_ids"]
        assert meta["finish_reason"] == ABORTED
        assert 3 <= len(ids) < LONG and meta["completion_tokens"] == len(ids)
        assert out["text"] == tok.decode(ids, skip_special_tokens=True)
        assert [entry[1] for entry in meta["output_token_logprobs"]] == ids
        assert meta["weight_version"] == "v-abort" and meta["num_retractions"] == 0
    waiting = queued.final()
    assert waiting["output_ids"] == [] and waiting["text"] == ""
    assert waiting["meta_info"]["finish_reason"] == ABORTED_WAITING
    assert set(waiting["meta_info"]) == {"id", "finish_reason", "weight_version", "e2e_latency", "completion_tokens"}
    # While paused, a new request is held, not refused, and served after continue.
    held = Call(server, "/generate", _body("Held at the gate.", 4))
    time.sleep(1.0)
    assert not held.done and _loads(server) == (0, 0)
    _continue(server)
    status, answer = held.result()
    assert status == 200 and answer["meta_info"]["finish_reason"] == {"type": "length", "length": 4}
    assert answer["meta_info"]["num_retractions"] == 0


@pytest.mark.timeout(120)
def test_requests_held_at_the_gate_when_an_abort_pause_comes_get_499_at_continue(server: Server) -> None:
    _pause(server, {})  # an empty JSON body means "abort"
    try:
        whole = Call(server, "/generate", _body("Held 1.", 4, rid="held-whole"))
        streamed = Stream(server.url, _body("Held 2.", 4, rid="held-stream"))
        _until(lambda: streamed.status is not None, 10)  # a stream's 200 and headers come at once
        assert streamed.status == 200 and not whole.done
        _pause(server, {"mode": "abort"})  # marks the held requests aborted
    finally:
        _continue(server)
    assert whole.result() == (499, {"error": {"message": "Request held-whole was aborted"}})
    assert streamed.final()
    assert streamed.chunks == [{"error": {"message": "Request held-stream was aborted", "type": "invalid_request_error",
                                          "code": 499, "retryable": False}}]  # fmt: skip
    _assert_serves(server)


@pytest.mark.timeout(120)
def test_a_retracted_request_aborted_in_the_queue_keeps_its_tokens(server: Server, tok: Any) -> None:
    streamed = Stream(server.url, _body("Once upon a time", LONG))
    whole = Call(server, "/generate", _body("The capital of France is", LONG, return_logprob=True))
    _until(lambda: _loads(server)[0] == 2, 60)
    streamed.wait_tokens(3)
    _pause(server, {"mode": "retract"})
    try:
        _until(lambda: _loads(server) == (0, 2), 5)
        assert post(server.url + "/abort_request", {"abort_all": True}) == (200, None)
        status, answer = whole.result(timeout=10)
        assert status == 200
        meta, ids = answer["meta_info"], answer["output_ids"]
        assert meta["finish_reason"] == ABORTED_WAITING and 1 <= len(ids) < LONG
        assert answer["text"] == tok.decode(ids, skip_special_tokens=True) and meta["completion_tokens"] == len(ids)
        assert [entry[1] for entry in meta["output_token_logprobs"]] == ids
        assert "num_retractions" not in meta and "prompt_tokens" not in meta
        last = streamed.final(timeout=10)
        before = streamed.chunks[-2]["output_ids"]
        # SGLang's tokenizer manager sends a stream only the last of its output ids here.
        assert last["output_ids"] == before[-1:] and last["meta_info"]["completion_tokens"] == len(before)
        assert last["meta_info"]["finish_reason"] == ABORTED_WAITING
    finally:
        _continue(server)
    _assert_serves(server)


# ---- in place ---------------------------------------------------------------------------------------


@pytest.mark.timeout(120)
def test_a_greedy_request_paused_in_place_gives_the_tokens_of_an_unpaused_one(server: Server) -> None:
    body = _body("The history of the printing press", 64)
    status, reference = post(server.url + "/generate", body)
    assert status == 200
    streamed = Stream(server.url, body)
    streamed.wait_tokens(5)
    _pause(server, {"mode": "in_place"})
    try:
        time.sleep(0.3)  # chunks already on their way
        seen = len(streamed.chunks)
        time.sleep(1.0)
        assert len(streamed.chunks) == seen < 64 and _loads(server) == (1, 0)
    finally:
        _continue(server)
    final = streamed.final()
    assert final["output_ids"] == reference["output_ids"]
    assert final["meta_info"]["finish_reason"] == {"type": "length", "length": 64}
    assert final["meta_info"]["num_retractions"] == 0
    _assert_no_token_lost_or_doubled(streamed, 64)


@pytest.mark.timeout(120)
def test_an_update_while_paused_in_place_runs_at_once_and_later_answers_carry_its_version(
        server: Server, model_path: str) -> None:
    _set_version(server, "v-before")
    streamed = Stream(server.url, _body("A recipe for bread:", 64))
    streamed.wait_tokens(3)
    _pause(server, {"mode": "in_place"})
    try:
        held = Call(server, "/generate", _body("Held while paused.", 4))
        # flush_cache (default true) while the pause keeps a request: refused, and the server lives.
        status, answer = post(server.url + "/update_weights_from_disk", {"model_path": model_path, "weight_version": "v-no"})
        assert status == 400 and answer["success"] is False and answer["num_paused_requests"] == 0
        assert "Pass flush_cache=false while paused with mode retract or in_place" in answer["message"]
        status, answer = post(server.url + "/update_weights_from_tensor", {"serialized_named_tensors": ["unread"]})
        assert status == 400 and "flush_cache=false" in answer["message"]  # refused before the payload is read
        status, answer = post(server.url + "/update_weights_from_disk",
                              {"model_path": model_path, "weight_version": "v-in-place", "flush_cache": False}, timeout=30)  # fmt: skip
        assert (status, answer) == (200, {"success": True, "num_paused_requests": 0,
                                          "message": "Succeeded to update model weights. Weight version updated to v-in-place."})  # fmt: skip
        assert not held.done and not streamed.done
    finally:
        _continue(server)
    final = streamed.final()
    assert streamed.chunks[0]["meta_info"]["weight_version"] == "v-before"
    assert final["meta_info"]["weight_version"] == "v-in-place"
    assert final["meta_info"]["finish_reason"] == {"type": "length", "length": 64}
    _assert_no_token_lost_or_doubled(streamed, 64)
    status, answer = held.result()
    assert status == 200 and answer["meta_info"]["weight_version"] == "v-in-place"


# ---- retract ----------------------------------------------------------------------------------------


@pytest.mark.timeout(120)
def test_retract_sends_a_request_back_to_the_queue_and_it_finishes_whole_after_continue(
        server: Server, model_path: str) -> None:
    _set_version(server, "v-r0")
    streamed = Stream(server.url, _body("The rules of chess", 64, return_logprob=True))
    streamed.wait_tokens(3)
    _pause(server, {"mode": "retract"})
    try:
        _until(lambda: _loads(server) == (0, 1), 5)
        status, answer = post(server.url + "/update_weights_from_disk", {"model_path": model_path, "flush_cache": True})
        assert status == 400 and "flush_cache=false" in answer["message"]
        status, answer = post(server.url + "/update_weights_from_disk",
                              {"model_path": model_path, "weight_version": "v-r1", "flush_cache": False}, timeout=30)  # fmt: skip
        assert status == 200 and answer["success"] is True
    finally:
        _continue(server)
    final = streamed.final()
    meta = final["meta_info"]
    assert meta["finish_reason"] == {"type": "length", "length": 64}
    assert meta["num_retractions"] == 1 and meta["weight_version"] == "v-r1"
    assert [entry[1] for entry in meta["output_token_logprobs"]] == final["output_ids"]
    assert len(meta["input_token_logprobs"]) == 1  # the prompt's, from the first prefill
    _assert_no_token_lost_or_doubled(streamed, 64)
    assert streamed.chunks[0]["meta_info"]["num_retractions"] == 0


# ---- updates without a pause ------------------------------------------------------------------------


@pytest.mark.timeout(120)
def test_an_update_waits_for_running_requests_unless_it_aborts_them(server: Server, model_path: str) -> None:
    _set_version(server, "v-u0")
    streamed = Stream(server.url, _body("Ten facts about owls:", 40))
    streamed.wait_tokens(3)
    status, _ = post(server.url + "/update_weights_from_disk", {"model_path": model_path, "weight_version": "v-u1"})
    assert status == 200 and streamed.done  # SGLang's model_update_lock: the update waited for it
    final = streamed.final()
    assert final["meta_info"]["finish_reason"] == {"type": "length", "length": 40}
    assert final["meta_info"]["weight_version"] == "v-u0"
    streamed = Stream(server.url, _body("Ten facts about cats:", LONG))
    streamed.wait_tokens(3)
    body = {"model_path": model_path, "weight_version": "v-u2", "abort_all_requests": True}
    assert post(server.url + "/update_weights_from_disk", body)[0] == 200
    final = streamed.final(timeout=10)
    assert final["meta_info"]["finish_reason"] == ABORTED and len(final["output_ids"]) < LONG


# ---- refusals ---------------------------------------------------------------------------------------


@pytest.mark.timeout(120)
def test_pause_and_continue_refuse_a_bad_body_with_fastapis_400(server: Server) -> None:
    for body in ({"mode": "bogus"}, {"mode": None}, {"mode": 1}, [], b"", b"{not json"):
        status, answer = post(server.url + "/pause_generation", body)
        assert status == 400 and tuple(answer) == VALIDATION_ERROR, (body, answer)
    status, answer = post(server.url + "/pause_generation", {"mode": "bogus"})
    assert "Input should be 'abort', 'retract' or 'in_place'" in answer["message"]
    for body in (b"", {"torch_empty_cache": "yes"}):
        status, answer = post(server.url + "/continue_generation", body)
        assert status == 400 and tuple(answer) == VALIDATION_ERROR, (body, answer)
    assert post(server.url + "/continue_generation", {"torch_empty_cache": False}) == (200, CONTINUED)
    _assert_serves(server)


@pytest.mark.timeout(120)
def test_health_waits_for_continue_while_paused(server: Server) -> None:
    _pause(server, {"mode": "in_place"})
    box: queue.Queue[int] = queue.Queue()

    def health() -> None:
        with urllib.request.urlopen(server.url + "/health", timeout=60) as response:
            box.put(response.status)

    threading.Thread(target=health, daemon=True).start()
    time.sleep(1.0)
    assert box.empty()
    _continue(server)
    assert box.get(timeout=30) == 200


# ---- the runner: an aborted row samples one more token, and reports abort -------------------------------


def test_an_aborted_running_sequence_keeps_the_token_of_its_last_step_and_reports_abort(model_path: str) -> None:
    """SGLang's Req.update_finish_state checks to_finish before the length: a request aborted one
    token before its max_new_tokens still samples that token, and its reason is abort, not length."""
    runner = Runner(model_path, random_seed=0)
    runner.start()
    ids = runner.tokenizer("The capital of France is")["input_ids"]
    updates: queue.Queue[SeqOutput] = queue.Queue()
    job = Job(rid="last-step", input_ids=ids, stream=True, sink=updates.put,
              params=SamplingParams(max_new_tokens=5, temperature=0.0, ignore_eos=True))  # fmt: skip

    def abort_at_four(out: SeqOutput) -> None:  # on the scheduler thread, inside step 4
        if len(out.output_ids) == 4 and not out.finished:
            runner.abort(job.rid)
        updates.put(out)

    job.sink = abort_at_four
    runner.submit([job])
    out = updates.get(timeout=60)
    while not out.finished:
        out = updates.get(timeout=60)
    assert len(out.output_ids) == 5 and out.finish_reason == ABORTED
