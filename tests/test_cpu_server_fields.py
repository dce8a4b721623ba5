"""The CPU backend accepts what SGLang accepts (issue 16): every field of SGLang 0.5.17's
`GenerateReqInput` at its default, and the body sglang-router 0.3.2 forwards; it refuses, with a
400 naming the field, only a non-default value it cannot honour.

The field list below is copied from SGLang 0.5.17 (`sglang/srt/managers/io_struct.py` in the
sglang 0.5.17 wheel), not taken from rlgen's table, so that the table is checked against it.
"""

from __future__ import annotations

import json
import re
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _cpu_server_process import Server, generated, post, running_server

pytest.importorskip("torch")


from rlgen.cpu_server._fields import GENERATE_FIELDS, SAMPLING_FIELDS

REPO = Path(__file__).resolve().parents[1]

# GenerateReqInput's fields and defaults in SGLang 0.5.17, in its order.
SGLANG_GENERATE_DEFAULTS: dict[str, Any] = {
    "rid": None, "session_id": None, "text": None, "input_ids": None, "input_embeds": None,
    "image_data": None, "video_data": None, "audio_data": None, "mm_hashes": None,
    "use_audio_in_video": False, "sampling_params": None, "return_logprob": None,
    "logprob_start_len": None, "top_logprobs_num": None, "token_ids_logprob": None,
    "return_sampling_mask": None, "return_text_in_logprobs": False,
    "return_flat_raw_top_logprobs": False, "return_flat_raw_top_logprobs_b64": False, "stream": False,
    "log_metrics": True, "return_hidden_states": False, "return_routed_experts": False,
    "routed_experts_start_len": 0, "return_indexer_topk": False, "modalities": None,
    "session_params": None, "lora_path": None, "lora_id": None, "custom_logit_processor": None,
    "positional_embed_overrides": None, "bootstrap_host": None, "bootstrap_port": None,
    "bootstrap_room": None, "bootstrap_pair_key": None, "decode_tp_size": None, "routed_dp_rank": None,
    "disagg_prefill_dp_rank": None, "routing_key": None, "conversation_id": None,
    "http_worker_ipc": None, "background": False, "require_reasoning": False,
    "max_thinking_tokens": None, "priority": None, "extra_key": None, "no_logs": False,
    "custom_labels": None, "return_bytes": False, "return_entropy": False,
    "return_prompt_token_ids": False, "external_trace_header": None, "received_time": None,
    "need_wait_for_mm_inputs": None, "num_items_assigned": None, "mm_data_mooncake": None,
    "encoder_urls": None, "max_dynamic_patch": None, "min_dynamic_patch": None,
    "image_max_dynamic_patch": None, "video_max_dynamic_patch": None, "images_config": None,
    "multi_item_delimiter_indices": None,
}  # fmt: skip

# SamplingParams' keys and defaults in SGLang 0.5.17 (sglang/srt/sampling/sampling_params.py);
# top_k's default there is TOP_K_ALL, which is what -1 means on the wire.
SGLANG_SAMPLING_DEFAULTS: dict[str, Any] = {
    "max_new_tokens": 128, "stop": None, "stop_token_ids": None, "stop_regex": None, "temperature": 1.0,
    "top_p": 1.0, "top_k": -1, "min_p": 0.0, "frequency_penalty": 0.0, "presence_penalty": 0.0,
    "repetition_penalty": 1.0, "min_new_tokens": 0, "n": 1, "json_schema": None, "regex": None, "ebnf": None,
    "structural_tag": None, "ignore_eos": False, "skip_special_tokens": True,
    "spaces_between_special_tokens": True, "no_stop_trim": False, "stream_interval": None, "logit_bias": None,
    "sampling_seed": None, "custom_params": None, "stop_strs": None, "stop_regex_strs": None,
    "stop_str_max_len": 0, "stop_regex_max_len": 0, "is_normalized": False,
}  # fmt: skip

# What sglang-router 0.3.2 (sgl-model-gateway 0.3.2) forwards to a worker's /generate for
# {"text": ..., "sampling_params": ..., "rid": ...}, as captured from the router on the wire.
ROUTER_ADDED_FIELDS = {
    "model": None, "return_text_in_logprobs": False, "stream": False, "log_metrics": True,
    "return_hidden_states": False, "background": False, "no_logs": False, "return_bytes": False,
    "return_entropy": False,
}  # fmt: skip

# One non-default value for each field the CPU backend refuses.
REFUSED_VALUES: list[tuple[str, Any]] = [
    ("input_embeds", [[0.1, 0.2], [0.3, 0.4]]),
    ("image_data", "https://example.com/cat.png"),
    ("video_data", "https://example.com/cat.mp4"),
    ("audio_data", "https://example.com/cat.wav"),
    ("token_ids_logprob", [1, 2]),
    ("return_sampling_mask", True),
    ("return_flat_raw_top_logprobs", True),
    ("return_flat_raw_top_logprobs_b64", True),
    ("return_hidden_states", True),
    ("return_hidden_states", "last"),
    ("return_routed_experts", True),
    ("return_indexer_topk", True),
    ("session_params", {"id": "s1"}),
    ("lora_id", "my-adapter-id"),
    ("custom_logit_processor", '{"callable": "x"}'),
    ("positional_embed_overrides", {"positions": [0]}),
    ("max_thinking_tokens", 16),
    ("multi_item_delimiter_indices", [1, 2]),
]
REFUSED_SAMPLING_VALUES: list[tuple[str, Any]] = [
    ("json_schema", '{"type": "object"}'),
    ("regex", "[a-z]+"),
    ("ebnf", 'root ::= "a"'),
    ("structural_tag", '{"structures": []}'),
    ("stop_regex", "\\d"),
    ("logit_bias", {"42": 5.0}),
    ("is_normalized", True),
]

PROMPT = "The capital of France is"
GREEDY = {"temperature": 0.0, "max_new_tokens": 8, "ignore_eos": True}


# ---- the table against SGLang's source and the docs (no server) -------------------------------------


def test_the_field_table_lists_exactly_sglang_0_5_17s_generate_fields_with_their_defaults() -> None:
    assert list(GENERATE_FIELDS) == list(SGLANG_GENERATE_DEFAULTS)
    for name, default in SGLANG_GENERATE_DEFAULTS.items():
        assert GENERATE_FIELDS[name].default == default and type(GENERATE_FIELDS[name].default) is type(default), name


def test_the_sampling_table_lists_exactly_sglang_0_5_17s_sampling_params_with_their_defaults() -> None:
    assert set(SAMPLING_FIELDS) == set(SGLANG_SAMPLING_DEFAULTS)
    for name, default in SGLANG_SAMPLING_DEFAULTS.items():
        assert SAMPLING_FIELDS[name].default == default, name


def test_every_refused_field_has_a_refused_value_in_these_tests() -> None:
    refused = {name for name, spec in GENERATE_FIELDS.items() if spec.treatment == "refused"}
    assert refused == {name for name, _ in REFUSED_VALUES}
    public_sampling = {n for n, spec in SAMPLING_FIELDS.items() if spec.treatment == "refused" and "internal" not in spec.why}
    assert public_sampling <= {name for name, _ in REFUSED_SAMPLING_VALUES}


def test_the_docs_list_every_field_with_its_treatment() -> None:
    text = (REPO / "docs" / "sglang-api.md").read_text()
    rows = dict(re.findall(r"^\| `(\w+)` \| `[^`]*` \| (honoured|ignored|refused)", text, flags=re.M))
    for name, spec in {**GENERATE_FIELDS, **SAMPLING_FIELDS}.items():
        assert rows.get(name) == spec.treatment, name


# ---- a server process ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def server(model_path: str) -> Iterator[Server]:
    with running_server(model_path) as srv:
        yield srv


def _same_answer(a: dict[str, Any], b: dict[str, Any]) -> None:
    assert a["output_ids"] == b["output_ids"] and a["text"] == b["text"]
    assert a["meta_info"]["finish_reason"] == b["meta_info"]["finish_reason"]
    assert set(a) == set(b) and set(a["meta_info"]) == set(b["meta_info"])


@pytest.mark.timeout(120)
def test_a_request_with_every_generate_field_at_its_default_is_answered_like_one_without_them(server: Server) -> None:
    plain = generated(server, {"text": PROMPT, "sampling_params": GREEDY})
    full = generated(server, {**SGLANG_GENERATE_DEFAULTS, "text": PROMPT, "sampling_params": GREEDY})
    _same_answer(full, plain)


@pytest.mark.timeout(120)
def test_every_sampling_param_at_its_default_changes_nothing(server: Server) -> None:
    plain = generated(server, {"text": PROMPT, "sampling_params": GREEDY})
    defaults = {**SGLANG_SAMPLING_DEFAULTS, "json_schema": "", "logit_bias": {}, **GREEDY}  # SGLang's unset aliases too
    _same_answer(generated(server, {"text": PROMPT, "sampling_params": defaults}), plain)


@pytest.mark.timeout(120)
def test_a_batch_with_per_prompt_lists_of_defaults_is_answered_like_one_without_them(server: Server) -> None:
    prompts = [PROMPT, "Once upon a time"]
    plain = generated(server, {"text": prompts, "sampling_params": GREEDY, "rid": ["p0", "p1"]})
    per_prompt = {
        "return_hidden_states": [False, False], "custom_logit_processor": [None, None],
        "bootstrap_room": [None, None], "token_ids_logprob": [], "image_data": [], "extra_key": ["a", "b"],
    }  # fmt: skip
    listed = generated(server, {"text": prompts, "sampling_params": GREEDY, "rid": ["q0", "q1"], **per_prompt})
    assert len(listed) == 2
    for a, b in zip(listed, plain):
        _same_answer(a, b)


@pytest.mark.timeout(120)
def test_the_body_sglang_router_forwards_is_answered_like_a_direct_request(server: Server) -> None:
    plain = generated(server, {"text": PROMPT, "sampling_params": GREEDY})
    routed = generated(server, {"text": PROMPT, "sampling_params": GREEDY, "rid": "via-router", **ROUTER_ADDED_FIELDS})
    _same_answer(routed, plain)
    assert routed["meta_info"]["id"] == "via-router"
    streamed = _stream(server, {"text": PROMPT, "sampling_params": GREEDY, **ROUTER_ADDED_FIELDS, "stream": True})
    assert streamed[-1]["output_ids"] == plain["output_ids"]


def _stream(server: Server, body: dict[str, Any]) -> list[dict[str, Any]]:
    request = urllib.request.Request(server.url + "/generate", data=json.dumps(body).encode(), method="POST")
    with urllib.request.urlopen(request, timeout=60) as response:
        assert response.status == 200
        events = [line.decode().strip() for line in response if line.strip()]
    assert events[-1] == "data: [DONE]"
    return [json.loads(event[len("data: ") :]) for event in events[:-1]]


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("name", "value"), REFUSED_VALUES, ids=[f"{n}={v!r:.20}" for n, v in REFUSED_VALUES])
def test_a_refused_non_default_value_gets_a_400_naming_the_field(server: Server, name: str, value: Any) -> None:
    status, answer = post(server.url + "/generate", {"text": PROMPT, "sampling_params": GREEDY, name: value})
    assert status == 400 and tuple(answer) == ("error",), answer
    assert answer["error"]["message"].startswith(f"{name}="), answer
    assert "not supported by the rlgen CPU backend" in answer["error"]["message"]


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("name", "value"), REFUSED_SAMPLING_VALUES, ids=[n for n, _ in REFUSED_SAMPLING_VALUES])
def test_a_refused_sampling_param_gets_a_400_naming_it(server: Server, name: str, value: Any) -> None:
    status, answer = post(server.url + "/generate", {"text": PROMPT, "sampling_params": {**GREEDY, name: value}})
    assert status == 400 and answer["error"]["message"].startswith(f"sampling_params.{name}="), answer


@pytest.mark.timeout(60)
def test_an_ignored_field_of_the_wrong_type_gets_sglangs_type_error(server: Server) -> None:
    status, answer = post(server.url + "/generate", {"text": PROMPT, "priority": "high"})
    assert status == 400 and answer["object"] == "error" and "body.priority" in answer["message"], answer


@pytest.mark.timeout(60)
def test_routed_dp_rank_0_is_accepted_and_any_other_rank_is_out_of_range_as_in_sglang(server: Server) -> None:
    generated(server, {"text": PROMPT, "sampling_params": GREEDY, "routed_dp_rank": 0})
    status, answer = post(server.url + "/generate", {"text": PROMPT, "sampling_params": GREEDY, "routed_dp_rank": 1})
    assert (status, answer) == (400, {"error": {"message": "routed_dp_rank=1 out of range [0, 1)"}})


@pytest.mark.timeout(60)
def test_return_prompt_token_ids_adds_the_prompts_token_ids(server: Server) -> None:
    ids = [1, 2, 3, 4]
    answer = generated(server, {"input_ids": ids, "sampling_params": GREEDY, "return_prompt_token_ids": True})
    assert answer["prompt_token_ids"] == ids
    assert "prompt_token_ids" not in generated(server, {"input_ids": ids, "sampling_params": GREEDY})
    chunks = _stream(server, {"input_ids": ids, "sampling_params": GREEDY, "return_prompt_token_ids": True, "stream": True})
    assert all(chunk["prompt_token_ids"] == ids for chunk in chunks)


@pytest.mark.timeout(60)
def test_a_batch_of_one_keeps_its_string_rid_as_sglang_0_5_17_does(server: Server) -> None:
    (answer,) = generated(server, {"text": [PROMPT], "sampling_params": GREEDY, "rid": "solo"})
    assert answer["meta_info"]["id"] == "solo"
