"""Request parsing and validation for the CPU backend's routes, as SGLang 0.5.x does it.

Owns: decoding a JSON body, the type checks FastAPI/pydantic runs on a body (a wrong type is a
`RequestValidationError`, which the routes answer with 400 and SGLang's ErrorResponse body), the
bodies of /pause_generation and /continue_generation, and
turning a /generate body into a `Plan`: SGLang's `GenerateReqInput` normalization (single or
batch, text or input_ids, rids, per-prompt lists, n samples, each prompt's LoRA adapter),
tokenization, the `SamplingParams.verify` rules and the context-length checks, each failure a
ValueError with SGLang's message. The shapes follow docs/sglang-api.md; section numbers in comments refer to it.
Knows nothing about aiohttp, responses, the runner or the scheduler thread: it reads bytes and
dicts, takes the tokenizer and the model's limits as arguments, and returns `Job`s (with a
placeholder sink) and the per-output `Item`s the response needs.
"""

from __future__ import annotations

import math
import uuid
from dataclasses import dataclass, replace
from typing import Any, cast

import orjson

from rlgen.cpu_server._fields import SAMPLING_FIELDS, FieldTypeError, refusals, sampling_refusals
from rlgen.cpu_server._jobs import Job, SamplingParams, SeqOutput

__all__ = [
    "PAUSE_MODES", "Item", "Plan", "RequestValidationError", "check_generate_types", "continue_body",
    "max_req_input_len", "memory_tags_body", "parse_body", "pause_body", "plan_generate", "typed",
]  # fmt: skip

# PauseGenerationReqInput.mode's Literal, in SGLang's order.
PAUSE_MODES = ("abort", "retract", "in_place")


class RequestValidationError(Exception):
    """A wrong field type: SGLang (FastAPI/pydantic) answers 400 with its ErrorResponse body."""


# ---- body and field types -------------------------------------------------------------------------------


def parse_body(raw: bytes) -> Any:
    """A request body as JSON; an empty body is `{}`."""
    if not raw:
        return {}
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        raise RequestValidationError(f"JSON decode error: {e}") from e


def typed(
    body: dict[str, Any],
    name: str,
    types: tuple[type, ...],
    expected: str,
    *,
    items: tuple[type, ...] | None = None,
    required: bool = False,
) -> Any:
    if not isinstance(body, dict):
        raise RequestValidationError("Input should be a valid dictionary or object: body")
    if name not in body:
        if required:
            raise RequestValidationError(f"Field required: body.{name}")
        return None
    value = body[name]
    ok = isinstance(value, types) and not (isinstance(value, bool) and bool not in types)
    if ok and isinstance(value, list) and items is not None:
        ok = all(isinstance(v, items) and not (isinstance(v, bool) and bool not in items) for v in value)
    if not ok:
        raise RequestValidationError(f"Input should be {expected}: body.{name} (got {value!r:.80})")
    return value


def memory_tags_body(body: Any) -> list[str] | None:
    """The `tags` of a release/resume body (ReleaseMemoryOccupationReqInput); None means all."""
    return cast("list[str] | None", typed(body, "tags", (list, type(None)), "a list of strings", items=(str,)))


def pause_body(raw: bytes) -> str:
    """The mode of a /pause_generation body (PauseGenerationReqInput): "abort" when absent, so `{}`
    means abort. SGLang's route takes the body as a required `Body()`, so a request without one
    is 400 "Field required", and a mode outside the Literal (null included) is 400 too."""
    body = _required_body(raw)
    if "mode" not in body:
        return "abort"
    mode = body["mode"]
    if not isinstance(mode, str) or mode not in PAUSE_MODES:
        raise RequestValidationError(f"Input should be 'abort', 'retract' or 'in_place': body.mode (got {mode!r:.80})")
    return mode


def continue_body(raw: bytes) -> bool:
    """`torch_empty_cache` of a /continue_generation body (ContinueGenerationReqInput, default
    true; nothing to empty on the CPU). A request without a body is 400 "Field required"."""
    return typed(_required_body(raw), "torch_empty_cache", (bool,), "a valid boolean") is not False


def _required_body(raw: bytes) -> dict[str, Any]:
    if not raw.strip():
        raise RequestValidationError("Field required: body")
    body = parse_body(raw)
    if not isinstance(body, dict):
        raise RequestValidationError("Input should be a valid dictionary or object: body")
    return body


def _typed_input_ids(body: dict[str, Any]) -> list[Any] | None:
    value = body.get("input_ids")
    if value is None:
        return None

    def is_id(v: Any) -> bool:
        return isinstance(v, int) and not isinstance(v, bool)

    if isinstance(value, list) and (all(is_id(v) for v in value) or all(
        isinstance(row, list) and all(is_id(v) for v in row) for row in value
    )):  # fmt: skip
        return value
    raise RequestValidationError(f"Input should be a list of integers or a list of lists: body.input_ids (got {value!r:.80})")


# ---- /generate planning: SGLang's normalize_batch_and_arguments + per-request validation -------------


@dataclass
class Item:
    """Per-output settings needed to shape the response."""

    return_logprob: bool
    top_logprobs_num: int
    return_text_in_logprobs: bool
    log_metrics: bool = True
    prompt_token_ids: list[int] | None = None


@dataclass
class Plan:
    """A /generate request as runner jobs, and how to answer it."""

    is_single: bool
    jobs: list[Job]
    items: list[Item]  # aligned with jobs (already expanded for n, grouped by prompt)


def check_generate_types(body: Any) -> dict[str, Any]:
    """The pydantic type checks FastAPI runs on GenerateReqInput (wrong type: 400), and the fields
    of _fields.GENERATE_FIELDS at a value the CPU backend refuses (reported by plan_generate)."""
    if not isinstance(body, dict):
        raise RequestValidationError("Input should be a valid dictionary or object: body")
    try:
        refused = refusals(body)
    except FieldTypeError as e:
        raise RequestValidationError(str(e)) from e
    return {
        "refused": refused,
        "text": typed(body, "text", (str, list, type(None)), "a string or a list of strings", items=(str,)),
        "input_ids": _typed_input_ids(body),
        "sampling_params": typed(body, "sampling_params", (dict, list, type(None)), "an object or a list", items=(dict,)),
        "rid": typed(body, "rid", (str, list, type(None)), "a string or a list of strings", items=(str,)),
        "return_logprob": typed(body, "return_logprob", (bool, list, type(None)), "a boolean", items=(bool,)),
        "logprob_start_len": typed(body, "logprob_start_len", (int, list, type(None)), "an integer", items=(int,)),
        "top_logprobs_num": typed(body, "top_logprobs_num", (int, list, type(None)), "an integer", items=(int,)),
        "return_text_in_logprobs": typed(body, "return_text_in_logprobs", (bool, type(None)), "a boolean") or False,
        "stream": typed(body, "stream", (bool, type(None)), "a boolean") or False,
        "log_metrics": typed(body, "log_metrics", (bool, type(None)), "a boolean") is not False,
        "return_prompt_token_ids": typed(body, "return_prompt_token_ids", (bool, type(None)), "a boolean") or False,
        "routed_dp_rank": typed(body, "routed_dp_rank", (int, type(None)), "an integer"),
        "lora_path": typed(body, "lora_path", (str, list, type(None)), "a string or a list of strings",
                           items=(str, type(None))),
    }


def plan_generate(
    fields: dict[str, Any], tokenizer: Any, *, vocab_size: int, context_length: int, lora_ids: dict[str, str] | None = None
) -> Plan:
    """Normalize like GenerateReqInput, tokenize, validate, and expand n (1.2, 1.3).

    `fields` come from check_generate_types; `tokenizer` is the event loop's own; `lora_ids` maps
    each adapter name in `lora_path` to the id its jobs run under (None: no adapter asked for).
    """
    text, input_ids, sampling = fields["text"], fields["input_ids"], fields["sampling_params"]
    if fields["refused"]:
        raise ValueError("; ".join(fields["refused"]) + ".")
    dp_rank = fields["routed_dp_rank"]
    if dp_rank is not None and dp_rank != 0:  # SGLang's check, with dp_size 1
        raise ValueError(f"routed_dp_rank={dp_rank} out of range [0, 1)")
    if text is None and input_ids is None:
        raise ValueError("Either text, input_ids or input_embeds should be provided.")
    if text is not None:
        is_single = isinstance(text, str)
        batch_size = 1 if is_single else len(text)
    else:
        if len(input_ids) == 0:
            raise ValueError("input_ids cannot be empty.")
        is_single = isinstance(input_ids[0], int)
        batch_size = 1 if is_single else len(input_ids)

    if is_single:
        text = [text] if text is not None else None
        input_ids = [input_ids] if input_ids is not None else None
    n = _parallel_sample_num(sampling)
    if n > 1:
        is_single = False  # a single prompt with n > 1 becomes a batch of one (list response)

    # SGLang tokenizes `text` but generates from `input_ids` when both are given (1.2).
    prompts = input_ids if input_ids is not None else _tokenize(tokenizer, text)
    if len(prompts) != batch_size:
        raise ValueError("text and input_ids describe different batch sizes.")
    adapters = _per_prompt_lora(fields["lora_path"], lora_ids, batch_size, is_single and n == 1)
    rids = _per_prompt_rids(fields["rid"], batch_size, is_single)
    sampling_list = _per_prompt(sampling if sampling is not None else {}, batch_size, n, "sampling_params")
    logprob = _per_prompt(fields["return_logprob"], batch_size, n, "return_logprob", False)
    starts = _per_prompt(fields["logprob_start_len"], batch_size, n, "logprob_start_len", -1)
    tops = _per_prompt(fields["top_logprobs_num"], batch_size, n, "top_logprobs_num", 0)

    jobs: list[Job] = []
    items: list[Item] = []
    for i, prompt in enumerate(prompts):
        prompt = list(prompt)
        params = _sampling_params(sampling_list[i], prompt, vocab_size, context_length)
        start = _logprob_start(bool(logprob[i]), starts[i], len(prompt))
        if tops[i] < 0:
            raise ValueError(f"top_logprobs_num must be at least 0, got {tops[i]}.")
        for _ in range(n):
            # With n > 1 SGLang gives every sample a fresh rid and drops the caller's (1.2).
            rid = uuid.uuid4().hex if n > 1 else rids[i]
            jobs.append(
                Job(rid=rid, input_ids=prompt, params=params, sink=_no_sink, return_logprob=bool(logprob[i]),
                    logprob_start_len=start, top_logprobs_num=tops[i], stream=fields["stream"], lora_id=adapters[i])
            )  # fmt: skip
            items.append(Item(bool(logprob[i]), tops[i], bool(fields["return_text_in_logprobs"]), fields["log_metrics"],
                               prompt if fields["return_prompt_token_ids"] else None))  # fmt: skip
    return Plan(is_single=is_single, jobs=jobs, items=items)


def _tokenize(tokenizer: Any, texts: list[str]) -> list[list[int]]:
    if not texts:
        return []
    return [list(ids) for ids in tokenizer(texts)["input_ids"]]


def _parallel_sample_num(sampling: Any) -> int:
    if sampling is None:
        return 1
    if isinstance(sampling, dict):
        n = sampling.get("n", 1)
    else:
        if not sampling:
            return 1
        n = sampling[0].get("n", 1)
        if any(sp.get("n", 1) != n for sp in sampling):
            raise ValueError("The parallel_sample_num should be the same for all samples in sample params.")
    n = 1 if n is None else n
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ValueError(f"n must be a positive integer, got {n!r}.")
    return n


def _per_prompt_rids(rid: Any, batch_size: int, is_single: bool) -> list[str]:
    if is_single:
        return [rid if isinstance(rid, str) else uuid.uuid4().hex]
    if rid is None:
        return [uuid.uuid4().hex for _ in range(batch_size)]
    if isinstance(rid, str):  # SGLang 0.5.17 keeps a batch of one's rid as it is
        return [rid] if batch_size == 1 else [f"{rid}_{i}" for i in range(batch_size)]
    if len(rid) != batch_size:
        raise ValueError("The specified rids length mismatch with the batch_size for batch processing.")
    if len(set(rid)) != len(rid):
        duplicates = sorted({r for r in rid if rid.count(r) > 1})
        raise ValueError(f"Duplicate request IDs detected within the request: {duplicates}")
    return list(rid)


def _per_prompt_lora(lora_path: Any, lora_ids: dict[str, str] | None, batch_size: int, single: bool) -> list[str | None]:
    """Each prompt's adapter id (its n samples share it): a string names one adapter for every
    prompt, a list one per prompt (None: the base model), as IO `_normalize_lora_paths`."""
    if not lora_ids or not lora_path:
        return [None] * batch_size
    if isinstance(lora_path, str):
        return [lora_ids[lora_path]] * batch_size
    if single:  # SGLang passes the list on as one request's lora_id and fails in its scheduler
        raise ValueError("lora_path of a single request is a string, not a list.")
    if len(lora_path) != batch_size:  # SGLang: an IndexError (500) for a short list
        raise ValueError(f"The length of lora_path ({len(lora_path)}) should be equal to the batch size ({batch_size}).")
    return [None if name is None else lora_ids[name] for name in lora_path]


def _per_prompt(value: Any, batch_size: int, n: int, name: str, default: Any = None) -> list[Any]:
    """A scalar applies to every prompt; a list gives one value per prompt."""
    if value is None:
        return [default] * batch_size
    if not isinstance(value, list):
        return [value] * batch_size
    if n > 1 and name != "sampling_params":
        raise ValueError(f"Cannot use list {name} with parallel_sample_num > 1")
    if len(value) != batch_size:
        # SGLang fails here with an IndexError (HTTP 500); a clear 400 serves callers better.
        raise ValueError(f"The length of {name} ({len(value)}) should be equal to the batch size ({batch_size}).")
    return value


def _logprob_start(return_logprob: bool, start: int, prompt_len: int) -> int:
    """Resolve logprob_start_len like SGLang's scheduler (1.6)."""
    if start == -1 or not return_logprob:
        return prompt_len - 1
    if start < 0:
        raise ValueError(f"logprob_start_len must be -1 or at least 0, got {start}.")
    if start >= prompt_len:
        raise ValueError(
            f"req.logprob_start_len={start} is higher than the number of input tokens "
            f"len(req.origin_input_ids)={prompt_len}. Please use a smaller logprob_start_len."
        )
    return start


def max_req_input_len(context_length: int) -> int:
    # SGLang: max_req_len = context_len - 1, max_req_input_len = max_req_len - 5.
    return context_length - 1 - 5


def _sampling_params(raw: dict[str, Any], prompt: list[int], vocab_size: int, context_length: int) -> SamplingParams:
    """SGLang's SamplingParams.__post_init__ + verify(), plus the length checks (1.4)."""
    _check_prompt(prompt, vocab_size)
    unknown = sorted(set(raw) - set(SAMPLING_FIELDS))
    if unknown:
        raise ValueError(f"Unknown sampling parameters: {unknown}")
    try:
        refused = sampling_refusals(raw)
    except FieldTypeError as e:  # SGLang: a TypeError in SamplingParams (500); here a ValueError (400)
        raise ValueError(str(e)) from e
    if refused:
        raise ValueError("; ".join(refused) + ".")

    # These raise ValueError, not TypeError: the route turns ValueError into SGLang's 400 body.
    def number(name: str, default: float) -> float:
        value = raw.get(name)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"sampling_params.{name} must be a number, got {value!r}.")
        return float(value)

    def integer(name: str, default: int | None) -> int | None:
        value = raw.get(name)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"sampling_params.{name} must be an integer, got {value!r}.")
        return value

    def flag(name: str, default: bool) -> bool:
        value = raw.get(name)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise ValueError(f"sampling_params.{name} must be a boolean, got {value!r}.")
        return value

    temperature = number("temperature", 1.0)
    top_k = integer("top_k", -1)
    assert top_k is not None
    if 0 <= temperature < 1e-6:  # SGLang: near-zero temperature means greedy
        temperature, top_k = 1.0, 1
    # An explicit null max_new_tokens means "up to the context length" (SGLang keeps None).
    max_new_tokens = integer("max_new_tokens", 128) if "max_new_tokens" not in raw or raw["max_new_tokens"] is not None else None
    params = SamplingParams(
        max_new_tokens=max_new_tokens,  # type: ignore[arg-type]  # None is resolved by _fit_context
        temperature=temperature,
        top_p=number("top_p", 1.0),
        top_k=top_k,
        min_p=number("min_p", 0.0),
        frequency_penalty=number("frequency_penalty", 0.0),
        presence_penalty=number("presence_penalty", 0.0),
        repetition_penalty=number("repetition_penalty", 1.0),
        min_new_tokens=integer("min_new_tokens", 0) or 0,
        stop=_stop_strings(raw.get("stop")),
        stop_token_ids=_stop_token_ids(raw.get("stop_token_ids")),
        ignore_eos=flag("ignore_eos", False),
        skip_special_tokens=flag("skip_special_tokens", True),
        no_stop_trim=flag("no_stop_trim", False),
        sampling_seed=integer("sampling_seed", None),
        stream_interval=integer("stream_interval", None) or 1,
    )
    _verify(params)
    return _fit_context(params, len(prompt), context_length)


def _check_prompt(prompt: list[int], vocab_size: int) -> None:
    if not prompt:
        raise ValueError("The input is empty: the prompt has no tokens.")
    if any(isinstance(t, bool) or not isinstance(t, int) or t < 0 or t >= vocab_size for t in prompt):
        raise ValueError(f"The input_ids {prompt} contains values greater than the vocab size ({vocab_size}).")


def _verify(p: SamplingParams) -> None:
    """SGLang's SamplingParams.verify(), same checks and messages."""
    if not math.isfinite(p.temperature) or p.temperature < 0.0:
        raise ValueError(f"temperature must be a non-negative finite number, got {p.temperature}.")
    if not 0.0 < p.top_p <= 1.0:
        raise ValueError(f"top_p must be in (0, 1], got {p.top_p}.")
    if not 0.0 <= p.min_p <= 1.0:
        raise ValueError(f"min_p must be in [0, 1], got {p.min_p}.")
    if p.top_k < 1 and p.top_k != -1:
        raise ValueError(f"top_k must be -1 (disable) or at least 1, got {p.top_k}.")
    if not -2.0 <= p.frequency_penalty <= 2.0:
        raise ValueError(f"frequency_penalty must be in [-2, 2], got {p.frequency_penalty}.")
    if not -2.0 <= p.presence_penalty <= 2.0:
        raise ValueError(f"presence_penalty must be in [-2, 2], got {p.presence_penalty}.")
    if not 0.0 < p.repetition_penalty <= 2.0:
        raise ValueError(f"repetition_penalty must be in (0, 2] (1.0 = no penalty), got {p.repetition_penalty}.")
    if not p.min_new_tokens >= 0:
        raise ValueError(f"min_new_tokens must be in [0, max_new_tokens], got {p.min_new_tokens}.")
    if p.max_new_tokens is not None:
        if p.max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be at least 0, got {p.max_new_tokens}.")
        if not p.min_new_tokens <= p.max_new_tokens:
            raise ValueError(
                f"min_new_tokens must be in [0, max_new_tokens({p.max_new_tokens})], got {p.min_new_tokens}."
            )


def _fit_context(p: SamplingParams, prompt_len: int, context_length: int) -> SamplingParams:
    """The tokenizer manager's length checks, then the scheduler's max_new_tokens clamp."""
    context = context_length
    if prompt_len >= context:
        raise ValueError(f"The input ({prompt_len} tokens) is longer than the model's context length ({context} tokens).")
    if p.max_new_tokens is not None and p.max_new_tokens + prompt_len > context:
        raise ValueError(
            f"Requested token count exceeds the model's maximum context length of {context} tokens. "
            f"You requested a total of {p.max_new_tokens + prompt_len} tokens: {prompt_len} tokens from the "
            f"input messages and {p.max_new_tokens} tokens for the completion. Please reduce the number of "
            "tokens in the input messages or the completion to fit within the limit."
        )
    limit = max_req_input_len(context_length)
    if prompt_len >= limit:
        raise ValueError(
            f"Input length ({prompt_len} tokens) exceeds the maximum allowed length ({limit} tokens). "
            "Use a shorter input or enable --allow-auto-truncate."
        )
    room = (context - 1) - prompt_len - 1
    wanted = p.max_new_tokens if p.max_new_tokens is not None else room
    return replace(p, max_new_tokens=max(0, min(wanted, room)))


def _stop_strings(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,) if value else ()
    if isinstance(value, list) and all(isinstance(s, str) for s in value):
        return tuple(s for s in value if s)
    raise ValueError(f"sampling_params.stop must be a string or a list of strings, got {value!r}.")


def _stop_token_ids(value: Any) -> frozenset[int]:
    if value is None:
        return frozenset()
    if isinstance(value, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in value):
        return frozenset(value)
    raise ValueError(f"sampling_params.stop_token_ids must be a list of integers, got {value!r}.")


def _no_sink(_: SeqOutput) -> None:  # replaced before submission
    pass

