"""Background jobs across weight updates on the CPU backend (a real server process, real HTTP, SGLang
0.5.17's pause and continue): `eng.submit` returns at once; a weight update from another thread
pauses the server ('abort', 'retract', 'in_place'), pushes and continues it, and every sample goes
on without losing or repeating a token (the same weights pushed back: greedy output equals the
same request without a push, token for token and in text); every token carries the version index
that sampled it and the tokens by version add up to the tokens sampled; a push that fails mid-job
and Ctrl-C during a paused push leave the server continued and the job going; partial results
(`min_done`, `rest='recycle'`, `eng.submit(job.partial)`); cancel; bad inputs refused.

The server sleeps 20 ms per decode step, so that requests are still running when a pause comes.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from _cpu_server_process import post, stepped_engine

import rlgen
from rlgen.engine import GenerationJob, _weights

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.filterwarnings("ignore:these prompts are plain text")

PROMPTS = ["Count from one to twenty:", "Name some colours:", "Tell me a story about a cat:"]
GREEDY = {"max_new_tokens": 48, "temperature": 0.0, "ignore_eos": True}


@pytest.fixture(scope="module")
def eng(model_path: str) -> Iterator[rlgen.Engine]:
    with stepped_engine(model_path) as engine:
        yield engine


@pytest.fixture(scope="module")
def reference(eng: rlgen.Engine) -> rlgen.Rollouts:
    """The same requests without a job or a push (the CPU backend is deterministic when greedy)."""
    return eng.generate(PROMPTS, **GREEDY)


@pytest.fixture(scope="module")
def trainer(model_path: str) -> Any:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.bfloat16)


def wait_streamed(job: GenerationJob, tokens: int, *, timeout: float = 60.0) -> None:
    """Wait until every request in flight has streamed `tokens` tokens (or is answered)."""
    run, deadline = job._run, time.monotonic() + timeout
    while time.monotonic() < deadline:
        if run.live and all(run.received.get(rid, 0) >= tokens for rid in run.live):
            return
        time.sleep(0.01)
    raise AssertionError(f"the job's requests did not stream {tokens} tokens in {timeout} s: {run.received}")


def idle(eng: rlgen.Engine, *, within: float = 10.0) -> bool:
    """Whether the server reports no running request within `within` seconds (its count is taken
    at its scheduler's steps, so it may lag the last answer)."""
    deadline = time.monotonic() + within
    while True:
        with urllib.request.urlopen(eng.url + "/v1/loads", timeout=10) as response:
            running = sum(int(x.get("num_running_reqs") or 0) for x in json.loads(response.read())["loads"])
        if running == 0:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)


def sampled(eng: rlgen.Engine) -> int:
    """Tokens the server has sampled so far, by its own count (every answer's output ids, aborted ones too)."""
    df = eng.metrics()
    return int(df[df.name == "sglang:generation_tokens_total"].value.sum())


def in_thread(fn: Any, *args: Any, **kwargs: Any) -> tuple[threading.Thread, list[Any]]:
    out: list[Any] = []

    def run() -> None:
        try:
            out.append(fn(*args, **kwargs))
        except BaseException as err:  # handed to the test
            out.append(err)

    thread = threading.Thread(target=run)
    thread.start()
    return thread, out


def check_counts(res: rlgen.Rollouts) -> None:
    """Every token has a version; the tokens by version add up to the tokens sampled; each row's
    versions never go back; the columns agree with the tensor."""
    versions, mask = res.versions, res.response_mask
    assert versions is not None and versions.dtype == torch.int64
    assert bool((versions[~mask] == -1).all()) and bool((versions[mask] >= 0).all())
    by_version = torch.bincount(versions[mask])
    assert int(by_version.sum()) == int(res.df.completion_tokens.sum()) == res.n_tokens
    for i, row in res.df.iterrows():
        row_versions = versions[i, : row.completion_tokens].tolist()
        assert row_versions == sorted(row_versions)
        assert (row.version_min, row.version_max) == (min(row_versions), max(row_versions))


def same_as_reference(res: rlgen.Rollouts, reference: rlgen.Rollouts, tok: Any) -> None:
    """No token lost, none sampled twice: the ids and texts of the same greedy requests without a push."""
    assert res.id_lists() == reference.id_lists()
    assert res.df.completion.tolist() == reference.df.completion.tolist()
    for ids, text in zip(res.id_lists(), res.df.completion):
        assert tok.decode(ids, skip_special_tokens=True) == text
    assert torch.allclose(res.logprobs, reference.logprobs, atol=1e-3)


@pytest.mark.timeout(300)
def test_a_job_returns_at_once_and_without_a_push_equals_generate(eng: rlgen.Engine, reference: rlgen.Rollouts,
                                                                  tok: Any) -> None:
    started = time.perf_counter()
    job = eng.submit(PROMPTS, **GREEDY)
    assert time.perf_counter() - started < 1.0 and job.state == "running" and not job.done()
    res = job.result(timeout=120)
    assert job.done() and job.state == "done" and job.progress.done == job.progress.total == 3
    same_as_reference(res, reference, tok)
    check_counts(res)
    assert res.df.n_segments.tolist() == [1, 1, 1] and set(res.df.kv_staleness) == {"fresh"}
    assert res.df.prompt_index.tolist() == [0, 1, 2] and set(res.df.staleness) == {0}
    assert "done" in repr(job) and "<progress" in job._repr_html_()
    assert reference.versions is not None and set(reference.versions[reference.response_mask].tolist()) == {
        eng.version_index}  # a generate() result has versions too
    assert job.result().df.empty  # every group was handed over


@pytest.mark.timeout(300)
def test_result_without_min_done_returns_only_once_the_job_is_done(eng: rlgen.Engine,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """The last answer comes in a moment before the run ends (its sender closes after): a slow close
    makes that moment long, and result() still returns with done() true (CI once saw it false)."""
    from rlgen.client._sender import Sender

    close = Sender.close

    async def slow_close(self: Sender) -> None:
        await asyncio.sleep(0.5)
        await close(self)

    monkeypatch.setattr(Sender, "close", slow_close)
    job = eng.submit(PROMPTS[:1], max_new_tokens=4, temperature=0.0, ignore_eos=True)
    job.result(timeout=120)
    assert job.done() and job.state == "done"


@pytest.mark.timeout(300)
def test_a_push_from_another_thread_continues_every_sample_without_losing_or_repeating_a_token(
        eng: rlgen.Engine, reference: rlgen.Rollouts, tok: Any, model_path: str) -> None:
    before, server_count = eng.version_index, sampled(eng)
    job = eng.submit(PROMPTS, **GREEDY)
    wait_streamed(job, 1)
    time.sleep(0.2)
    thread, out = in_thread(eng.update_weights_from_disk, model_path, weight_version="same-weights")
    thread.join(120)
    assert out == ["same-weights"] and eng.version_index == before + 1
    res = job.result(timeout=120)
    same_as_reference(res, reference, tok)
    check_counts(res)
    assert sampled(eng) - server_count == res.n_tokens  # the server sampled each token once: none twice
    assert (res.df.n_segments >= 2).all(), res.df.n_segments  # each was in flight: aborted, then continued
    assert set(res.df.version_min) == {before} and set(res.df.version_max) == {before + 1}
    assert set(res.df.kv_staleness) == {"fresh"} and set(res.df.staleness) == {1}
    assert res.df.finish_reason.tolist() == ["length"] * 3
    segments = [m["segments"] for m in res.meta_info]
    assert all(s[-1]["weight_version"] == "same-weights" for s in segments)
    assert res.record["weight_version_labels"][-1] == "same-weights"


@pytest.mark.timeout(300)
@pytest.mark.parametrize("mode", ["in_place", "retract"])
def test_in_place_and_retract_label_what_streamed_before_the_push_old_and_the_rest_new(
        eng: rlgen.Engine, reference: rlgen.Rollouts, tok: Any, trainer: Any, mode: str) -> None:
    before, server_count = eng.version_index, sampled(eng)
    job = eng.submit(PROMPTS, **GREEDY, sampling_params={"stream_interval": 1})
    wait_streamed(job, 8)
    eng.update_weights(trainer, pause=mode)  # the same weights, pushed
    res = job.result(timeout=120)
    same_as_reference(res, reference, tok)
    check_counts(res)
    assert sampled(eng) - server_count == res.n_tokens
    assert res.df.n_segments.tolist() == [1, 1, 1]  # one request each, in flight across the push
    old = (res.versions == before).sum(dim=1)
    assert ((old >= 8) & (old < 48)).all(), old  # at least what had streamed; the rest the new version
    assert set(res.df.version_max) == {before + 1}
    assert set(res.df.kv_staleness) == {"old_kv" if mode == "in_place" else "old_prefix"}
    if mode == "retract":
        assert (res.df.num_retractions >= 1).all()
    eng.flush_cache()  # the prefix cache kept old-weight prefixes; the next test starts clean
    assert not eng._pauses.old_prefixes


@pytest.mark.timeout(300)
def test_a_push_that_fails_mid_job_continues_the_server_and_the_job_with_the_old_weights(
        eng: rlgen.Engine, reference: rlgen.Rollouts, tok: Any, trainer: Any) -> None:
    before, epoch = eng.version_index, eng._pauses.epoch
    job = eng.submit(PROMPTS, **GREEDY)
    wait_streamed(job, 1)
    with pytest.raises(rlgen.WeightsError):  # refused before anything is sent: no pause at all
        eng.update_weights({"model.no_such_layer.weight": torch.zeros(2)})
    assert eng._pauses.epoch == epoch
    with pytest.raises(rlgen.ServerRequestError):  # refused by the server: paused, then continued
        eng.update_weights_from_disk("/no/such/checkpoint")
    assert eng._pauses.epoch == epoch + 1 and not eng._pauses.paused and eng.version_index == before
    res = job.result(timeout=120)
    same_as_reference(res, reference, tok)
    check_counts(res)
    assert set(res.versions[res.response_mask].tolist()) == {before}  # the old weights sampled everything


@pytest.mark.timeout(300)
def test_ctrl_c_during_a_paused_push_leaves_the_server_continued_and_the_engine_usable(
        eng: rlgen.Engine, reference: rlgen.Rollouts, tok: Any, model_path: str, monkeypatch: pytest.MonkeyPatch
        ) -> None:
    def interrupted(*args: Any, **kwargs: Any) -> Any:
        assert eng._pauses.paused  # inside the pause
        raise KeyboardInterrupt

    before = eng.version_index
    job = eng.submit(PROMPTS, **GREEDY)
    wait_streamed(job, 1)
    monkeypatch.setattr(_weights, "_post_retried", interrupted)
    with pytest.raises(KeyboardInterrupt):
        eng.update_weights_from_disk(model_path)
    monkeypatch.undo()
    assert not eng._pauses.paused and eng.version_index == before
    thread, out = in_thread(eng.generate, PROMPTS[:1], max_new_tokens=4, temperature=0.0)
    thread.join(60)
    assert out and isinstance(out[0], rlgen.Rollouts), "the server is still paused"  # continued
    res = job.result(timeout=120)
    same_as_reference(res, reference, tok)
    assert idle(eng)


@pytest.mark.timeout(300)
def test_requests_a_pause_turns_away_with_499_are_sent_again(eng: rlgen.Engine, reference: rlgen.Rollouts,
                                                             tok: Any) -> None:
    assert post(eng.url + "/pause_generation", {"mode": "abort"})[0] == 200  # another client pauses the server
    try:
        job = eng.submit(PROMPTS, **GREEDY)
        time.sleep(0.5)  # its requests wait at the server's gate
        assert job.progress.tokens == 0 and not job._run.received
        assert post(eng.url + "/pause_generation", {"mode": "abort"})[0] == 200  # ...which turns them away: 499
    finally:
        assert post(eng.url + "/continue_generation", {})[0] == 200
    res = job.result(timeout=120)
    assert len(job._run.sender.batches) >= 2, job._run.sender.batches  # sent again
    same_as_reference(res, reference, tok)
    assert res.df.n_segments.tolist() == [1, 1, 1]  # a request turned away sampled nothing: no segment


@pytest.mark.timeout(300)
def test_min_done_hands_over_whole_groups_and_the_rest_later_or_recycled_into_the_next_job(
        eng: rlgen.Engine, reference: rlgen.Rollouts, tok: Any, model_path: str) -> None:
    one_at_a_time = {"chunk_size": 1, "max_in_flight": 1}
    job = eng.submit(PROMPTS, **GREEDY, **one_at_a_time)
    first = job.result(timeout=120, min_done=0.3)  # one group of three
    eng.update_weights_from_disk(model_path)  # one sample in flight, one waiting for its place
    rest = job.result(timeout=120)
    assert 1 <= len(first) < 3 and len(first) + len(rest) == 3
    both = rlgen.Rollouts.concat([first, rest])
    assert sorted(both.df.prompt_index) == [0, 1, 2] and set(both.df.run) == {first.df.run[0]}
    both = both[list(np.argsort(both.df.prompt_index.to_numpy()))]
    assert both.id_lists() == reference.id_lists()
    check_counts(both)
    assert both.df.n_segments.tolist()[-1] == 1 and both.df.version_min.tolist()[-1] == eng.version_index

    job = eng.submit(PROMPTS, **GREEDY, **one_at_a_time)
    first = job.result(timeout=120, min_done=0.3, rest="recycle")
    assert job.partial is not None and len(job.partial) == 3 - len(first)
    assert job.result().df.empty  # nothing left to hand over: the rest were recycled
    eng.update_weights_from_disk(model_path)  # a training step between the two jobs
    rest = eng.submit(job.partial).result(timeout=120)
    joined = sorted([*zip(first.df.prompt, first.id_lists()), *zip(rest.df.prompt, rest.id_lists())])
    assert joined == sorted(zip(reference.df.prompt, reference.id_lists()))
    check_counts(rest)
    carried = rest.df[rest.df.version_min < rest.df.version_max]
    assert (carried.staleness >= 1).all()  # tokens sampled before the step are one version old


@pytest.mark.timeout(300)
def test_cancel_keeps_every_token_sampled_and_leaves_the_server_idle(eng: rlgen.Engine, tok: Any) -> None:
    job = eng.submit(PROMPTS, max_new_tokens=400, temperature=0.0, ignore_eos=True,
                     sampling_params={"stream_interval": 1})
    wait_streamed(job, 5)
    job.cancel()
    assert job.state == "cancelled" and job.done()
    res = job.result()
    assert res.df.finish_reason.tolist() == ["abort"] * 3 and (res.df.completion_tokens >= 5).all()
    for ids, text in zip(res.id_lists(), res.df.completion):
        assert tok.decode(ids, skip_special_tokens=True) == text
    check_counts(res)
    assert idle(eng)


@pytest.mark.timeout(120)
def test_releasing_the_memory_while_a_job_runs_is_refused_and_the_job_is_untouched(eng: rlgen.Engine) -> None:
    job = eng.submit(PROMPTS, max_new_tokens=400, temperature=0.0, ignore_eos=True,
                     sampling_params={"stream_interval": 1})
    wait_streamed(job, 2)  # running (a job that ended is no longer in the way)
    with pytest.raises(rlgen.EngineError, match="background job"):
        eng.release_memory()
    with pytest.raises(rlgen.EngineError, match="background job"), eng.paused():
        pass
    assert not job.done()
    job.cancel()
    check_counts(job.result())
    assert idle(eng)


@pytest.mark.timeout(300)
def test_bad_inputs_are_refused_before_anything_is_sent(eng: rlgen.Engine, model_path: str) -> None:
    epoch, version = eng._pauses.epoch, eng.version_index
    with pytest.raises(TypeError, match="max_new_token"):
        eng.submit(PROMPTS, max_new_token=3)
    with pytest.raises(ValueError, match="stream"):
        eng.submit(PROMPTS, stream=True)
    with pytest.raises(ValueError, match="cache"):
        eng.submit(PROMPTS, cache=True)
    with pytest.raises(ValueError, match="pause"):
        eng.update_weights_from_disk(model_path, pause="inplace")
    with pytest.raises(ValueError, match="pause"):
        eng.load_adapter("policy", model_path, pause="in_place")
    job = eng.submit(PROMPTS[:1], max_new_tokens=2, temperature=0.0)
    for bad in (0, 1.5, -1):
        with pytest.raises(ValueError, match="min_done"):
            job.result(min_done=bad)
    with pytest.raises(ValueError, match="rest"):
        job.result(rest="hand_back")
    with pytest.raises(ValueError, match="min_done"):
        job.result(rest="recycle")
    assert len(job.result(timeout=60)) == 1  # the refusals stopped nothing
    assert (eng._pauses.epoch, eng.version_index) == (epoch, version)


@pytest.mark.timeout(240)
def test_reattaching_to_a_kept_server_a_dead_kernel_left_paused_continues_it(isolated: str, model_path: str) -> None:
    first = rlgen.Engine(model_path, backend="cpu", progress=False, keep_alive="60s")
    second = None
    try:
        # A kernel that died inside a paused update: the server stays paused, holding every request.
        first._control.post("/pause_generation", {"mode": "abort"}, what="pause")
        first.close()
        second = rlgen.Engine(model_path, backend="cpu", progress=False, keep_alive="60s")
        assert second.reattached
        thread, out = in_thread(second.generate, PROMPTS[:1], max_new_tokens=4, temperature=0.0)
        thread.join(60)
        assert out and isinstance(out[0], rlgen.Rollouts), "the reattached server is still paused"
    finally:
        (second or first).close(stop=True)


@pytest.mark.timeout(300)
def test_an_adapter_replaced_while_a_job_samples_with_it_pauses_and_the_job_goes_on(model_path: str,
                                                                                 tok: Any) -> None:
    peft = pytest.importorskip("peft")
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    adapter = peft.get_peft_model(base, peft.LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"],
                                                        init_lora_weights=False)).eval()
    lora = {"max_rank": 8, "target_modules": ["q_proj", "v_proj"]}
    with rlgen.Engine(model_path, backend="cpu", progress=False, lora=lora,
                      env={"RLGEN_CPU_STEP_DELAY": "0.02"}) as eng:
        eng.load_adapter("policy", adapter)
        reference = eng.generate(PROMPTS, **GREEDY, adapter="policy")
        before = eng.version_index
        job = eng.submit(PROMPTS, **GREEDY, adapter="policy")
        wait_streamed(job, 1)
        eng.load_adapter("policy", adapter)  # the same adapter again: a new load under the running job
        res = job.result(timeout=120)
        assert eng.version_index == before + 1
        same_as_reference(res, reference, tok)
        check_counts(res)
        assert (res.df.n_segments >= 2).all() and set(res.df.adapter) == {"policy"}
        assert set(res.df.version_min) == {before} and set(res.df.version_max) == {before + 1}


@pytest.mark.timeout(240)
def test_closing_the_engine_cancels_its_jobs_and_keeps_what_they_sampled(model_path: str, tok: Any) -> None:
    eng = rlgen.Engine(model_path, backend="cpu", progress=False, env={"RLGEN_CPU_STEP_DELAY": "0.02"})
    try:
        job = eng.submit(PROMPTS[:2], max_new_tokens=400, temperature=0.0, ignore_eos=True,
                         sampling_params={"stream_interval": 1})
        wait_streamed(job, 3)
    finally:
        eng.close()
    assert job.state == "cancelled" and job.done()
    res = job.result()
    assert res.df.finish_reason.tolist() == ["abort"] * 2 and (res.df.completion_tokens >= 3).all()
    assert [tok.decode(ids, skip_special_tokens=True) for ids in res.id_lists()] == res.df.completion.tolist()
