"""Freezing a transformers tokenizer for `LightTokenizer`, and the probes that vouch for the frozen one.

Owns: `snapshot(hf)` (the state a `LightTokenizer` serves, taken from a loaded transformers
tokenizer: its Rust backend's JSON as transformers left it, special tokens, chat templates, limits,
and what transformers' chat-template environment has), the refusals (a class with encoding or
decoding rules of its own, an environment `LightTokenizer` cannot rebuild), and `differs(hf,
light)` (texts, decoding, vocabulary, special tokens and chat templates, which both must answer
alike before a snapshot is trusted). Knows nothing about where snapshots are stored, servers or results.
"""

from __future__ import annotations

import json
from typing import Any

from ._light_tokenizer import SPECIAL_NAMES, LightTokenizer

__all__ = ["differs", "snapshot"]


def _jinja_profile() -> tuple[tuple[str, Any], ...] | None:
    """What the installed transformers' chat-template environment has, read from the environment it
    compiles templates in, as `_compile` can rebuild it; None if it has anything else (another
    sandbox or options, a global, filter, test or extension `_compile` does not know, a tojson
    that answers differently): then no snapshot is served."""
    try:
        import jinja2
        import jinja2.runtime
        import jinja2.utils
        from jinja2.sandbox import ImmutableSandboxedEnvironment
        from transformers.utils import chat_template_utils

        env = chat_template_utils._compile_jinja_template("{{ 1 }}").environment
    except Exception:
        return None
    base = ImmutableSandboxedEnvironment()
    if (type(env) is not ImmutableSandboxedEnvironment or not (env.trim_blocks and env.lstrip_blocks)
            or env.keep_trailing_newline or env.autoescape or env.finalize is not None
            or env.undefined is not jinja2.runtime.Undefined):
        return None
    added = {k: v for k, v in env.globals.items() if base.globals.get(k) is not v}
    filters = {k for k, v in env.filters.items() if base.filters.get(k) is not v}
    tests = {k for k, v in env.tests.items() if base.tests.get(k) is not v}
    extensions = {name.rpartition(".")[2] for name in env.extensions}
    namespace, dict_ = added.pop("namespace", jinja2.utils.Namespace), added.pop("dict", dict)
    if (set(added) - {"raise_exception", "strftime_now"} or filters != {"tojson"} or tests
            or extensions - {"AssistantTracker", "LoopControlExtension"}):
        return None
    if namespace is not jinja2.utils.Namespace and not (
            isinstance(namespace, type) and issubclass(namespace, jinja2.utils.Namespace)
            and namespace.__name__ == "TemplateNamespace"):
        return None
    if dict_ is not dict and type(dict_).__name__ != "TemplateDict":
        return None
    sample = {"b": ["ü", 1.5, None, True], "a": "<&>"}
    tojson = env.filters["tojson"]
    options: list[dict[str, Any]] = [{}, {"indent": 2}, {"sort_keys": True}, {"separators": (",", ":")},
                                     {"ensure_ascii": True}]
    for kwargs in options:
        if tojson(sample, **kwargs) != json.dumps(sample, **{"ensure_ascii": False, **kwargs}):
            return None
    return (("raise_exception", "raise_exception" in added), ("strftime_now", "strftime_now" in added),
            ("dict", "builtin" if dict_ is dict else "restricted"),
            ("namespace", "jinja" if namespace is jinja2.utils.Namespace else "checked"),
            ("generation", "AssistantTracker" in extensions), ("loopcontrols", "LoopControlExtension" in extensions))


def snapshot(hf: Any) -> tuple[dict[str, Any], str]:
    """The state of transformers tokenizer `hf` a `LightTokenizer` serves (JSON-able), and its Rust
    backend as JSON.

    Raises:
        ValueError: saying why there is none: no Rust backend, a class that encodes or decodes by
            rules of its own (`_overrides`), a chat-template environment `_compile` does not
            rebuild, or a state that is not plain JSON.
    """
    backend = getattr(hf, "backend_tokenizer", None)
    if backend is None or not hasattr(backend, "to_str"):
        raise ValueError(f"{type(hf).__name__} has no Rust (tokenizers) backend")
    own = _overrides(type(hf))
    if own:
        raise ValueError(f"{type(hf).__name__} defines {', '.join(own)} itself")
    jinja = _jinja_profile()
    if jinja is None:
        raise ValueError("transformers' chat-template environment has parts LightTokenizer does not rebuild")
    try:
        state = {
            "class": [type(hf).__module__, type(hf).__name__],
            "name_or_path": str(hf.name_or_path),
            "model_max_length": int(hf.model_max_length),
            "padding_side": hf.padding_side,
            "truncation_side": hf.truncation_side,
            "model_input_names": list(hf.model_input_names),
            "clean_up_tokenization_spaces": bool(hf.clean_up_tokenization_spaces),
            "split_special_tokens": bool(getattr(hf, "split_special_tokens", False)),
            "chat_template": hf.chat_template,
            "special": {name: getattr(hf, f"{name}_token") for name in SPECIAL_NAMES},
            "special_tokens_map": hf.special_tokens_map,
            "all_special_tokens": list(hf.all_special_tokens),
            "all_special_ids": [int(i) for i in hf.all_special_ids],
            "jinja": [list(pair) for pair in jinja],
        }
        return json.loads(json.dumps(state)), str(backend.to_str())
    except (TypeError, ValueError, AttributeError) as err:
        raise ValueError(f"its state is not plain JSON ({type(err).__name__}: {err})") from err


# The methods a LightTokenizer answers for; a class that changes any of them (a model's own
# tokenizer class with its own encoding or decoding rules) is served by transformers instead.
_SERVED = ("__call__", "encode", "decode", "batch_decode", "tokenize", "convert_ids_to_tokens", "convert_tokens_to_ids",
           "apply_chat_template", "get_chat_template", "get_vocab", "__len__", "_encode_plus", "_batch_encode_plus",
           "_decode", "_convert_token_to_id_with_added_voc", "_convert_id_to_token")
_BASES = ("TokenizersBackend", "PreTrainedTokenizerFast")


def _overrides(cls: type) -> list[str]:
    """The served methods `cls` defines differently from the Rust-backed base class it derives from
    (all of them when it derives from none)."""
    base = next((b for b in cls.__mro__ if b.__name__ in _BASES and b.__module__.startswith("transformers.")), None)
    if base is None:
        return list(_SERVED)
    return [name for name in _SERVED if getattr(cls, name, None) is not getattr(base, name, None)]


_PROBE_TEXTS = (
    "Hello world", " leading space", "trailing space ", "\n\n", "a\n\nb\n", "\t tabs\tand  spaces  ",
    "The capital of France\n\nis Paris. Le café 日本 🙂!", "👩‍👩‍👧 ZWJ, ñ, ü, Ω, العربية, हिन्दी, 한국어",
    "x = [1, 2, 3]  # code\n    return f'{x!r}'", "12345678901234567890 3.14159 1e-9", "",
)
_PROBE_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "The city"}},
                   "required": ["city"]}}}


def _probe_chats(light: LightTokenizer) -> list[list[dict[str, Any]]]:
    special = "".join(light.all_special_tokens)
    return [
        [{"role": "user", "content": "What is 2+2?"}],
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi 日本 🙂\n\nthere"}],
        [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}, {"role": "user", "content": "c"}],
        [{"role": "user", "content": f"special tokens as text: {special}"}],
    ]


def _outcome(fn: Any, tok: Any) -> Any:
    try:
        return ("ok", fn(tok))
    except Exception:  # both failing alike is agreement: the same template raises the same way
        return ("error",)


def differs(hf: Any, light: LightTokenizer) -> str | None:
    """The first probe on which `light` answers unlike transformers tokenizer `hf`, or None: texts
    (with and without special tokens, alone and batched, every special token among them), decoding
    (with and without special tokens), vocabulary and special tokens, and the chat template (probe
    chats, with and without the generation prompt, text and ids, with a tool where the template reads
    `tools`)."""
    texts = [*_PROBE_TEXTS, "".join(light.all_special_tokens) + " mid" + "".join(light.all_special_tokens)]
    checks: list[tuple[str, Any]] = [
        ("len", lambda t: len(t)),
        ("vocab", lambda t: t.get_vocab()),
        ("special ids", lambda t: [getattr(t, f"{n}_token_id") for n in SPECIAL_NAMES]),
        ("special tokens", lambda t: [getattr(t, f"{n}_token") for n in SPECIAL_NAMES]),
        ("special map", lambda t: (t.special_tokens_map, t.all_special_tokens, t.all_special_ids)),
    ]
    for special in (True, False):
        checks.append((f"batch add_special_tokens={special}",
                       lambda t, s=special: {k: list(v) for k, v in t(texts, add_special_tokens=s).items()}))
        for text in texts:
            checks.append((f"text {text!r} add_special_tokens={special}",
                           lambda t, x=text, s=special: dict(t(x, add_special_tokens=s))))
            checks.append((f"tokenize {text!r}", lambda t, x=text: t.tokenize(x)))
    ids = hf(texts, add_special_tokens=True)["input_ids"]
    for row in ids:
        for skip in (False, True):
            checks.append((f"decode {row[:8]}... skip_special_tokens={skip}",
                           lambda t, r=row, s=skip: t.decode(r, skip_special_tokens=s, clean_up_tokenization_spaces=False)))
        checks.append((f"tokens of {row[:8]}...", lambda t, r=row: t.convert_ids_to_tokens(r)))
    template = light.chat_template
    templates = "".join(template.values()) if isinstance(template, dict) else (template or "")
    tool_sets: list[Any] = [None, [_PROBE_TOOL]] if "tools" in templates else [None]
    for chat in _probe_chats(light):
        for gen in (True, False):
            for tools in tool_sets:
                checks.append((f"chat {chat} add_generation_prompt={gen} tools={tools is not None}",
                               lambda t, c=chat, g=gen, tl=tools: t.apply_chat_template(
                                   c, tools=tl, add_generation_prompt=g, tokenize=False)))
                checks.append((f"chat ids {chat} add_generation_prompt={gen} tools={tools is not None}",
                               lambda t, c=chat, g=gen, tl=tools: list(t.apply_chat_template(
                                   c, tools=tl, add_generation_prompt=g, tokenize=True, return_dict=False))))
    checks.append(("chat batch", lambda t: t.apply_chat_template(_probe_chats(light), add_generation_prompt=True,
                                                                  tokenize=False)))
    for name, fn in checks:
        if _outcome(fn, hf) != _outcome(fn, light):
            return name
    return None
