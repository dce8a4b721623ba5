"""rlgen.Engine on the CPU backend: lifecycle, server control, and generate() end to end.

Real server processes and real HTTP; every test that starts one has a timeout, and the module
checks that no server outlives its test.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from pathlib import Path

import psutil
import pytest
import torch

import rlgen

CAPITAL = [{"role": "user", "content": "What is the capital of France?"}]
# The generate tests run against the CPU backend (CI) or, with RLGEN_TEST_BACKEND=sglang on the GPU
# machine, against real SGLang; the lifecycle tests that inject faults need the CPU backend.
BACKEND = os.environ.get("RLGEN_TEST_BACKEND", "cpu")
cpu_only = pytest.mark.skipif(BACKEND != "cpu", reason="fault injection and process tests use the CPU backend")


# Servers inherit this marker from the test process, so other users' servers on the machine are
# never mistaken for ours.
SESSION_MARKER = os.environ.setdefault("RLGEN_TEST_SESSION", uuid.uuid4().hex)


def _server_pids() -> set[int]:
    pids = set()
    for proc in psutil.process_iter(["pid", "cmdline"]):
        cmd = " ".join(proc.info["cmdline"] or [])
        if ("rlgen.cpu_server" in cmd or "sglang.launch_server" in cmd) and "--port" in cmd:
            try:
                if proc.environ().get("RLGEN_TEST_SESSION") == SESSION_MARKER:
                    pids.add(proc.info["pid"])
            except psutil.Error:
                continue
    return pids


@pytest.fixture(autouse=True)
def no_new_servers_left_behind(request):
    before = _server_pids()
    yield
    if "engine" in request.fixturenames:
        return  # the module-scoped engine lives on; checked when the module ends
    deadline = time.monotonic() + 10
    while _server_pids() - before and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _server_pids() - before == set(), "a server process outlived its test"


@pytest.fixture(scope="module")
def engine(model_path: str):
    before = _server_pids()
    eng = rlgen.Engine(model_path, backend=BACKEND, progress=False, enable_memory_saver=True)
    yield eng
    eng.close()
    assert _server_pids() - before == set()


def cpu_engine(model_path: str, **kwargs) -> rlgen.Engine:
    return rlgen.Engine(model_path, backend="cpu", progress=False, **kwargs)


# ---------------------------------------------------------------------------------------------
# Lifecycle


@cpu_only
@pytest.mark.timeout(120)
def test_with_block_starts_the_server_and_stops_it_on_exit(model_path: str) -> None:
    with cpu_engine(model_path) as eng:
        pid = eng.info["pid"]
        assert eng.state is rlgen.EngineState.READY and psutil.pid_exists(pid)
        assert pid in _server_pids()  # the leftover guard sees our servers (it is not vacuous)
        assert os.path.isfile(eng.log_path)
    assert eng.state is rlgen.EngineState.CLOSED
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


@cpu_only
@pytest.mark.timeout(120)
def test_close_is_idempotent_and_a_closed_engine_says_to_create_a_new_one(model_path: str) -> None:
    eng = cpu_engine(model_path)
    eng.close()
    eng.close()
    with pytest.raises(rlgen.EngineClosedError, match="create a new one"):
        eng.generate("Hi", max_new_tokens=1)
    with pytest.raises(rlgen.EngineClosedError), eng:
        pass


@cpu_only
@pytest.mark.timeout(120)
def test_the_tokenizer_loads_while_the_server_starts_and_its_failure_stops_the_server(
    model_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import rlgen.engine._startup as startup_module

    loading: dict[str, float] = {}

    def failing_load(path: object) -> object:
        loading["started"] = time.monotonic()
        raise rlgen.EngineError("cannot load the tokenizer (test)")

    monkeypatch.setattr(startup_module, "load_tokenizer", failing_load)
    t0 = time.monotonic()
    with pytest.raises(rlgen.EngineError, match="tokenizer"):
        cpu_engine(model_path)
    assert loading["started"] - t0 < 1.0  # it began with the launch, not after the server was up
    # the autouse guard then checks that no server process outlived the failed start


@pytest.mark.timeout(180)
def test_connect_attaches_to_a_running_server_and_close_never_kills_it(engine) -> None:
    other = rlgen.Engine.connect(engine.url, progress=False)
    assert other.backend == "remote" and other.info["pid"] is None
    assert other.generate("Hi", max_new_tokens=2, ignore_eos=True).df.completion_tokens.tolist() == [2]
    other.close()
    assert engine.generate("Hi", max_new_tokens=2, ignore_eos=True).df.completion_tokens.tolist() == [2]


@cpu_only
@pytest.mark.timeout(180)
def test_two_engines_run_side_by_side_on_different_ports(engine, model_path: str) -> None:
    with cpu_engine(model_path) as second:
        assert second.info["port"] != engine.info["port"]
        a = engine.generate("Hi", max_new_tokens=3, temperature=0)
        b = second.generate("Hi", max_new_tokens=3, temperature=0)
        assert a.df.completion.tolist() == b.df.completion.tolist()


@cpu_only
@pytest.mark.timeout(120)
def test_a_server_that_dies_mid_request_raises_server_died_with_the_log(model_path: str) -> None:
    eng = cpu_engine(model_path, env={"RLGEN_CPU_FAULT": "die_mid_request"})
    try:
        with pytest.raises(rlgen.ServerDiedError) as info:
            eng.generate("Hi", max_new_tokens=4)
        assert info.value.exit_code == 13 and info.value.log_path
        assert eng.state is rlgen.EngineState.FAILED
        with pytest.raises(rlgen.ServerDiedError):
            eng.generate("Hi", max_new_tokens=1)
    finally:
        eng.close()


@cpu_only
@pytest.mark.timeout(60)
def test_a_failing_start_raises_within_seconds_with_a_hint_and_the_log_tail(model_path: str) -> None:
    t0 = time.monotonic()
    with pytest.raises(rlgen.ServerStartupError) as info:
        cpu_engine(model_path, env={"RLGEN_CPU_FAULT": "die_at_start"})
    assert time.monotonic() - t0 < 30
    err = info.value
    assert err.exit_code == 1 and "out of memory" in err.log_tail.lower() and err.hint
    assert "see log at" in str(err)


@cpu_only
@pytest.mark.timeout(60)
def test_killing_the_owner_process_takes_the_server_with_it(model_path: str, tmp_path) -> None:
    script = textwrap.dedent(f"""
        import rlgen, time
        eng = rlgen.Engine({model_path!r}, backend="cpu", progress=False)
        print(eng.info["pid"], flush=True)
        time.sleep(600)
    """)
    owner = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        server_pid = int(owner.stdout.readline())
        assert psutil.pid_exists(server_pid)
        owner.send_signal(signal.SIGKILL)  # a kernel killed outright: no atexit, no finalizers
        owner.wait(10)
        psutil.wait_procs([psutil.Process(server_pid)], timeout=15)
        assert not psutil.pid_exists(server_pid)
    finally:
        owner.kill()
        owner.wait()


def test_info_repr_and_html_show_the_state(engine) -> None:
    info = engine.info
    assert info["backend"] == BACKEND and info["state"] == "ready" and info["model"] == rlgen.DEFAULT_MODEL
    assert info["context_length"] == 8192 and info["server_version"]
    if BACKEND == "cpu":  # no GPU: no driver count, and the CPU backend keeps no SGLang memory account
        assert info["gpu_memory_per_gpu"] is None and info["memory_usage"] is None
    else:  # SGLang's account: one data-parallel rank holding the weights and a KV cache
        assert len(info["memory_usage"]) == 1 and info["memory_usage"][0]["weight"] > 0
    assert "state=ready" in repr(engine) and f"pid={info['pid']}" in repr(engine)
    html = engine._repr_html_()
    assert "ready" in html and str(info["port"]) in html


# ---------------------------------------------------------------------------------------------
# Server control


def test_update_weights_from_disk_returns_the_new_version_and_rows_carry_it(engine) -> None:
    version = engine.update_weights_from_disk(engine.model_path, weight_version="step-1")
    assert version == "step-1"
    assert engine.generate("Hi", max_new_tokens=1).df.weight_version.tolist() == ["step-1"]
    auto = engine.update_weights_from_disk(engine.model_path)
    assert auto != "step-1" and engine.generate("Hi", max_new_tokens=1).df.weight_version.tolist() == [auto]


def test_update_weights_from_a_bad_path_fails_at_once_without_retrying(engine) -> None:
    t0 = time.monotonic()
    with pytest.raises(rlgen.ServerRequestError, match="update_weights_from_disk"):
        engine.update_weights_from_disk("/nonexistent/checkpoint", retries=3, backoff_s=2)
    assert time.monotonic() - t0 < 2  # a 400 is not transient: no backoff sleeps


def test_paused_block_releases_and_resumes_with_unchanged_outputs(engine) -> None:
    before = engine.generate(CAPITAL, max_new_tokens=12, temperature=0)
    held_mib = engine.info["gpu_memory_mib"]
    with engine.paused():
        # The memory is really gone inside the block. The CPU backend refuses to generate then;
        # SGLang has no such check (its kernels would read unmapped memory), so there the GPU
        # memory its processes hold shows it.
        if BACKEND == "cpu":
            with pytest.raises(rlgen.ServerRequestError, match="memory is released"):
                engine.generate(CAPITAL, max_new_tokens=1)
        else:
            assert held_mib, "the server's GPU memory must be measurable for this check"
            assert engine.info["gpu_memory_mib"] < held_mib / 2
    # Both backends resume the weights' memory but not their values (greedy output was empty on
    # SGLang 0.5.17): equal outputs need resume_memory()'s reload from disk.
    after = engine.generate(CAPITAL, max_new_tokens=12, temperature=0)
    assert after.df.completion.tolist() == before.df.completion.tolist()
    assert after.df.weight_version.tolist() == before.df.weight_version.tolist()  # reloaded under its version


@pytest.mark.timeout(120)
def test_metrics_come_back_as_a_dataframe_when_enabled(model_path: str) -> None:
    with rlgen.Engine(model_path, backend=BACKEND, progress=False, enable_metrics=True) as eng:
        eng.generate(["Hi", "Yo"], max_new_tokens=3, ignore_eos=True)
        m = eng.metrics()
        assert list(m.columns) == ["name", "labels", "value"]
        generated = m[m.name == "sglang:generation_tokens_total"].value.sum()
        assert generated >= 6


@cpu_only
@pytest.mark.timeout(120)
def test_release_memory_needs_the_memory_saver_and_says_so(model_path: str) -> None:
    with cpu_engine(model_path) as eng:
        with pytest.raises(rlgen.EngineError, match="enable_memory_saver=True"):
            eng.release_memory()
        with pytest.raises(rlgen.EngineError, match="enable_metrics=True"):
            eng.metrics()


def test_flush_cache_empties_the_prefix_cache(engine) -> None:
    engine.generate(CAPITAL, max_new_tokens=1)
    again = engine.generate(CAPITAL, max_new_tokens=1)
    assert again.df.cached_tokens[0] > 0  # the prompt's prefix came from the cache
    engine.flush_cache()
    after = engine.generate(CAPITAL, max_new_tokens=1)
    assert after.df.cached_tokens.tolist() == [0]


# ---------------------------------------------------------------------------------------------
# generate()


def test_generate_returns_a_row_per_prompt_and_sample_in_order(engine) -> None:
    res = engine.generate(["Hi", "Name a colour."], n=3, max_new_tokens=5, temperature=1.0)
    df = res.df
    assert len(res) == 6
    assert df.prompt_index.tolist() == [0, 0, 0, 1, 1, 1] and df.sample_index.tolist() == [0, 1, 2] * 2
    assert df.prompt.tolist() == ["Hi"] * 3 + ["Name a colour."] * 3
    t = res.tensors()
    assert t["response_ids"].shape[0] == 6
    assert t["lengths"].tolist() == df.completion_tokens.tolist()
    assert (t["logprobs"][~t["response_mask"]] == 0).all()


def test_generate_does_not_ask_the_tokenizer_its_length_on_every_call(engine, monkeypatch) -> None:
    # tokenizers 0.22 (the GPU machine's) rebuilds the vocabulary for len(): 10 ms a call, measured
    # there as 17 ms of rlgen's 45 ms outside the server on workload a (bench, 2026-11-30).
    def no_len(self) -> int:
        raise AssertionError("len(tokenizer) called in generate()")

    monkeypatch.setattr(type(engine.tokenizer), "__len__", no_len)
    res = engine.generate([[1, 2, 3]], max_new_tokens=2)
    assert len(res) == 1
    with pytest.raises(ValueError, match="outside the vocabulary"):
        engine.generate([[engine._conn.vocab_size]], max_new_tokens=2)


@pytest.mark.xfail(BACKEND == "sglang", strict=False, reason=(
    "seen on the GPU machine's SGLang 0.5.17 bundle (triton attention), 2026-11-30: a greedy answer "
    "computed with a cold prefix cache was \"L'Étoile, la Marseillaise...\", with the prefix cached \"Paris\""))
def test_greedy_chat_generation_answers_paris_and_is_deterministic(engine) -> None:
    a = engine.generate(CAPITAL, max_new_tokens=24, temperature=0)
    b = engine.generate(CAPITAL, max_new_tokens=24, temperature=0)
    assert "Paris" in a.df.completion[0]
    assert a.df.completion.tolist() == b.df.completion.tolist()
    assert a.df.finish_reason[0] == "stop"


def test_generate_works_inside_a_running_event_loop(engine) -> None:
    async def cell():
        return engine.generate("Hi", max_new_tokens=2, ignore_eos=True)

    assert asyncio.run(cell()).df.completion_tokens.tolist() == [2]


def test_generate_keeps_working_where_nest_asyncio_was_applied(engine) -> None:
    nest_asyncio = pytest.importorskip("nest_asyncio")
    loop = asyncio.new_event_loop()
    try:
        nest_asyncio.apply(loop)

        async def cell():
            return engine.generate("Hi", max_new_tokens=2, ignore_eos=True)

        assert loop.run_until_complete(cell()).df.completion_tokens.tolist() == [2]
    finally:
        loop.close()


def test_agenerate_can_be_awaited(engine) -> None:
    async def cell():
        return await engine.agenerate(["Hi", "Yo"], max_new_tokens=2, ignore_eos=True)

    assert asyncio.run(cell()).df.completion_tokens.tolist() == [2, 2]


def test_generate_from_several_threads_at_once(engine) -> None:
    results: dict[int, list[int]] = {}

    def worker(i: int) -> None:
        results[i] = engine.generate([[1, 2, 3 + i]], max_new_tokens=3, ignore_eos=True).df.completion_tokens.tolist()

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert results == {i: [3] for i in range(4)}


def test_many_prompts_go_in_chunks_and_every_one_gets_its_row(engine) -> None:
    prompts = [f"Number {i}:" for i in range(40)]
    res = engine.generate(prompts, max_new_tokens=1, ignore_eos=True, chunk_size=16)
    assert res.df.prompt.tolist() == prompts
    assert res.df.completion_tokens.tolist() == [1] * 40


def test_without_a_chunk_size_a_call_is_split_into_about_16_requests_of_at_most_256_prompts(engine) -> None:
    assert engine._prepare(["a"] * 40, {}).job.chunk_size == 3      # 14 requests: progress in 14 steps
    assert engine._prepare(["a"] * 3, {"n": 8}).job.chunk_size == 1  # one request per prompt and its 8 samples
    assert engine._prepare(["a"] * 10_000, {}).job.chunk_size == 256
    assert engine._prepare(["a"] * 40, {"chunk_size": 40}).job.chunk_size == 40  # a chunk_size given wins


def test_a_generate_call_reports_progress_per_answered_request_and_ends_with_its_totals(engine, capfd) -> None:
    from rlgen.core._progress import ProgressLine

    seen: list[tuple[int, int]] = []
    original = ProgressLine.advance

    def spy(self, count=1, tokens=0):
        seen.append((count, tokens))
        original(self, count, tokens=tokens)

    ProgressLine.advance = spy  # type: ignore[method-assign]
    try:
        engine.generate(["a", "b", "c", "d"], n=2, max_new_tokens=3, ignore_eos=True, progress=True)
    finally:
        ProgressLine.advance = original  # type: ignore[method-assign]
    assert sorted(seen) == [(2, 6)] * 4  # one request per prompt (2 samples, 6 tokens each)
    assert "generate: 8 samples · 24 tokens ·" in capfd.readouterr().err


def test_a_call_of_one_large_request_still_moves_its_progress_line_from_the_server_s_load(engine, monkeypatch) -> None:
    # Before: "0/4 samples" with an empty bar for the whole call, then done (nothing else moved).
    import time as _time

    from rlgen.client import _generate
    from rlgen.core._progress import ProgressLine

    monkeypatch.setattr(_generate, "LOAD_POLL_S", 0.2)
    notes: list[tuple[float, str]] = []
    original = ProgressLine.set_note

    def spy(self, note):
        notes.append((_time.monotonic(), note))
        original(self, note)

    monkeypatch.setattr(ProgressLine, "set_note", spy)
    # Long enough for several load polls: 96 tokens take seconds on the CPU backend, but SGLang on an
    # H200 finished them in one 0.2 s poll (docs/gpu/2026-12-03m): there it is 2,048.
    tokens = 2048 if BACKEND == "sglang" else 96
    engine.generate(["a", "b", "c", "d"], max_new_tokens=tokens, ignore_eos=True, chunk_size=4, progress=True)
    used = [int(n.split(" · ")[1].split(" ")[0].replace(",", "")) for _, n in notes if "running" in n]
    assert len(used) >= 2, notes  # the line moved while the one request ran
    assert used[-1] > used[0], notes  # by the tokens generated so far
    assert all(b - a < 2.0 for (a, _), (b, _) in itertools.pairwise(notes))


def test_a_score_call_ends_with_rows_and_seconds_not_a_token_rate(engine, capfd) -> None:
    engine.score(["a", "b"], ["x", "y"], progress=True)
    last = capfd.readouterr().err.strip().splitlines()[-1]
    assert re.fullmatch(r"score: 2 rows · [\d.]+ s", last.split("\r")[-1].strip()), last


def test_by_default_enough_chunks_go_out_at_once_to_fill_the_batch_the_server_runs(engine) -> None:
    capacity = engine.server_info["internal_states"][0]["effective_max_running_requests_per_dp"]
    assert isinstance(capacity, int) and capacity > 1  # SGLang and the CPU backend both report it
    job = engine._prepare(["a", "b"], {"chunk_size": 2, "n": 2}).job
    assert job.max_in_flight == -(-capacity // 4) + 1  # the whole running batch, plus one chunk queued
    job = engine._prepare(["a", "b"], {"chunk_size": 2, "max_in_flight": 3}).job
    assert job.max_in_flight == 3


@pytest.mark.timeout(120)
def test_ctrl_c_aborts_on_the_server_raises_promptly_and_keeps_the_engine_usable(engine) -> None:
    # The server's own count of requests (SGLang's /v1/loads; the CPU backend serves it too) shows
    # that they stopped there: the client fills in the aborted rows itself, so they cannot show it.
    def on_server() -> int:
        loads = rlgen.core._loop.run_sync(engine._client.get("/v1/loads", timeout=10))["loads"]
        return sum(load["num_running_reqs"] + load["num_waiting_reqs"] for load in loads)

    main = threading.main_thread().ident
    stopped_after: list[float] = []

    def interrupt_then_watch() -> None:
        deadline = time.monotonic() + 60
        while on_server() < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        sent = time.monotonic()
        signal.pthread_kill(main, signal.SIGINT)
        # Watched from this thread, so that the main thread's handling of the interrupt cannot
        # delay the first look.
        while time.monotonic() - sent < 10:
            if on_server() == 0:
                stopped_after.append(time.monotonic() - sent)
                return
            time.sleep(0.05)

    watcher = threading.Thread(target=interrupt_then_watch, daemon=True)
    watcher.start()
    t0 = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        engine.generate(["Tell me a long story."] * 2, max_new_tokens=4000, ignore_eos=True)
    assert time.monotonic() - t0 < 10
    watcher.join(15)
    # rlgen aborts them by rid at once; a server that is left to notice the dropped connection
    # does so only every 4 s (SGLang's tokenizer manager, and the CPU backend like it).
    assert stopped_after and stopped_after[0] < 2.0, f"still on the server after Ctrl-C: {stopped_after}"
    partial = engine.last_result
    assert len(partial) == 2 and set(partial.df.finish_reason) == {"abort"}
    t1 = time.monotonic()
    assert engine.generate("Hi", max_new_tokens=2, ignore_eos=True).df.completion_tokens.tolist() == [2]
    assert time.monotonic() - t1 < 10  # the aborted requests no longer occupy the server


def test_streaming_rows_get_time_to_first_token_and_inter_token_latency(engine) -> None:
    res = engine.generate(["Hi", "Yo"], max_new_tokens=6, ignore_eos=True, stream=True)
    df = res.df
    assert df.completion_tokens.tolist() == [6, 6]
    assert (df.ttft_s > 0).all() and (df.itl_s > 0).all()
    assert (df.ttft_s <= df.request_latency_s + 0.5).all()


def test_stream_yields_the_text_as_it_is_generated(engine) -> None:
    pieces = list(engine.stream(CAPITAL, max_new_tokens=16, temperature=0))
    full = engine.generate(CAPITAL, max_new_tokens=16, temperature=0).df.completion[0]
    assert len(pieces) > 1 and "".join(pieces) == full


@pytest.mark.parametrize("kwargs, error, match", [
    ({"temprature": 0.5}, TypeError, "did you mean 'temperature'"),
    ({"n": 0}, ValueError, "n must be an int >= 1"),
    ({"top_logprobs": -1}, ValueError, "top_logprobs must be an int >= 0"),
    ({"chunk_size": True}, ValueError, "chunk_size must be an int >= 1 or None"),
    ({"stop": [1]}, TypeError, "stop must contain only str values"),
    ({"frequency_penalty": 0.5}, TypeError, "sampling_params="),
    ({"temperature": -1}, ValueError, "temperature must be >= 0"),
    ({"top_p": 0}, ValueError, "top_p"),
    ({"max_new_tokens": 10_000}, ValueError, "context"),
    ({"max_in_flight": 0}, ValueError, "max_in_flight must be an int >= 1"),
])
def test_bad_options_raise_before_anything_is_sent(engine, kwargs, error, match) -> None:
    with pytest.raises(error, match=match):
        engine.generate("Hi", **kwargs)


def test_a_server_side_rejection_names_the_failing_prompt(engine) -> None:
    with pytest.raises(rlgen.ServerRequestError) as info:
        engine.generate(["a", "b", "c"], max_new_tokens=1, chunk_size=1, sampling_params={"frequency_penalty": 9.0})
    assert info.value.status == 400 and info.value.prompt_index is not None and re.match(r"prompts? \d", str(info.value))
    assert engine.generate("Hi", max_new_tokens=1).df.completion_tokens.tolist() == [1]


def test_score_returns_the_logprobs_of_given_completions(engine) -> None:
    res = engine.score([CAPITAL, CAPITAL], ["Paris is the capital of France.", "Banana banana banana."])
    good, bad = res.df.logprob_mean.tolist()
    assert good > bad
    assert res.tensors()["logprobs"].shape[0] == 2 and res.df.finish_reason.tolist() == ["score", "score"]


def test_rollout_logprobs_match_a_rescore_of_the_same_tokens(engine) -> None:
    rollouts = engine.generate(CAPITAL, n=2, max_new_tokens=16, temperature=1.0)
    report = engine.check_logprobs(rollouts)
    assert report.passed is True and report.verdict.startswith("passed"), report
    assert report.n_tokens == int(rollouts.df.completion_tokens.sum())
    # fp32 on the CPU: prefill and decode agree to float error. In bf16 a logit of ~20 is rounded
    # to steps of 0.125, so single tokens differ by a few tenths (0.30 seen on the H200); the mean
    # stays small. A misaligned comparison (off by one token) is off by nats, checked below.
    if BACKEND == "cpu":
        assert report.max_abs_diff < 1e-3 and report.max_diff == 1e-3, report
    else:
        assert report.mean_abs_diff < 0.05 and report.max_abs_diff < 1.0, report
    lp, mask = rollouts.logprobs, rollouts.response_mask
    shifted = torch.zeros_like(lp)
    shifted[:, :-1] = lp[:, 1:]
    both = torch.zeros_like(mask)
    both[:, :-1] = mask[:, :-1] & mask[:, 1:]
    misaligned = rlgen.compare_logprobs(shifted, lp, mask=both)
    assert misaligned["mean_abs_diff"] > 10 * max(report.mean_abs_diff, 1e-3), (misaligned, report)


def test_check_logprobs_says_rollouts_sampled_at_another_temperature_are_not_comparable(engine) -> None:
    rollouts = engine.generate(CAPITAL, n=2, max_new_tokens=4, temperature=0.3)
    report = engine.check_logprobs(rollouts)
    assert report.passed is None
    assert "not comparable: sampled at temperature 0.3; re-score compares raw logits" in repr(report)
    assert "not comparable" in report._repr_html_()


def test_greedy_rollouts_are_comparable_and_identical_samples_are_scored_once(engine, monkeypatch) -> None:
    rollouts = engine.generate(CAPITAL, n=4, max_new_tokens=8, temperature=0.0)
    sent: list[int] = []
    real = rlgen.engine._scoring.run_generate

    async def counting(client, job, **kwargs):
        sent.append(len(job.prompt_ids))
        return await real(client, job, **kwargs)

    monkeypatch.setattr(rlgen.engine._scoring, "run_generate", counting)
    assert engine.check_logprobs(rollouts).passed is True
    assert sent == [len(set(map(tuple, rollouts.id_lists("response"))))] == [1]


def test_score_of_rollouts_matches_the_sampled_logprobs_at_temperature_1_and_aligns_with_their_tensors(engine) -> None:
    rollouts = engine.generate(["Count: 1, 2,", "The capital of France is"], n=2, max_new_tokens=12, temperature=1.0)
    scored = engine.score(rollouts)
    t, s = rollouts.tensors(), scored.tensors()
    for name in ("prompt_ids", "prompt_mask", "response_ids", "response_mask", "logprobs"):
        assert s[name].shape == t[name].shape, name
    for name in ("prompt_ids", "prompt_mask", "response_ids", "response_mask"):
        assert torch.equal(s[name], t[name]), name
    mask = t["response_mask"]
    tol = 1e-3 if BACKEND == "cpu" else 1.0
    assert (s["logprobs"][mask] - t["logprobs"][mask]).abs().max() < tol
    assert (s["logprobs"][~mask] == 0).all() and scored.df.finish_reason.eq("score").all()


def test_a_text_completion_is_scored_without_the_eos_that_score_of_rollouts_includes(engine) -> None:
    rollouts = engine.generate(CAPITAL, max_new_tokens=64, temperature=0.0)
    assert rollouts.df.finish_reason[0] == "stop", "the greedy answer should end with EOS"
    ids = rollouts.id_lists("response")[0]
    eos = ids[-1]
    by_rollouts = engine.score(rollouts)
    by_text = engine.score(CAPITAL, [rollouts.df.completion[0]])
    assert by_rollouts.id_lists("response")[0] == ids
    assert eos not in by_text.id_lists("response")[0]
    with_eos = by_rollouts.df.logprob_sum[0]
    eos_lp = float(by_rollouts.logprobs[0, len(ids) - 1])
    if by_text.id_lists("response")[0] == ids[:-1]:  # the text re-tokenizes to the sampled ids
        assert abs(by_text.df.logprob_sum[0] - (with_eos - eos_lp)) < 1e-3
    with pytest.raises(ValueError, match="pass no completions"):
        engine.score(rollouts, ["x"])


def test_a_seed_with_n_gives_distinct_samples_that_a_rerun_reproduces(engine) -> None:
    if BACKEND != "cpu":
        with pytest.warns(UserWarning, match="enable_deterministic_inference"):
            engine.generate("Hi", max_new_tokens=2, seed=1)
        pytest.skip("SGLang honours sampling_seed only in deterministic mode (the user is warned, as checked)")
    a = engine.generate("Invent a name for a cat:", n=3, max_new_tokens=12, temperature=1.0, ignore_eos=True, seed=11)
    b = engine.generate("Invent a name for a cat:", n=3, max_new_tokens=12, temperature=1.0, ignore_eos=True, seed=11)
    assert a.df.completion.tolist() == b.df.completion.tolist()
    assert len(set(a.df.completion)) > 1


@cpu_only
@pytest.mark.timeout(120)
def test_a_new_engine_reaps_servers_left_by_a_dead_kernel(model_path: str, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("RLGEN_CACHE_DIR", str(tmp_path))  # a registry of this test's own
    script = textwrap.dedent(f"""
        import sys
        from rlgen.server._process import launch_server
        # as on a platform without a parent-death signal: only the registry knows about it
        srv = launch_server([sys.executable, "-m", "rlgen.cpu_server", "--model-path", {model_path!r}], _pdeathsig=False)
        print(srv.pid, flush=True)
        import time; time.sleep(600)
    """)
    owner = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        orphan = int(owner.stdout.readline())
        owner.kill()
        owner.wait(10)
        assert psutil.pid_exists(orphan)
        with pytest.warns(UserWarning, match=rf"stopped 1 server\(s\) whose kernel had died \(pid {orphan}\)"):
            eng = cpu_engine(model_path)
        eng.close()
        assert not psutil.pid_exists(orphan) or psutil.Process(orphan).status() == psutil.STATUS_ZOMBIE
    finally:
        owner.kill()
        owner.wait()


def test_each_row_of_a_batch_has_its_own_latency(engine) -> None:
    story = [{"role": "user", "content": "Tell me a long story about a dragon."}]
    res = engine.generate([CAPITAL, story], n=2, max_new_tokens=48, temperature=0)
    tokens, latency = res.df.completion_tokens.tolist(), res.df.request_latency_s.tolist()
    assert tokens[0] < tokens[2]  # the chat answer stops early, the story runs to max_new_tokens
    assert 0 < latency[0] < latency[2]


def test_per_prompt_data_joins_every_sample_of_its_prompt_and_chats_keep_their_messages(engine) -> None:
    chats = [[{"role": "user", "content": "Say A"}], [{"role": "user", "content": "Say B"}]]
    res = engine.generate(chats, n=2, max_new_tokens=1, data=[{"answer": "A"}, {"answer": "B"}])
    assert res.df["answer"].tolist() == ["A", "A", "B", "B"]
    assert res.df["prompt_messages"].tolist()[2] == chats[1]
    assert res[2:].df["answer"].tolist() == ["B", "B"]  # data follows selection
    with pytest.raises(ValueError, match="data has 1 rows for 2 prompts"):
        engine.generate(chats, max_new_tokens=1, data={"answer": ["A"]})


@pytest.mark.parametrize("name", ["completion", "reward", "advantage", "group_mean", "group_zero_std", "ttft_s"])
def test_data_columns_named_like_rlgen_s_own_are_refused_before_anything_is_sent(engine, name: str) -> None:
    # `reward`, `advantage`, `group_*` were accepted, then overwritten by add_rewards with a warning.
    with pytest.raises(ValueError, match=rf"\['{name}'\] would replace rlgen's own.*Names rlgen writes itself: .*advantage"):
        engine.generate(["hi"], max_new_tokens=1, data={name: [1]})


@cpu_only
@pytest.mark.timeout(180)
def test_a_server_with_an_api_key_refuses_requests_without_it_and_the_engine_sends_it(model_path: str) -> None:
    import urllib.error
    import urllib.request

    # A key that starts with "-" (1 in 64 of secrets.token_urlsafe's): sent as "--api-key -..." the
    # server's argparse read it as a missing value and exited (seen in CI).
    with cpu_engine(model_path, api_key="-s3cret-key") as eng:
        assert eng.generate("Hi", max_new_tokens=2, ignore_eos=True).df.completion_tokens.tolist() == [2]
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(eng.url + "/server_info", timeout=10)
        assert refused.value.code == 401
        assert urllib.request.urlopen(eng.url + "/health", timeout=10).status == 200  # as SGLang: health is open
        with pytest.raises(rlgen.ServerRequestError, match=r"HTTP 401.*api_key="):
            rlgen.Engine.connect(eng.url, progress=False)
        other = rlgen.Engine.connect(eng.url, progress=False, api_key="-s3cret-key")
        assert other.generate("Hi", max_new_tokens=1).df.completion_tokens.tolist() == [1]
        other.close()
        assert "s3cret-key" not in Path(eng.log_path).read_text()
        assert all("s3cret-key" not in " ".join(r["argv"]) for r in rlgen.list_servers())


@cpu_only
@pytest.mark.timeout(120)
def test_a_server_bound_beyond_loopback_gets_a_generated_api_key_and_refuses_requests_without_it(
        model_path: str) -> None:
    import urllib.error
    import urllib.request

    with cpu_engine(model_path, host="0.0.0.0") as eng:
        assert eng.api_key is not None and re.fullmatch(r"[0-9a-f]{48}", eng.api_key)
        assert eng.generate("Hi", max_new_tokens=2, ignore_eos=True).df.completion_tokens.tolist() == [2]
        body = json.dumps({"text": "Hi", "sampling_params": {"max_new_tokens": 1}}).encode()
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(urllib.request.Request(eng.url + "/generate", data=body), timeout=10)
        assert refused.value.code == 401
        assert eng.api_key not in Path(eng.log_path).read_text()
    with cpu_engine(model_path) as local:  # loopback, the default: no key unless asked for
        assert local.api_key is None
