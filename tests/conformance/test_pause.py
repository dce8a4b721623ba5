"""SGLang 0.5.17's /pause_generation and /continue_generation on the wire (docs/sglang-api.md 2.1).

The bodies, a 400 for an unknown mode, and what a request that is running when the pause comes
receives in each mode: "abort" ends it with its tokens so far; "in_place" and "retract" only make
it longer. Runs against the CPU backend (CI) and real SGLang (GPU machine), as test_protocol.py;
tests/test_cpu_server_pause.py checks the CPU backend's side in detail.
"""

from __future__ import annotations

import itertools
import time
from typing import Any

import pytest
from _streams import Stream

pytestmark = [pytest.mark.conformance, pytest.mark.timeout(600)]

PAUSED = {"message": "Generation paused successfully.", "status": "ok"}
CONTINUED = {"message": "Generation continued successfully.", "status": "ok"}


def _budget(target: Any) -> int:
    """max_new_tokens of a request that must still be running a while after its first token."""
    return 4000 if target.backend == "sglang" else 160


def _body(prompt: str, max_new_tokens: int) -> dict[str, Any]:
    return {"text": prompt, "sampling_params": {"temperature": 0.0, "max_new_tokens": max_new_tokens, "ignore_eos": True}}


def test_pause_and_continue_answer_their_bodies_and_an_unknown_mode_is_a_400(target) -> None:
    assert target.post("/pause_generation", {}) == (200, PAUSED)  # {} is mode "abort"
    assert target.post("/continue_generation", {}) == (200, CONTINUED)
    status, body = target.post("/pause_generation", {"mode": "no-such-mode"})
    assert status == 400 and body["code"] == 400 and "'abort', 'retract' or 'in_place'" in body["message"]
    assert target.generate(_body("Still serving?", 2))["meta_info"]["finish_reason"]["type"] == "length"


def test_a_request_running_when_an_abort_pause_comes_ends_with_abort_and_its_tokens(target) -> None:
    budget = _budget(target)
    stream = Stream(target.url, _body("Tell me a very long story.", budget))
    stream.wait_tokens(1, timeout=120)
    try:
        assert target.post("/pause_generation", {"mode": "abort"}) == (200, PAUSED)
        final = stream.final(timeout=30)
    finally:
        assert target.post("/continue_generation", {}) == (200, CONTINUED)
    meta, ids = final["meta_info"], final["output_ids"]
    assert meta["finish_reason"] == {"type": "abort", "message": "Aborted", "status_code": None, "err_type": None}
    assert 1 <= len(ids) < budget and meta["completion_tokens"] == len(ids)
    assert final["text"] == target.tokenizer.decode(ids, skip_special_tokens=True)
    assert isinstance(meta["weight_version"], str) and meta["num_retractions"] == 0


@pytest.mark.parametrize("mode", ["in_place", "retract"])
def test_a_request_running_when_the_pause_comes_finishes_whole_after_continue(target, mode: str) -> None:
    budget = _budget(target)
    stream = Stream(target.url, _body("Write out the alphabet, many times.", budget))
    stream.wait_tokens(1, timeout=120)
    try:
        assert target.post("/pause_generation", {"mode": mode}) == (200, PAUSED)
        time.sleep(0.5)
        paused_at = len(stream.chunks)
        time.sleep(0.5)
        assert len(stream.chunks) == paused_at and not stream._done.is_set()
    finally:
        assert target.post("/continue_generation", {}) == (200, CONTINUED)
    final = stream.final(timeout=300)
    meta = final["meta_info"]
    assert meta["finish_reason"] == {"type": "length", "length": budget} and len(final["output_ids"]) == budget
    assert meta["num_retractions"] == (1 if mode == "retract" else 0)
    ids = [chunk["output_ids"] for chunk in stream.chunks]
    assert all(later[: len(earlier)] == earlier for earlier, later in itertools.pairwise(ids))  # none lost or doubled
