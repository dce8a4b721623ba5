"""Background episodes across weight updates on the CPU backend (a real server process, real HTTP,
SGLang 0.5.17's pause and continue): `eng.submit_episodes` returns at once and its result equals a
synchronous `eng.episodes` call (greedy); a weight update under pause 'abort' from the main thread
while the episodes run pauses the server, pushes the same weights and continues it, and every turn
the pause ended goes on as the same sequence (the episodes end exactly as without the push, token
for token, and the server sampled no token twice: its own count equals the tokens kept), each
sampled token labelled with the version index that sampled it (before the push, then after it;
-1 on the environment's tokens), as a synchronous call's are with the version it ran on; cancel;
bad inputs refused.

The server sleeps 20 ms per decode step, so that turns are still running when the pause comes.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _cpu_server_process import stepped_engine

import rlgen
from rlgen.episodes import ROLE_CODES

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
    assert '<progress value="4" max="4"' in job._repr_html_() and "12 turns" in job._repr_html_()
    whole(res, reference)


def sampled_versions(res: rlgen.Episodes) -> Any:
    """`res.versions`, checked against the loss mask: a version (>= 0) on exactly the tokens the
    model sampled, -1 on the environment's tokens and padding, never going back along a row."""
    versions, t = res.versions, res.tensors()
    assert versions is not None and versions.dtype == torch.int64
    assert versions.shape == res.logprobs.shape == t["loss_mask"].shape
    mask = t["loss_mask"]
    assert bool((versions[mask] >= 0).all()) and bool((versions[~mask] == -1).all())
    assert int((versions >= 0).sum()) == int(mask.sum()) == sum(r.sampled_tokens for r in res.records)
    assert bool((versions[t["roles"] == ROLE_CODES["env"]] == -1).all())
    for i, row in enumerate(versions.tolist()):
        labels = [v for v in row if v >= 0]
        assert labels == sorted(labels)
        assert (res.df.version_min[i], res.df.version_max[i]) == (min(labels), max(labels))
    for record in res.records:
        assert len(record.versions) == len(record.ids)
    return versions[mask]


@pytest.mark.timeout(180)
def test_a_push_under_abort_mid_turn_continues_every_turn(eng: rlgen.Engine, reference: rlgen.Episodes,
                                                          model_path: str, tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    trainer = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.bfloat16)
    tokens0, requests0 = counter(eng, "sglang:generation_tokens_total"), counter(eng, "sglang:num_requests_total")
    before = eng.version_index
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
    # each token by the version that sampled it: the turns the pause cut, before then after the push
    assert eng.version_index == before + 1
    labels = sampled_versions(res)
    assert set(labels.tolist()) == {before, before + 1} and int((labels == before).sum()) > 0
    assert res.df.version_min.tolist() == [before] * 4 and res.df.version_max.tolist() == [before + 1] * 4
    # the turn the pause cut: its tokens before the abort by the old version, its continuation (sent
    # once the gate opened, after the push) by the new one
    for r in res.records:
        first = r.assistant_turns[0]["turn"]
        cut = [v for v, t, m in zip(r.versions, r.turn_ids, r.loss_mask) if m and t == first]
        assert cut[0] == before and cut[-1] == before + 1 and cut == sorted(cut), cut
    # as a GenerationJob's rows: how stale each row is now, its requests (the cut turn's two and the
    # others' one each), and what its tokens attended to (abort: the continuation recomputed its keys)
    assert res.df.staleness.tolist() == [1] * 4 and set(res.df.kv_staleness) == {"fresh"}
    segments = [sum(t["n_segments"] for t in r.assistant_turns) for r in res.records]
    assert res.df.n_segments.tolist() == segments and all(n > KW["max_turns"] for n in segments)
    assert sum(segments) == counter(eng, "sglang:num_requests_total") - requests0
    # kept through selection and parquet, as a generate() result's
    assert res[[3, 0]].versions.tolist() == res.versions[[3, 0]].tolist()
    res.to_parquet(tmp_path / "e.parquet")
    back = rlgen.Episodes.from_parquet(tmp_path / "e.parquet")
    assert back.versions.tolist() == res.versions.tolist() and back.df.version_min.tolist() == [before] * 4
    assert back.records[1].versions == res.records[1].versions


@pytest.mark.timeout(60)
def test_a_synchronous_call_labels_its_sampled_tokens_with_the_current_version(eng: rlgen.Engine) -> None:
    res = eng.episodes(PROMPTS, env=again, **{**KW, "max_turns": 2, "max_new_tokens": 4})
    assert set(sampled_versions(res).tolist()) == {eng.version_index}
    assert res.df.version_min.tolist() == res.df.version_max.tolist() == [eng.version_index] * 4
    assert res.df.staleness.tolist() == [0] * 4 and res.df.n_segments.tolist() == [2] * 4


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
