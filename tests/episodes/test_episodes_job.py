"""Background episodes across weight updates on the CPU backend (a real server process, real HTTP,
SGLang 0.5.17's pause and continue): `eng.submit_episodes` returns at once and its result equals a
synchronous `eng.episodes` call (greedy); a weight update under pause 'abort' from the main thread
while the episodes run pauses the server, pushes the same weights and continues it, and every turn
the pause ended goes on as the same sequence (the episodes end exactly as without the push, token
for token, and the server sampled no token twice: its own count equals the tokens kept); cancel;
bad inputs refused.

The server sleeps 20 ms per decode step, so that turns are still running when the pause comes.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from _cpu_server_process import stepped_engine

import rlgen

torch = pytest.importorskip("torch")

PROMPTS = ["Count from one to twenty:", "Name some colours:"]
KW: dict[str, Any] = {"n": 2, "max_turns": 3, "max_new_tokens": 16, "temperature": 0.0, "ignore_eos": True}


def again(messages: list[dict[str, Any]], data: Any) -> str:
    return "Go on."


@pytest.fixture(scope="module")
def eng(model_path: str) -> Iterator[rlgen.Engine]:
    with stepped_engine(model_path) as engine:
        yield engine


@pytest.fixture(scope="module")
def reference(eng: rlgen.Engine) -> rlgen.Episodes:
    """The same episodes, synchronous and without a push (the CPU backend is deterministic when greedy)."""
    return eng.episodes(PROMPTS, env=again, **KW)


def counter(eng: rlgen.Engine, name: str) -> int:
    df = eng.metrics()
    return int(df[df.name == name].value.sum())


def whole(res: rlgen.Episodes, reference: rlgen.Episodes) -> None:
    """Every episode ended as the reference's: statuses, ids, loss masks, turns of full length."""
    assert res.df.status.tolist() == reference.df.status.tolist() == ["max_turns"] * 4
    assert res.id_lists() == reference.id_lists()
    for record in res.records:
        assert len(record.loss_mask) == len(record.ids) == len(record.logprobs) == len(record.turn_ids)
        assert [t["tokens"] for t in record.assistant_turns] == [KW["max_new_tokens"]] * KW["max_turns"]
    assert res.records[0].loss_mask == reference.records[0].loss_mask


@pytest.mark.timeout(120)
def test_background_episodes_return_at_once_and_equal_a_synchronous_call(eng: rlgen.Engine,
                                                                          reference: rlgen.Episodes) -> None:
    started = time.perf_counter()
    job = eng.submit_episodes(PROMPTS, env=again, **KW)
    assert time.perf_counter() - started < 1.0 and job.state in ("running", "done")
    res = job.result(timeout=60)
    assert job.done() and job.state == "done" and isinstance(res, rlgen.Episodes)
    p = job.progress
    assert (p.done, p.total, p.turns, p.updates) == (4, 4, 12, 0) and p.tokens == res.records[0].sampled_tokens * 4
    assert "EpisodesJob done" in repr(job) and eng.last_episodes is res and job.result() is res
    whole(res, reference)


@pytest.mark.timeout(180)
def test_a_push_under_abort_mid_turn_continues_every_turn(eng: rlgen.Engine, reference: rlgen.Episodes,
                                                          model_path: str) -> None:
    from transformers import AutoModelForCausalLM

    trainer = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.bfloat16)
    tokens0, requests0 = counter(eng, "sglang:generation_tokens_total"), counter(eng, "sglang:num_requests_total")
    job = eng.submit_episodes(PROMPTS, env=again, **KW)
    time.sleep(0.15)  # the first turns are being sampled (16 steps of 20 ms)
    assert job.progress.turns == 0
    version = eng.update_weights(trainer, pause="abort")  # the same weights: greedy output unchanged
    res = job.result(timeout=90)
    whole(res, reference)
    assert job.progress.updates == 1
    kept = sum(r.sampled_tokens for r in res.records)
    assert counter(eng, "sglang:generation_tokens_total") - tokens0 == kept  # no token sampled twice
    assert counter(eng, "sglang:num_requests_total") - requests0 > 12  # some turn took two requests
    assert {t["weight_version"] for r in res.records for t in r.assistant_turns} == {version}


@pytest.mark.timeout(60)
def test_cancel_and_bad_inputs(eng: rlgen.Engine) -> None:
    job = eng.submit_episodes(PROMPTS, env=again, **{**KW, "max_new_tokens": 64})
    time.sleep(0.2)
    job.cancel()
    assert job.done() and job.state == "cancelled"
    res = job.result(timeout=10)
    assert set(res.df.status) == {"cancelled"} and "cancelled" in repr(job)
    job.cancel()  # a second cancel is nothing
    with pytest.raises(TypeError):
        eng.submit_episodes(PROMPTS, env=again, max_new_token=4)  # type: ignore[call-arg]
    with pytest.raises((TypeError, ValueError)):
        eng.submit_episodes([], env=again)
    with pytest.raises(ValueError):
        eng.submit_episodes(PROMPTS, env=again, n=0)


@pytest.mark.timeout(120)
def test_closing_the_engine_cancels_its_background_episodes(model_path: str) -> None:
    eng = rlgen.Engine(model_path, backend="cpu", progress=False, env={"RLGEN_CPU_STEP_DELAY": "0.02"})
    try:
        job = eng.submit_episodes(PROMPTS, env=again, **{**KW, "max_new_tokens": 64})
        time.sleep(0.3)
    finally:
        eng.close()
    assert job.done() and job.state == "cancelled"
    assert set(job.result(timeout=10).df.status) == {"cancelled"}
