"""The fields of a /generate request and what the CPU backend does with each: one table.

Owns: the list of SGLang 0.5.17's `GenerateReqInput` fields and `SamplingParams` keys, each with
SGLang's default and the CPU backend's treatment, the type check FastAPI would run on the fields
the routes do not parse themselves, and the refusal of a non-default value the backend cannot
honour. Read from the sglang 0.5.17 wheel on PyPI (`sglang/srt/managers/io_struct.py`,
`GenerateReqInput`; `sglang/srt/sampling/sampling_params.py`, `SamplingParams`); docs/sglang-api.md
(section 1.9) lists the same table with the reasons.

Treatments:
    honoured  the routes implement it (parsed and validated in _app)
    ignored   accepted with any value of the right type; it changes nothing the CPU backend
              answers (routing, tracing, metrics labels, disaggregation, multimodal tuning...)
    refused   accepted at its default; any other value gets 400 naming the field

"At its default" means: absent, `null`, equal to the default, or a list whose items are all at the
default (the per-prompt form of a batch, e.g. `return_hidden_states: [false, false]`). Unknown
top-level keys are ignored, as SGLang (a pydantic dataclass) ignores them; the router, for one,
sends `"model": null`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

__all__ = [
    "GENERATE_FIELDS", "SAMPLING_FIELDS", "Field", "FieldTypeError", "is_default", "refusals", "sampling_refusals",
]  # fmt: skip

Treatment = Literal["honoured", "ignored", "refused"]

_BOOL = (bool,)
_INT = (int,)
_NUM = (int, float)
_STR = (str,)
_DICT = (dict,)
_LIST = (list,)


@dataclass(frozen=True)
class Field:
    default: Any
    treatment: Treatment
    types: tuple[type, ...] | None  # the JSON types allowed besides null; None: any
    why: str


def _f(default: Any, treatment: Treatment, types: tuple[type, ...] | None, why: str) -> Field:
    return Field(default, treatment, types, why)


_MM = "acts only on multimodal input, which the CPU backend refuses"
_PD = "prefill-decode disaggregation only; a server without --disaggregation-mode does not use it"

# SGLang 0.5.17 GenerateReqInput, in its order. Types of the honoured fields are checked in _app.
GENERATE_FIELDS: dict[str, Field] = {
    "rid": _f(None, "honoured", None, "request id(s); see 1.2"),
    "session_id": _f(None, "ignored", _STR, "a stable identity for a session; does not change the prompt"),
    "text": _f(None, "honoured", None, "the prompt(s)"),
    "input_ids": _f(None, "honoured", None, "the prompt(s) as token ids"),
    "input_embeds": _f(None, "refused", None, "prompt embeddings instead of tokens"),
    "image_data": _f(None, "refused", None, "multimodal input"),
    "video_data": _f(None, "refused", None, "multimodal input"),
    "audio_data": _f(None, "refused", None, "multimodal input"),
    "mm_hashes": _f(None, "ignored", _LIST, _MM),
    "use_audio_in_video": _f(False, "ignored", _BOOL, _MM),
    "sampling_params": _f(None, "honoured", None, "see 1.4 and SAMPLING_FIELDS"),
    "return_logprob": _f(None, "honoured", None, "see 1.6"),
    "logprob_start_len": _f(None, "honoured", None, "see 1.6"),
    "top_logprobs_num": _f(None, "honoured", None, "see 1.6"),
    "token_ids_logprob": _f(None, "refused", _LIST, "logprobs of chosen token ids (`[]` counts as unset, as in SGLang)"),
    "return_sampling_mask": _f(None, "refused", (bool, list), "the sampler's support mask and renormalized logprobs"),
    "return_text_in_logprobs": _f(False, "honoured", None, "see 1.6"),
    "return_flat_raw_top_logprobs": _f(False, "refused", _BOOL, "prompt top logprobs as flat arrays"),
    "return_flat_raw_top_logprobs_b64": _f(False, "refused", _BOOL, "the same, base64-encoded"),
    "stream": _f(False, "honoured", None, "see 1.8"),
    "log_metrics": _f(True, "honoured", _BOOL, "false: the request is not counted in /metrics"),
    "return_hidden_states": _f(False, "refused", (bool, str, list), "hidden states (true or \"last\")"),
    "return_routed_experts": _f(False, "refused", _BOOL, "MoE routing of each token"),
    "routed_experts_start_len": _f(0, "ignored", _INT, "only used with return_routed_experts, which is refused"),
    "return_indexer_topk": _f(False, "refused", _BOOL, "sparse-attention indexer top-k"),
    "modalities": _f(None, "ignored", _LIST, _MM),
    "session_params": _f(None, "refused", _DICT, "continual-prompting sessions"),
    "lora_path": _f(None, "honoured", None, "the LoRA adapter(s) by name; see docs/sglang-api.md section 7"),
    "lora_id": _f(None, "refused", (str, list), "set by SGLang's tokenizer manager from lora_path"),
    "custom_logit_processor": _f(None, "refused", (str, list), "custom logit processors"),
    "positional_embed_overrides": _f(None, "refused", None, "embeddings placed at token positions"),
    "bootstrap_host": _f(None, "ignored", (str, list), _PD),
    "bootstrap_port": _f(None, "ignored", (int, list), _PD),
    "bootstrap_room": _f(None, "ignored", (int, list), _PD),
    "bootstrap_pair_key": _f(None, "ignored", (str, list), _PD),
    "decode_tp_size": _f(None, "ignored", (int, list), _PD),
    "routed_dp_rank": _f(None, "honoured", _INT, "one DP rank here: 0 is accepted, any other value is 400 as in SGLang"),
    "disagg_prefill_dp_rank": _f(None, "ignored", _INT, _PD),
    "routing_key": _f(None, "ignored", _STR, "only for the routing-key schedule policy"),
    "conversation_id": _f(None, "ignored", _STR, "request tracking"),
    "http_worker_ipc": _f(None, "ignored", _STR, "internal to SGLang's multi-tokenizer mode"),
    "background": _f(False, "ignored", _BOOL, "bookkeeping of the OpenAI responses API"),
    "require_reasoning": _f(False, "ignored", _BOOL, "counts reasoning tokens of hybrid reasoning models"),
    "max_thinking_tokens": _f(None, "refused", _INT, "SGLang needs --enable-strict-thinking for it"),
    "priority": _f(None, "ignored", _INT, "as SGLang without --enable-priority-scheduling"),
    "extra_key": _f(None, "ignored", (str, list), "a prefix-cache salt: outputs do not change; cached_tokens may "
                                                   "count a prefix cached under another key"),
    "no_logs": _f(False, "ignored", _BOOL, "the CPU backend logs no request contents"),
    "custom_labels": _f(None, "ignored", _DICT, "labels for SGLang's per-request metrics"),
    "return_bytes": _f(False, "ignored", _BOOL, "image generation only"),
    "return_entropy": _f(False, "ignored", _BOOL, "SGLang 0.5.17 accepts it and returns nothing for it"),
    "return_prompt_token_ids": _f(False, "honoured", _BOOL, "adds top-level `prompt_token_ids` to each answer"),
    "external_trace_header": _f(None, "ignored", _DICT, "tracing"),
    "received_time": _f(None, "ignored", _NUM, "internal timing"),
    "need_wait_for_mm_inputs": _f(None, "ignored", _BOOL, _MM),
    "num_items_assigned": _f(None, "ignored", _DICT, _MM),
    "mm_data_mooncake": _f(None, "ignored", _LIST, _MM),
    "encoder_urls": _f(None, "ignored", _LIST, _MM),
    "max_dynamic_patch": _f(None, "ignored", _INT, _MM),
    "min_dynamic_patch": _f(None, "ignored", _INT, _MM),
    "image_max_dynamic_patch": _f(None, "ignored", _INT, _MM),
    "video_max_dynamic_patch": _f(None, "ignored", _INT, _MM),
    "images_config": _f(None, "ignored", _DICT, _MM),
    "multi_item_delimiter_indices": _f(None, "refused", _LIST, "multi-item scoring"),
}  # fmt: skip

# SGLang 0.5.17 SamplingParams (a msgspec Struct built from the dict: an unknown key is a TypeError,
# 500 there; 400 here). Types of the honoured keys are checked in _app._sampling_params.
SAMPLING_FIELDS: dict[str, Field] = {
    "max_new_tokens": _f(128, "honoured", None, ""),
    "stop": _f(None, "honoured", None, ""),
    "stop_token_ids": _f(None, "honoured", None, ""),
    "stop_regex": _f(None, "refused", (str, list), "regex stops"),
    "temperature": _f(1.0, "honoured", None, ""),
    "top_p": _f(1.0, "honoured", None, ""),
    "top_k": _f(-1, "honoured", None, ""),
    "min_p": _f(0.0, "honoured", None, ""),
    "frequency_penalty": _f(0.0, "honoured", None, ""),
    "presence_penalty": _f(0.0, "honoured", None, ""),
    "repetition_penalty": _f(1.0, "honoured", None, ""),
    "min_new_tokens": _f(0, "honoured", None, ""),
    "n": _f(1, "honoured", None, ""),
    "json_schema": _f(None, "refused", _STR, "grammars (an empty string counts as unset, as in SGLang)"),
    "regex": _f(None, "refused", _STR, "grammars"),
    "ebnf": _f(None, "refused", _STR, "grammars"),
    "structural_tag": _f(None, "refused", _STR, "grammars"),
    "ignore_eos": _f(False, "honoured", None, ""),
    "skip_special_tokens": _f(True, "honoured", None, ""),
    "spaces_between_special_tokens": _f(True, "ignored", _BOOL, "decoding follows the tokenizer's own setting"),
    "no_stop_trim": _f(False, "honoured", None, ""),
    "stream_interval": _f(None, "honoured", None, ""),
    "logit_bias": _f(None, "refused", _DICT, "logit bias (`{}` counts as unset)"),
    "sampling_seed": _f(None, "honoured", None, ""),
    "custom_params": _f(None, "ignored", _DICT, "read only by custom logit processors, which are refused"),
    # internal fields of SGLang's struct: set by SGLang itself, accepted here at their defaults
    "stop_strs": _f(None, "refused", None, "internal to SGLang"),
    "stop_regex_strs": _f(None, "refused", None, "internal to SGLang"),
    "stop_str_max_len": _f(0, "refused", None, "internal to SGLang"),
    "stop_regex_max_len": _f(0, "refused", None, "internal to SGLang"),
    "is_normalized": _f(False, "refused", None, "internal to SGLang"),
}  # fmt: skip

# Values SGLang treats as unset although they differ from the default.
_UNSET_ALIASES: dict[str, tuple[Any, ...]] = {
    "json_schema": ("",), "regex": ("",), "ebnf": ("",), "structural_tag": ("",), "logit_bias": ({},),
}  # fmt: skip


class FieldTypeError(Exception):
    """A field of the wrong JSON type: SGLang's pydantic check answers 400 (ErrorResponse body)."""


def is_default(value: Any, default: Any) -> bool:
    """Absent/null, equal to the default, or a (per-prompt) list of defaults."""
    if value is None or _same(value, default):
        return True
    return isinstance(value, list) and all(is_default(v, default) for v in value)


def _same(value: Any, default: Any) -> bool:
    if isinstance(value, bool) or isinstance(default, bool):  # in Python `0 == False`; not in JSON
        return isinstance(value, bool) and isinstance(default, bool) and value == default
    return bool(value == default)


def refusals(body: dict[str, Any]) -> list[str]:
    """Check the types of the fields _app does not parse; return one message per refused value."""
    return _check(body, GENERATE_FIELDS, prefix="")


def sampling_refusals(params: dict[str, Any]) -> list[str]:
    """The same for one sampling_params dict (unknown keys are left to the caller)."""
    return _check(params, SAMPLING_FIELDS, prefix="sampling_params.")


def _check(body: dict[str, Any], table: dict[str, Field], prefix: str) -> list[str]:
    refused = []
    for name, value in body.items():
        spec = table.get(name)
        if spec is None or value is None or spec.treatment == "honoured":
            continue
        if spec.types is not None and not _has_type(value, spec.types):
            raise FieldTypeError(f"Input should be of type {'/'.join(t.__name__ for t in spec.types)}: "
                                 f"body.{prefix}{name} (got {value!r:.80})")  # fmt: skip
        if spec.treatment == "refused" and not _unset(name, value, spec.default):
            refused.append(
                f"{prefix}{name}={_json(value)} is not supported by the rlgen CPU backend "
                f"(only its default, {_json(spec.default)}, is accepted)"
            )
    return refused


def _unset(name: str, value: Any, default: Any) -> bool:
    return is_default(value, default) or any(_same(value, alias) for alias in _UNSET_ALIASES.get(name, ()))


def _has_type(value: Any, types: tuple[type, ...]) -> bool:
    if isinstance(value, bool):
        return bool in types
    if isinstance(value, int) and float in types:
        return True
    return isinstance(value, types)


def _json(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 80 else text[:77] + "..."
