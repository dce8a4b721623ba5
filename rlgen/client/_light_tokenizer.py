"""A transformers tokenizer's state, frozen and served without transformers: `LightTokenizer`.

Owns: `LightTokenizer` (encode, decode, the chat template and the special tokens of a tokenizer that
transformers loaded once, from its Rust backend's JSON and a few attributes, with `tokenizers` and
jinja2 alone) and the Jinja environment its chat templates render in (rebuilt as the snapshot's
transformers had it). Knows nothing about how a snapshot is taken or vouched for
(`_tokenizer_snapshot`), where it is stored, servers, prompts' forms or results.

A `LightTokenizer` answers what rlgen and most code ask of a tokenizer (`tok(texts)`, `encode`,
`decode`, `batch_decode`, `tokenize`, `convert_*`, `apply_chat_template` on plain JSON messages,
`len`, `get_vocab`, the special tokens and their ids) itself, exactly as the transformers tokenizer
would. Anything else, and any of those calls with an option it does not handle (padding, tensors,
`documents=`, `continue_final_message`, a message holding None or objects, ...), goes to the
transformers tokenizer (`.hf`), loaded on first use: the same answer, at the price of transformers'
imports once. It is read-only: change special tokens on `.hf`.
"""

from __future__ import annotations

import functools
import importlib
import json
import threading
from datetime import datetime
from typing import Any

__all__ = ["SPECIAL_NAMES", "LightEncoding", "LightTokenizer"]

SPECIAL_NAMES = ("bos", "eos", "unk", "sep", "pad", "cls", "mask")
# Options of transformers' apply_chat_template that the light path leaves to transformers.
_HF_CHAT_OPTIONS = frozenset({"padding", "truncation", "max_length", "return_tensors", "return_assistant_tokens_mask",
                              "tokenizer_kwargs", "sanitize_control_tokens", "return_dict"})
_STATE_KEYS = frozenset({"class", "name_or_path", "model_max_length", "padding_side", "truncation_side",
                         "model_input_names", "clean_up_tokenization_spaces", "split_special_tokens", "chat_template",
                         "special", "special_tokens_map", "all_special_tokens", "all_special_ids", "jinja"})
# Message keys whose handling changed between transformers versions (aliased into each other).
_REASONING = frozenset({"reasoning_content", "thinking", "reasoning"})


class LightEncoding(dict[str, Any]):
    """What `tok(text)` returns: a dict (`input_ids`, `attention_mask`, ...) whose keys read as attributes too."""

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None


class LightTokenizer:
    """A tokenizer that transformers loaded once, served from its frozen state (module docstring)."""

    def __init__(self, state: dict[str, Any], backend: Any, *, hf: Any = None) -> None:
        from tokenizers import Tokenizer

        missing = _STATE_KEYS - state.keys()
        if missing:
            raise ValueError(f"a LightTokenizer state lacks {sorted(missing)}")
        tok = Tokenizer.from_str(backend) if isinstance(backend, str) else backend
        # What transformers' own calls do before they encode: no truncation or padding unless
        # asked (rlgen never asks), special tokens split or not as the tokenizer says.
        tok.no_truncation()
        tok.no_padding()
        tok.encode_special_tokens = bool(state["split_special_tokens"])
        object.__setattr__(self, "_state", state)
        object.__setattr__(self, "_backend", tok)
        object.__setattr__(self, "_hf", hf)
        object.__setattr__(self, "_lock", threading.Lock())

    # -- what transformers would answer, from the frozen state ---------------------------------------
    @property
    def name_or_path(self) -> str:
        return str(self._state["name_or_path"])

    @property
    def model_max_length(self) -> int:
        return int(self._state["model_max_length"])

    @property
    def padding_side(self) -> str:
        return str(self._state["padding_side"])

    @property
    def truncation_side(self) -> str:
        return str(self._state["truncation_side"])

    @property
    def model_input_names(self) -> list[str]:
        return list(self._state["model_input_names"])

    @property
    def clean_up_tokenization_spaces(self) -> bool:
        return bool(self._state["clean_up_tokenization_spaces"])

    @property
    def split_special_tokens(self) -> bool:
        return bool(self._state["split_special_tokens"])

    @property
    def chat_template(self) -> str | dict[str, str] | None:
        template = self._state["chat_template"]
        return dict(template) if isinstance(template, dict) else template

    @property
    def special_tokens_map(self) -> dict[str, Any]:
        return json.loads(json.dumps(self._state["special_tokens_map"]))  # type: ignore[no-any-return]

    @property
    def all_special_tokens(self) -> list[str]:
        return list(self._state["all_special_tokens"])

    @property
    def all_special_ids(self) -> list[int]:
        return list(self._state["all_special_ids"])

    @property
    def is_fast(self) -> bool:
        return True

    @property
    def backend_tokenizer(self) -> Any:
        """The Rust tokenizer (`tokenizers.Tokenizer`), as transformers' `backend_tokenizer`."""
        return self._backend

    @property
    def vocab_size(self) -> int:
        return int(self._backend.get_vocab_size(with_added_tokens=False))

    def __len__(self) -> int:
        return int(self._backend.get_vocab_size(with_added_tokens=True))

    def __bool__(self) -> bool:
        return True

    def get_vocab(self) -> dict[str, int]:
        return dict(self._backend.get_vocab(with_added_tokens=True))

    def _special_token(self, name: str) -> str | None:
        value = self._state["special"].get(name)
        return None if value is None else str(value)

    def _special_id(self, name: str) -> int | None:
        token = self._special_token(name)
        return None if token is None else self.convert_tokens_to_ids(token)

    bos_token = property(lambda self: self._special_token("bos"))
    eos_token = property(lambda self: self._special_token("eos"))
    unk_token = property(lambda self: self._special_token("unk"))
    sep_token = property(lambda self: self._special_token("sep"))
    pad_token = property(lambda self: self._special_token("pad"))
    cls_token = property(lambda self: self._special_token("cls"))
    mask_token = property(lambda self: self._special_token("mask"))
    bos_token_id = property(lambda self: self._special_id("bos"))
    eos_token_id = property(lambda self: self._special_id("eos"))
    unk_token_id = property(lambda self: self._special_id("unk"))
    sep_token_id = property(lambda self: self._special_id("sep"))
    pad_token_id = property(lambda self: self._special_id("pad"))
    cls_token_id = property(lambda self: self._special_id("cls"))
    mask_token_id = property(lambda self: self._special_id("mask"))

    def convert_tokens_to_ids(self, tokens: Any) -> Any:
        if tokens is None:
            return None
        if isinstance(tokens, str):
            index = self._backend.token_to_id(tokens)
            return self._special_id("unk") if index is None and tokens != self._special_token("unk") else index
        return [self.convert_tokens_to_ids(t) for t in tokens]

    def convert_ids_to_tokens(self, ids: Any, skip_special_tokens: bool = False) -> Any:
        if isinstance(ids, int):
            return self._backend.id_to_token(ids)
        skip = set(self._state["all_special_ids"]) if skip_special_tokens else set()
        return [self._backend.id_to_token(int(i)) for i in ids if int(i) not in skip]

    def __call__(self, text: Any = None, *args: Any, add_special_tokens: bool = True, **kwargs: Any) -> Any:
        batched = isinstance(text, (list, tuple))
        texts = list(text) if batched else [text]
        if args or kwargs or not texts or not all(isinstance(t, str) for t in texts):
            return self.hf(text, *args, add_special_tokens=add_special_tokens, **kwargs)
        encodings = self._backend.encode_batch(texts, add_special_tokens=add_special_tokens)
        names = self._state["model_input_names"]
        out = LightEncoding(input_ids=[e.ids for e in encodings])
        if "token_type_ids" in names:
            out["token_type_ids"] = [e.type_ids for e in encodings]
        if "attention_mask" in names:
            out["attention_mask"] = [e.attention_mask for e in encodings]
        return out if batched else LightEncoding({k: v[0] for k, v in out.items()})

    def encode(self, text: Any, *args: Any, add_special_tokens: bool = True, **kwargs: Any) -> Any:
        if args or kwargs or not isinstance(text, str):
            return self.hf.encode(text, *args, add_special_tokens=add_special_tokens, **kwargs)
        return list(self._backend.encode(text, add_special_tokens=add_special_tokens).ids)

    def tokenize(self, text: Any, *args: Any, add_special_tokens: bool = False, **kwargs: Any) -> Any:
        if args or kwargs or not isinstance(text, str):
            return self.hf.tokenize(text, *args, add_special_tokens=add_special_tokens, **kwargs)
        return list(self._backend.encode(text, add_special_tokens=add_special_tokens).tokens)

    def decode(self, token_ids: Any, skip_special_tokens: bool = False, clean_up_tokenization_spaces: bool | None = None,
               **kwargs: Any) -> Any:
        cleanup = self._state["clean_up_tokenization_spaces"] if clean_up_tokenization_spaces is None \
            else clean_up_tokenization_spaces
        ids = _int_list(token_ids)
        if kwargs or cleanup or ids is None:  # transformers' clean-up rules differ by version: its own call
            return self.hf.decode(token_ids, skip_special_tokens=skip_special_tokens,
                                  clean_up_tokenization_spaces=clean_up_tokenization_spaces, **kwargs)
        return str(self._backend.decode(ids, skip_special_tokens=skip_special_tokens))

    def batch_decode(self, sequences: Any, skip_special_tokens: bool = False,
                     clean_up_tokenization_spaces: bool | None = None, **kwargs: Any) -> list[str]:
        cleanup = self._state["clean_up_tokenization_spaces"] if clean_up_tokenization_spaces is None \
            else clean_up_tokenization_spaces
        seqs = sequences if isinstance(sequences, list) else None
        if not kwargs and not cleanup and seqs is not None and all(type(s) is list for s in seqs):
            try:  # lists of ints: one call to the Rust backend, which decodes them in parallel
                return [str(t) for t in self._backend.decode_batch(seqs, skip_special_tokens=skip_special_tokens)]
            except TypeError:  # not all ints: each through decode()'s own conversion
                pass
        return [self.decode(s, skip_special_tokens=skip_special_tokens,
                            clean_up_tokenization_spaces=clean_up_tokenization_spaces, **kwargs) for s in sequences]

    def get_chat_template(self, chat_template: str | None = None, tools: list[dict[str, Any]] | None = None) -> str:
        """The template `apply_chat_template` uses (transformers' rules for a dict of named templates)."""
        own = self._state["chat_template"]
        if isinstance(own, dict):
            if chat_template is not None and chat_template in own:
                return str(own[chat_template])
            if chat_template is None:
                if tools is not None and "tool_use" in own:
                    return str(own["tool_use"])
                if "default" in own:
                    return str(own["default"])
                return str(self.hf.get_chat_template(chat_template, tools))  # transformers' error
        elif chat_template is None:
            if own is None:
                return str(self.hf.get_chat_template(chat_template, tools))  # transformers' error
            return str(own)
        return chat_template

    def apply_chat_template(self, conversation: Any, tools: Any = None, documents: Any = None,
                            chat_template: str | None = None, add_generation_prompt: bool = False,
                            continue_final_message: bool | str = False, tokenize: bool = True, **kwargs: Any) -> Any:
        """transformers' `apply_chat_template`: rendered here for plain JSON messages, tools and template
        variables, as text (`tokenize=False`) or ids (`tokenize=True, return_dict=False`); the rest
        goes to transformers."""
        batched = isinstance(conversation, (list, tuple)) and bool(conversation) \
            and isinstance(conversation[0], (list, tuple))
        chats = list(conversation) if batched else [conversation]
        variables = {k: v for k, v in kwargs.items() if k not in _HF_CHAT_OPTIONS}
        light = (
            documents is None and not continue_final_message
            and (not tokenize or kwargs.get("return_dict", True) is False)
            and set(kwargs) - set(variables) <= {"return_dict"}
            and (tools is None or (type(tools) is list and all(type(t) is dict and _plain(t) for t in tools)))
            and _plain(variables) and chats
            and all(type(c) in (list, tuple) and c and all(_plain_message(m) for m in c) for c in chats)
            and (chat_template is not None or self._state["chat_template"] is not None)
        )
        template = self.get_chat_template(chat_template, tools) if light else None
        if template is None:
            return self.hf.apply_chat_template(
                conversation, tools=tools, documents=documents, chat_template=chat_template,
                add_generation_prompt=add_generation_prompt, continue_final_message=continue_final_message,
                tokenize=tokenize, **kwargs)
        compiled = _compile(template, tuple(tuple(pair) for pair in self._state["jinja"]))
        names = {**self._state["special_tokens_map"], **variables}
        rendered = [compiled.render(messages=[dict(m) for m in chat], tools=tools, documents=None,
                                    add_generation_prompt=add_generation_prompt, **names) for chat in chats]
        out: list[Any] = rendered
        if tokenize:
            out = [list(e.ids) for e in self._backend.encode_batch(rendered, add_special_tokens=False)]
        return out if batched else out[0]

    # -- the transformers tokenizer, for everything else ---------------------------------------------
    @property
    def hf(self) -> Any:
        """The transformers tokenizer these answers come from, loaded on first use (transformers' imports)."""
        with self._lock:
            if self._hf is None:
                module, name = self._state["class"]
                cls = getattr(importlib.import_module(module), name)
                object.__setattr__(self, "_hf", cls.from_pretrained(self._state["name_or_path"]))
            return self._hf

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self.hf, name)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"a LightTokenizer is read-only (setting {name!r}); change the transformers "
                             "tokenizer `.hf`, or pass Engine(tokenizer=...) your own")

    def __reduce__(self) -> tuple[Any, ...]:
        return (LightTokenizer, (self._state, self._backend.to_str()))

    def __repr__(self) -> str:
        return (f"LightTokenizer(name_or_path={self.name_or_path!r}, vocab={len(self)}, "
                f"as {self._state['class'][1]}; other attributes load it: .hf)")


def _int_list(token_ids: Any) -> list[int] | None:
    if isinstance(token_ids, int):
        return [token_ids]
    if isinstance(token_ids, (str, bytes, dict)):
        return None
    try:
        return [int(t) for t in token_ids]
    except (TypeError, ValueError):
        return None


def _plain(value: Any) -> bool:
    """Plain JSON (str, int, float, bool, lists, dicts with str keys; None inside): what every
    transformers version hands a template unchanged."""
    kind = type(value)
    if kind in (str, int, float, bool) or value is None:
        return True
    if kind is list:
        return all(_plain(v) for v in value)
    if kind is dict:
        return all(type(k) is str and _plain(v) for k, v in value.items())
    return False


def _plain_message(message: Any) -> bool:
    return (type(message) is dict and not _REASONING & message.keys()
            and all(type(k) is str and v is not None and _plain(v) for k, v in message.items()))


@functools.lru_cache(maxsize=16)
def _compile(template: str, profile: tuple[tuple[str, Any], ...]) -> Any:
    """`template` compiled in the chat-template environment of the transformers that made the
    snapshot, as `profile` (`_jinja_profile`) describes it: its sandbox, trim_blocks, lstrip_blocks,
    and whichever of its additions it had (loop controls, `{% generation %}` blocks, tojson,
    raise_exception, strftime_now, a restricted dict, a namespace refusing underscore names)."""
    import jinja2
    import jinja2.ext
    import jinja2.nodes
    import jinja2.utils
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    has = dict(profile)

    class Generation(jinja2.ext.Extension):  # `{% generation %}...{% endgeneration %}` renders its body
        tags = {"generation"}  # noqa: RUF012  (jinja2 declares it a set)

        def parse(self, parser: Any) -> Any:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

        def _body(self, caller: Any) -> Any:
            return caller()

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None,
               sort_keys: bool = False) -> str:
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt: str) -> str:
        return datetime.now().strftime(fmt)

    class TemplateDict:
        def __call__(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
            return dict(*args, **kwargs)

        def fromkeys(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
            return dict.fromkeys(*args, **kwargs)

    class TemplateNamespace(jinja2.utils.Namespace):
        def __init__(*args: Any, **kwargs: Any) -> None:
            self, args = args[0], args[1:]
            for name in dict(*args, **kwargs):
                TemplateNamespace._check_name(name)
            jinja2.utils.Namespace.__init__(self, dict(*args, **kwargs))

        def __setitem__(self, name: str, value: Any) -> None:
            TemplateNamespace._check_name(name)
            jinja2.utils.Namespace.__setitem__(self, name, value)

        @staticmethod
        def _check_name(name: Any) -> None:
            if isinstance(name, str) and name.startswith("_"):
                raise jinja2.exceptions.SecurityError(
                    f"Chat templates cannot store underscore-prefixed attributes on a namespace, but got {name!r}.")

    extensions: list[Any] = [Generation] if has["generation"] else []
    extensions += [jinja2.ext.loopcontrols] if has["loopcontrols"] else []
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=extensions)
    env.filters["tojson"] = tojson
    if has["raise_exception"]:
        env.globals["raise_exception"] = raise_exception
    if has["strftime_now"]:
        env.globals["strftime_now"] = strftime_now
    if has["dict"] == "restricted":
        env.globals["dict"] = TemplateDict()
    if has["namespace"] == "checked":
        env.globals["namespace"] = TemplateNamespace
    return env.from_string(template)
