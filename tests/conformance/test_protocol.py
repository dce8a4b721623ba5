"""SGLang native HTTP API conformance: the subset rlgen uses, checked on the wire.

The same tests run against rlgen's CPU backend (CI) and a real SGLang 0.5.x server (GPU machine);
see conftest.py for how the target is chosen. Where the two may legitimately differ (numerics of
bf16 on a GPU vs fp32 on a CPU) the test says so and checks only what must hold on both.
"""

from __future__ import annotations

import itertools
import json
import math
import threading
import time
import uuid

import pytest

pytestmark = [pytest.mark.conformance, pytest.mark.timeout(600)]

CAPITAL = "What is the capital of France?"
GREEDY = {"temperature": 0.0}
LONG = 8000  # max_new_tokens for requests that must still be running when aborted (context is 8192)
META_KEYS = {"id", "finish_reason", "prompt_tokens", "completion_tokens", "cached_tokens", "e2e_latency", "weight_version"}


def _assert_sample_shape(entry: dict) -> None:
    assert set(entry) >= {"text", "output_ids", "meta_info"}, sorted(entry)
    assert isinstance(entry["text"], str)
    assert all(isinstance(t, int) for t in entry["output_ids"])
    meta = entry["meta_info"]
    assert set(meta) >= META_KEYS, sorted(META_KEYS - set(meta))
    assert meta["finish_reason"]["type"] in {"stop", "length", "abort"}
    assert meta["completion_tokens"] == len(entry["output_ids"])
    assert isinstance(meta["e2e_latency"], float) and meta["e2e_latency"] > 0
    assert isinstance(meta["weight_version"], str)


# ---------------------------------------------------------------------------------------------
# Info and health


def test_health_and_health_generate_answer_200(target) -> None:
    assert target.get("/health")[0] == 200
    assert target.get("/health_generate")[0] == 200


def test_model_info_names_the_model_and_weight_version(target) -> None:
    status, info = target.get("/model_info")
    assert status == 200
    assert info["model_path"] and info["is_generation"] is True
    assert isinstance(info["weight_version"], str)


def test_server_info_has_server_args_and_version(target) -> None:
    status, info = target.get("/server_info")
    assert status == 200
    assert info["model_path"] and isinstance(info["port"], int)
    assert isinstance(info["version"], str) and info["version"]


def test_the_pre_0_5_17_info_names_still_answer_and_get_weight_version_is_gone(target) -> None:
    assert target.get("/get_model_info")[1]["model_path"] == target.get("/model_info")[1]["model_path"]
    assert target.get("/get_server_info")[1]["port"] == target.get("/server_info")[1]["port"]
    status, body = target.get("/get_weight_version")
    assert status == 404 and "/model_info" in str(body)


# ---------------------------------------------------------------------------------------------
# /generate: single and batched, text and ids


def test_single_text_prompt_returns_one_object_with_text_ids_and_meta_info(target) -> None:
    out = target.generate({"text": "The capital of France is", "sampling_params": {**GREEDY, "max_new_tokens": 8}})
    assert isinstance(out, dict)
    _assert_sample_shape(out)
    assert out["meta_info"]["prompt_tokens"] == len(target.tokenizer("The capital of France is")["input_ids"])
    assert 0 < out["meta_info"]["completion_tokens"] <= 8


def test_single_input_ids_prompt_counts_exactly_those_tokens(target) -> None:
    ids = target.chat_ids(CAPITAL)
    out = target.generate({"input_ids": ids, "sampling_params": {**GREEDY, "max_new_tokens": 8}})
    assert isinstance(out, dict)
    _assert_sample_shape(out)
    assert out["meta_info"]["prompt_tokens"] == len(ids)


def test_greedy_chat_answer_names_paris_and_stops_at_eos(target) -> None:
    out = target.generate({"input_ids": target.chat_ids(CAPITAL), "sampling_params": {**GREEDY, "max_new_tokens": 64}})
    assert "Paris" in out["text"]
    finish = out["meta_info"]["finish_reason"]
    assert finish["type"] == "stop"
    assert finish["matched"] == target.tokenizer.eos_token_id
    assert "<|im_end|>" not in out["text"]


def test_a_batch_returns_one_entry_per_prompt_in_order(target) -> None:
    prompts = ["Hi", "Tell me a story about a dragon", "One two three four five six seven eight"]
    out = target.generate({"text": prompts, "sampling_params": {**GREEDY, "max_new_tokens": 4}})
    assert isinstance(out, list) and len(out) == 3
    for entry, prompt in zip(out, prompts):
        _assert_sample_shape(entry)
        assert entry["meta_info"]["prompt_tokens"] == len(target.tokenizer(prompt)["input_ids"])
    assert len({e["meta_info"]["id"] for e in out}) == 3


def test_a_batch_of_input_ids_with_per_prompt_sampling_params(target) -> None:
    ids = [target.chat_ids("Count to ten."), target.chat_ids("Name a colour.")]
    out = target.generate({
        "input_ids": ids,
        "sampling_params": [{**GREEDY, "max_new_tokens": 3, "ignore_eos": True},
                            {**GREEDY, "max_new_tokens": 5, "ignore_eos": True}],
    })
    assert [e["meta_info"]["completion_tokens"] for e in out] == [3, 5]
    assert [e["meta_info"]["prompt_tokens"] for e in out] == [len(i) for i in ids]


def test_batched_greedy_equals_one_by_one_greedy_on_the_first_tokens(target) -> None:
    # The first tokens of a greedy answer are numerically robust; later ones may diverge between
    # padded-batch and single runs in bf16 (GPU) — so compare a short prefix only.
    prompts = [target.chat_ids(CAPITAL), target.chat_ids("Name three fruits.")]
    params = {**GREEDY, "max_new_tokens": 4, "ignore_eos": True}
    batched = target.generate({"input_ids": prompts, "sampling_params": params})
    singles = [target.generate({"input_ids": p, "sampling_params": params}) for p in prompts]
    assert [b["output_ids"] for b in batched] == [s["output_ids"] for s in singles]


def test_n_returns_n_samples_per_prompt_grouped_by_prompt(target) -> None:
    prompts = ["Write a word:", "A much longer prompt that has clearly more tokens than the first one:"]
    out = target.generate({"text": prompts, "sampling_params": {"temperature": 1.0, "max_new_tokens": 6, "n": 3}})
    assert len(out) == 6
    lengths = [len(target.tokenizer(p)["input_ids"]) for p in prompts]
    assert [e["meta_info"]["prompt_tokens"] for e in out] == [lengths[0]] * 3 + [lengths[1]] * 3
    assert len({e["meta_info"]["id"] for e in out}) == 6


def test_n_on_a_single_prompt_returns_a_list_of_n(target) -> None:
    out = target.generate({"text": "Once upon a time", "sampling_params": {"temperature": 1.0, "max_new_tokens": 4, "n": 2}})
    assert isinstance(out, list) and len(out) == 2


def test_rid_is_echoed_as_meta_info_id(target) -> None:
    rids = [f"conf-{uuid.uuid4().hex}" for _ in range(2)]
    out = target.generate({"text": ["a", "b"], "rid": rids, "sampling_params": {**GREEDY, "max_new_tokens": 2}})
    assert [e["meta_info"]["id"] for e in out] == rids


# ---------------------------------------------------------------------------------------------
# Finish reasons and stops


def test_max_new_tokens_with_ignore_eos_finishes_by_length(target) -> None:
    out = target.generate({"text": "Hello", "sampling_params": {**GREEDY, "max_new_tokens": 7, "ignore_eos": True}})
    assert out["meta_info"]["finish_reason"] == {"type": "length", "length": 7}
    assert out["meta_info"]["completion_tokens"] == 7 == len(out["output_ids"])


def test_stop_string_is_trimmed_from_text_and_reported_as_matched(target) -> None:
    ids = target.chat_ids(CAPITAL)
    plain = target.generate({"input_ids": ids, "sampling_params": {**GREEDY, "max_new_tokens": 64}})
    assert "Paris" in plain["text"]
    out = target.generate({"input_ids": ids, "sampling_params": {**GREEDY, "max_new_tokens": 64, "stop": ["Paris"]}})
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": "Paris"}
    assert "Paris" not in out["text"]
    assert plain["text"].startswith(out["text"])


def test_stop_token_ids_stop_at_that_token(target) -> None:
    ids = target.chat_ids(CAPITAL)
    plain = target.generate({"input_ids": ids, "sampling_params": {**GREEDY, "max_new_tokens": 8, "ignore_eos": True}})
    stop_id = plain["output_ids"][2]
    first = plain["output_ids"].index(stop_id)
    out = target.generate({"input_ids": ids, "sampling_params": {**GREEDY, "max_new_tokens": 8, "stop_token_ids": [stop_id]}})
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop_id}
    assert out["output_ids"] == plain["output_ids"][: first + 1]


def test_eos_token_is_the_last_output_id_when_finished_by_eos(target) -> None:
    out = target.generate({"input_ids": target.chat_ids(CAPITAL), "sampling_params": {**GREEDY, "max_new_tokens": 64}})
    assert out["meta_info"]["finish_reason"]["type"] == "stop"
    assert out["output_ids"][-1] == target.tokenizer.eos_token_id


def test_min_new_tokens_delays_eos(target) -> None:
    ids = target.chat_ids(CAPITAL)
    plain = target.generate({"input_ids": ids, "sampling_params": {**GREEDY, "max_new_tokens": 64}})
    natural = plain["meta_info"]["completion_tokens"]
    out = target.generate({"input_ids": ids, "sampling_params": {**GREEDY, "max_new_tokens": 64, "min_new_tokens": natural + 5}})
    assert out["meta_info"]["completion_tokens"] >= natural + 5


# ---------------------------------------------------------------------------------------------
# Sampling


def test_greedy_is_deterministic(target) -> None:
    body = {"input_ids": target.chat_ids("Describe the sea."), "sampling_params": {**GREEDY, "max_new_tokens": 16}}
    assert target.generate(body)["output_ids"] == target.generate(body)["output_ids"]


def test_sampling_seed_makes_sampling_reproducible(target) -> None:
    if target.backend == "sglang" and not target.get("/server_info")[1].get("enable_deterministic_inference"):
        # Seen on SGLang 0.5.17 (H200, 2026-11-30): without deterministic inference two requests with
        # the same sampling_seed sample different tokens. The CPU backend always honours the seed.
        pytest.skip("SGLang honours sampling_seed only with --enable-deterministic-inference")
    ids = target.chat_ids("Invent a name for a cat.")
    params = {"temperature": 1.0, "max_new_tokens": 16, "ignore_eos": True}
    a = target.generate({"input_ids": ids, "sampling_params": {**params, "sampling_seed": 1234}})
    b = target.generate({"input_ids": ids, "sampling_params": {**params, "sampling_seed": 1234}})
    others = [target.generate({"input_ids": ids, "sampling_params": {**params, "sampling_seed": s}})["output_ids"]
              for s in (1, 2, 3)]
    assert a["output_ids"] == b["output_ids"]
    assert any(o != a["output_ids"] for o in others)


def test_top_k_1_equals_greedy(target) -> None:
    ids = target.chat_ids("Describe the sea.")
    greedy = target.generate({"input_ids": ids, "sampling_params": {**GREEDY, "max_new_tokens": 6, "ignore_eos": True}})
    topk1 = target.generate({"input_ids": ids, "sampling_params": {"temperature": 1.0, "top_k": 1, "max_new_tokens": 6, "ignore_eos": True}})
    assert topk1["output_ids"] == greedy["output_ids"]


def test_sampling_params_top_p_min_p_and_repetition_penalty_are_accepted(target) -> None:
    out = target.generate({"text": "Hello", "sampling_params": {
        "temperature": 0.7, "top_p": 0.9, "top_k": 20, "min_p": 0.05, "repetition_penalty": 1.1, "max_new_tokens": 5}})
    _assert_sample_shape(out)


def _sampled_tokens_below_the_top(target, **params) -> int:
    """Of 4 samples x 12 tokens at temperature 1 on an open prompt, how many were not the most
    likely token. A sampled token's logprob equals the top-1 logprob when it is the most likely
    one (or tied with it): both come from the same distribution, taken before top-p/min-p
    filtering (docs/sglang-api.md 1.6), so exact ties in bf16 cannot fail the count."""
    ids = target.chat_ids("Invent a name for a cat.")
    out = target.generate({"input_ids": [ids] * 4, "return_logprob": True, "top_logprobs_num": 1,
                           "sampling_params": {"temperature": 1.0, "max_new_tokens": 12, "ignore_eos": True, **params}})
    below = 0
    for entry in out:
        meta = entry["meta_info"]
        for (lp, _, _), top in zip(meta["output_token_logprobs"], meta["output_top_logprobs"]):
            below += lp < top[0][0] - 1e-5
    return below


def test_sampling_at_temperature_1_also_picks_less_likely_tokens(target) -> None:
    # What makes the top_p and min_p checks below able to fail: unfiltered, this prompt samples
    # tokens other than the most likely one (over half of them on the CPU backend).
    below = _sampled_tokens_below_the_top(target)
    assert below > 0, "every sampled token was the most likely one"


@pytest.mark.parametrize("params", [{"top_p": 1e-6}, {"min_p": 1.0}], ids=["top_p", "min_p"])
def test_a_tiny_top_p_or_a_min_p_of_one_samples_only_the_most_likely_token(target, params: dict) -> None:
    # top_p keeps the most likely tokens while the mass before them is <= top_p: the first one
    # only, as every token has mass > 1e-6 here. min_p keeps tokens >= min_p x the top one's.
    below = _sampled_tokens_below_the_top(target, **params)
    assert below == 0, f"{below} of 48 sampled tokens were not the most likely one"


def test_repetition_penalty_breaks_a_greedy_loop(target) -> None:
    # SGLang's repetition penalty divides the positive logits (multiplies the negative ones) of
    # the tokens already generated; greedy here repeats " hello" without it.
    ids = target.tokenizer("Repeat after me: hello hello hello hello hello hello")["input_ids"]
    params = {**GREEDY, "max_new_tokens": 12, "ignore_eos": True}
    plain = target.generate({"input_ids": ids, "sampling_params": params})["output_ids"]
    penalized = target.generate({"input_ids": ids, "sampling_params": {**params, "repetition_penalty": 2.0}})["output_ids"]
    most_repeated = max(plain.count(t) for t in plain)
    assert most_repeated >= 8, target.tokenizer.decode(plain)  # the prompt makes the model loop
    assert max(penalized.count(t) for t in penalized) <= most_repeated // 2, target.tokenizer.decode(penalized)


# ---------------------------------------------------------------------------------------------
# Logprobs


def test_output_logprobs_line_up_with_output_ids(target) -> None:
    out = target.generate({"input_ids": target.chat_ids(CAPITAL), "return_logprob": True,
                           "sampling_params": {"temperature": 1.0, "max_new_tokens": 12, "sampling_seed": 7}})
    lps = out["meta_info"]["output_token_logprobs"]
    assert len(lps) == len(out["output_ids"])
    for (lp, tok, text), oid in zip(lps, out["output_ids"]):
        assert tok == oid and text is None
        assert isinstance(lp, float) and lp <= 0.0


def test_greedy_output_ids_are_the_argmax_of_their_top_logprobs(target) -> None:
    out = target.generate({"input_ids": target.chat_ids(CAPITAL), "return_logprob": True, "top_logprobs_num": 5,
                           "sampling_params": {**GREEDY, "max_new_tokens": 12}})
    meta = out["meta_info"]
    assert len(meta["output_top_logprobs"]) == len(out["output_ids"])
    for oid, (lp, _, _), top in zip(out["output_ids"], meta["output_token_logprobs"], meta["output_top_logprobs"]):
        assert len(top) == 5
        values = [t[0] for t in top]
        assert values == sorted(values, reverse=True)
        assert top[0][1] == oid
        assert math.isclose(top[0][0], lp, abs_tol=1e-4)


def test_input_logprobs_from_start_cover_the_prompt_with_a_leading_none(target) -> None:
    ids = target.chat_ids(CAPITAL)
    out = target.generate({"input_ids": ids, "return_logprob": True, "logprob_start_len": 0,
                           "sampling_params": {**GREEDY, "max_new_tokens": 2}})
    inp = out["meta_info"]["input_token_logprobs"]
    assert len(inp) == len(ids)
    assert inp[0][0] is None
    assert [t[1] for t in inp] == ids
    assert all(isinstance(t[0], float) and t[0] <= 0 for t in inp[1:])


def test_scoring_a_completion_by_prefill_matches_its_sampled_logprobs(target) -> None:
    # The basis of rlgen's score(): logprobs of given tokens from a prefill over prompt + completion.
    ids = target.chat_ids(CAPITAL)
    gen = target.generate({"input_ids": ids, "return_logprob": True,
                           "sampling_params": {**GREEDY, "max_new_tokens": 10, "ignore_eos": True}})
    full = ids + gen["output_ids"]
    score = target.generate({"input_ids": full, "return_logprob": True, "logprob_start_len": len(ids) - 1,
                             "sampling_params": {**GREEDY, "max_new_tokens": 1}})
    inp = score["meta_info"]["input_token_logprobs"]
    # entries cover full[len(ids)-1:]; the first is the last prompt token (None or its own logprob)
    scored = [t[0] for t in inp[1:]]
    assert [t[1] for t in inp[1:]] == gen["output_ids"]
    sampled = [t[0] for t in gen["meta_info"]["output_token_logprobs"]]
    tol = 0.15 if target.backend == "sglang" else 1e-3  # bf16 prefill vs decode kernels on the GPU
    assert max(abs(a - b) for a, b in zip(scored, sampled)) < tol


# ---------------------------------------------------------------------------------------------
# Streaming


def test_stream_sends_sse_chunks_ending_in_done_and_matches_the_non_stream_result(target) -> None:
    body = {"input_ids": target.chat_ids(CAPITAL), "sampling_params": {**GREEDY, "max_new_tokens": 16, "ignore_eos": True}}
    events = target.stream(body)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert len(chunks) >= 2
    for chunk in chunks:
        assert {"text", "output_ids", "meta_info"} <= set(chunk)
    final = chunks[-1]
    full = target.generate(body)
    assert final["text"] == full["text"]  # text is cumulative in each chunk
    assert final["meta_info"]["finish_reason"] == {"type": "length", "length": 16}
    assert final["meta_info"]["completion_tokens"] == 16
    assert all(c["meta_info"]["finish_reason"] is None for c in chunks[:-1])
    # By default SGLang streams cumulatively: each chunk carries all text, ids and logprobs so far.
    for before, after in itertools.pairwise(chunks):
        assert after["text"].startswith(before["text"])
        assert after["output_ids"][: len(before["output_ids"])] == before["output_ids"]
    assert final["output_ids"] == full["output_ids"]


def test_a_streamed_batch_tags_each_chunk_with_its_index(target) -> None:
    events = target.stream({"text": ["One", "Two"], "sampling_params": {**GREEDY, "max_new_tokens": 4, "ignore_eos": True}})
    chunks = [json.loads(e) for e in events[:-1]]
    assert {c["index"] for c in chunks} == {0, 1}
    finals = {c["index"]: c for c in chunks if c["meta_info"]["finish_reason"] is not None}
    assert sorted(finals) == [0, 1] and all(f["meta_info"]["completion_tokens"] == 4 for f in finals.values())


# ---------------------------------------------------------------------------------------------
# Abort


def _generate_in_thread(target, body: dict) -> tuple[threading.Thread, dict]:
    box: dict = {}

    def run() -> None:
        box["out"] = target.generate(body)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, box


def test_abort_request_by_rid_finishes_that_request_with_abort(target) -> None:
    rid = f"conf-abort-{uuid.uuid4().hex}"
    thread, box = _generate_in_thread(target, {"text": "Tell me everything.", "rid": rid,
                                               "sampling_params": {"temperature": 1.0, "max_new_tokens": LONG, "ignore_eos": True}})
    time.sleep(1.0)  # let the request reach the scheduler
    status, _ = target.post("/abort_request", {"rid": rid})
    assert status == 200
    thread.join(timeout=60)
    assert not thread.is_alive()
    assert box["out"]["meta_info"]["finish_reason"]["type"] == "abort"


def test_abort_all_aborts_every_running_request(target) -> None:
    threads = [_generate_in_thread(target, {"text": f"Story {i}:", "sampling_params": {
        "temperature": 1.0, "max_new_tokens": LONG, "ignore_eos": True}}) for i in range(2)]
    time.sleep(1.0)
    status, _ = target.post("/abort_request", {"abort_all": True})
    assert status == 200
    for thread, box in threads:
        thread.join(timeout=60)
        assert box["out"]["meta_info"]["finish_reason"]["type"] == "abort"


def _requests_on_server(target) -> int:
    status, body = target.get("/v1/loads")
    assert status == 200, body
    return sum(load["num_running_reqs"] + load["num_waiting_reqs"] for load in body["loads"])


def test_v1_loads_counts_a_running_request_until_it_is_aborted(target) -> None:
    rid = f"conf-loads-{uuid.uuid4().hex}"
    thread, box = _generate_in_thread(target, {"text": "Tell me everything.", "rid": rid,
                                               "sampling_params": {"temperature": 1.0, "max_new_tokens": LONG, "ignore_eos": True}})
    deadline = time.monotonic() + 60
    while _requests_on_server(target) == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _requests_on_server(target) == 1
    assert target.post("/abort_request", {"rid": rid})[0] == 200
    thread.join(timeout=60)
    assert box["out"]["meta_info"]["finish_reason"]["type"] == "abort"
    deadline = time.monotonic() + 5  # SGLang publishes the counts when its scheduler goes idle
    while _requests_on_server(target) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _requests_on_server(target) == 0


def test_the_server_serves_normally_after_an_abort(target) -> None:
    out = target.generate({"text": "Hello", "sampling_params": {**GREEDY, "max_new_tokens": 3, "ignore_eos": True}})
    assert out["meta_info"]["finish_reason"]["type"] == "length"


# ---------------------------------------------------------------------------------------------
# Control endpoints


def test_flush_cache_empties_the_prefix_cache_and_answers_200_when_idle(target) -> None:
    body = {"input_ids": target.chat_ids("Name a colour."), "sampling_params": {**GREEDY, "max_new_tokens": 1}}
    target.generate(body)
    assert target.generate(body)["meta_info"]["cached_tokens"] > 0  # the repeated prompt's prefix
    status, text = target.post("/flush_cache")
    assert status == 200 and "Cache flushed" in text
    assert target.generate(body)["meta_info"]["cached_tokens"] == 0


def test_update_weights_from_disk_reloads_and_sets_the_weight_version(target) -> None:
    body = {"input_ids": target.chat_ids(CAPITAL), "sampling_params": {**GREEDY, "max_new_tokens": 8}}
    # A weight update empties the prefix cache, so `after` is computed from a cold cache: `before`
    # must be too. (SGLang's greedy answer to this prompt differs between a cached and a cold
    # prefix on the GPU bundle: docs/gpu/2026-11-30, finding 1.)
    assert target.post("/flush_cache")[0] == 200
    before = target.generate(body)
    status, res = target.post("/update_weights_from_disk", {"model_path": target.model_path, "weight_version": "conf-v2"})
    assert status == 200 and res["success"] is True, res
    assert target.get("/model_info")[1]["weight_version"] == "conf-v2"
    after = target.generate(body)
    assert after["meta_info"]["weight_version"] == "conf-v2"
    assert after["output_ids"] == before["output_ids"]  # same weights reloaded: same greedy answer


def test_update_weights_from_a_missing_path_fails_with_success_false(target) -> None:
    status, res = target.post("/update_weights_from_disk", {"model_path": "/nonexistent/rlgen-model"})
    assert status == 400
    assert res["success"] is False and res["message"]
    assert target.get("/health_generate")[0] == 200


def test_release_and_resume_kv_cache_memory_answer_200_and_generation_still_works(target) -> None:
    assert target.post("/release_memory_occupation", {"tags": ["kv_cache"]})[0] == 200
    assert target.post("/resume_memory_occupation", {"tags": ["kv_cache"]})[0] == 200
    out = target.generate({"text": "Hello", "sampling_params": {**GREEDY, "max_new_tokens": 3, "ignore_eos": True}})
    assert out["meta_info"]["completion_tokens"] == 3


# ---------------------------------------------------------------------------------------------
# Bad requests: HTTP 400 with a message, and the server keeps serving

BAD_REQUESTS = {
    "negative max_new_tokens": {"text": "Hi", "sampling_params": {"max_new_tokens": -1}},
    "temperature below zero": {"text": "Hi", "sampling_params": {"temperature": -0.5}},
    "top_p above one": {"text": "Hi", "sampling_params": {"top_p": 1.5}},
    "top_p zero": {"text": "Hi", "sampling_params": {"top_p": 0.0}},
    "min_new_tokens above max_new_tokens": {"text": "Hi", "sampling_params": {"max_new_tokens": 2, "min_new_tokens": 5}},
    "top_k zero": {"text": "Hi", "sampling_params": {"top_k": 0}},
    "prompt plus max_new_tokens beyond the context": {"text": "Hi", "sampling_params": {"max_new_tokens": 10_000_000}},
}


@pytest.mark.parametrize("case", sorted(BAD_REQUESTS))
def test_bad_sampling_params_get_400_with_a_message(target, case: str) -> None:
    status, body = target.post("/generate", BAD_REQUESTS[case])
    assert status == 400, body
    assert "error" in body and body["error"]["message"]
    assert target.generate({"text": "Hi", "sampling_params": {"max_new_tokens": 1}})["meta_info"]["completion_tokens"] == 1


@pytest.mark.parametrize("body", [
    {"sampling_params": {"max_new_tokens": 1}},
    {"input_ids": [], "sampling_params": {"max_new_tokens": 1}},
    {"text": 5, "sampling_params": {"max_new_tokens": 1}},
], ids=["no text or input_ids", "empty input_ids", "text of the wrong type"])
def test_malformed_prompts_get_400(target, body: dict) -> None:
    status, answer = target.post("/generate", body)
    assert status == 400, answer
    assert target.get("/health")[0] == 200


def test_a_prompt_longer_than_the_context_gets_400(target) -> None:
    status, info = target.get("/server_info")
    context = info.get("context_length") or 8192
    status, body = target.post("/generate", {"input_ids": [1] * (context + 10), "sampling_params": {"max_new_tokens": 1}})
    assert status == 400, body
    assert target.get("/health_generate")[0] == 200
