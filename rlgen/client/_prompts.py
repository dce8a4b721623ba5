"""Prompts in, token ids out: the user's prompt forms, normalised and checked before anything is sent.

Owns: recognising the accepted prompt forms (a string, a list of strings, a list of token-id lists,
one chat conversation or a list of them), rendering chats with the model's chat template,
tokenizing on the client (so rlgen always knows each prompt's exact token ids, the left half of
every row's tensors), and the checks that need the tokenizer (vocabulary range, context length).
Knows nothing about HTTP or results.
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["CHAT_ROLES", "PromptBatch", "normalize_prompts", "prompt_data"]

# The message roles chat templates render (OpenAI's names, plus Llama 3.1's "ipython"). Anything
# else is a typo that most templates would render silently into the prompt.
CHAT_ROLES = ("system", "user", "assistant", "tool", "developer", "function", "ipython")


@dataclass
class PromptBatch:
    """Normalised prompts: what to send and what to show."""

    kind: str                    # "text", "ids" or "chat"
    ids: list[list[int]]         # token ids, exactly what the server gets
    texts: list[str | None]      # the prompt as text (rendered chat for "chat"; None for "ids")
    chats: list[list[dict[str, Any]]] | None = None  # the messages as given, for "chat"
    data: dict[str, list[Any]] = field(default_factory=dict)  # per-prompt columns (generate's `data=`)

    def __len__(self) -> int:
        return len(self.ids)


def _kind_of(item: Any) -> str:
    if isinstance(item, str):
        return "text"
    if isinstance(item, dict):
        return "message"
    if isinstance(item, (list, tuple)):
        # the set of element types, computed in C (map(type)), rather than an isinstance per token
        types = set(map(type, item))
        if types and all(issubclass(t, int) and t is not bool for t in types):
            return "ids"
        if item and all(isinstance(m, dict) for m in item):
            return "chat"
        if not item:
            raise ValueError("a prompt is empty (an empty list of token ids or messages); remove it or give it content")
    raise TypeError(
        f"cannot read a prompt of type {type(item).__name__}; pass a string, a list of token ids, "
        "or a chat as a list of {'role': ..., 'content': ...} messages"
    )


def normalize_prompts(prompts: Any, *, tokenizer: Any, vocab_size: int, context_length: int | None,
                      max_new_tokens: int) -> PromptBatch:
    """Turn the user's `prompts` into token ids, checking them on the way.

    `vocab_size` is `len(tokenizer)`, computed once by the caller: on some `tokenizers` versions
    len() rebuilds the whole vocabulary, too slow to pay on every call.

    Raises:
        TypeError: a prompt of an unreadable type, or a mix of prompt forms.
        ValueError: no prompts, an empty prompt, token ids outside the vocabulary, or a prompt that
            with `max_new_tokens` does not fit the model's context.
    """
    # 1) Recognise the form: one prompt or a list of them.
    if isinstance(prompts, str):
        items: Sequence[Any] = [prompts]
    elif isinstance(prompts, (list, tuple)):
        if not prompts:
            raise ValueError("prompts is empty; pass at least one prompt")
        head = prompts[0]
        # A list of ints is one prompt of token ids; a list of messages is one chat.
        single = isinstance(head, dict) or (isinstance(head, int) and not isinstance(head, bool))
        items = [prompts] if single else prompts
    else:
        raise TypeError(f"prompts must be a string or a list, got {type(prompts).__name__}")
    kinds = {_kind_of(item) for item in items}
    if len(kinds) > 1:
        raise TypeError(f"prompts mix forms ({', '.join(sorted(kinds))}); pass one form per call")
    kind = kinds.pop()

    # 2) Tokenize on the client, in one batched call.
    if kind == "text":
        if any(not item for item in items):
            raise ValueError("a prompt is the empty string; remove it or give it content")
        texts: list[str | None] = list(items)
        ids = [list(x) for x in tokenizer(list(items), add_special_tokens=True)["input_ids"]]
    elif kind == "chat":
        for conv in items:
            _check_chat(conv)
        rendered = tokenizer.apply_chat_template([list(c) for c in items], add_generation_prompt=True, tokenize=False)
        texts = list(rendered)
        # The template already contains any BOS: do not add special tokens again.
        ids = [list(x) for x in tokenizer(list(rendered), add_special_tokens=False)["input_ids"]]
    else:
        ids = [list(x) for x in items]
        texts = [None] * len(ids)

    # 3) Check what the server would reject, naming the prompt.
    for i, row in enumerate(ids):
        if not row:
            raise ValueError(f"prompt {i} has no tokens")
        if kind == "ids":
            low, high = min(row), max(row)
            if low < 0 or high >= vocab_size:
                raise ValueError(f"prompt {i} has token id {high if high >= vocab_size else low} outside the vocabulary [0, {vocab_size})")
        if context_length is not None and len(row) + max_new_tokens > context_length:
            raise ValueError(
                f"prompt {i} has {len(row)} tokens; with max_new_tokens={max_new_tokens} that exceeds the "
                f"model's context of {context_length} tokens. Shorten the prompt or lower max_new_tokens."
            )
    chats = [[dict(m) for m in conv] for conv in items] if kind == "chat" else None
    return PromptBatch(kind=kind, ids=ids, texts=texts, chats=chats)


def _check_chat(conv: Sequence[Any]) -> None:
    for message in conv:
        if not isinstance(message, dict) or "role" not in message or "content" not in message:
            raise TypeError(f"a chat message must be a dict with 'role' and 'content', got {message!r}")
        role = message["role"]
        if role not in CHAT_ROLES:
            guess = difflib.get_close_matches(str(role).lower(), CHAT_ROLES, n=1, cutoff=0.5)
            hint = f"did you mean {guess[0]!r}? " if guess else ""
            raise ValueError(f"unknown chat role {role!r}; {hint}roles are {', '.join(map(repr, CHAT_ROLES))}")


def prompt_data(data: Any, n_prompts: int, *, reserved: Sequence[str]) -> dict[str, list[Any]]:
    """The user's per-prompt data as columns, one value per prompt.

    `data`: a DataFrame with a row per prompt (its index is ignored), a list of dicts (one per
    prompt; a key missing from a dict gives None), or a dict of lists.

    Raises:
        TypeError: `data` is none of those, or a column name is not a string.
        ValueError: its number of rows is not the number of prompts, or a column would replace
            one of `reserved` (rlgen's own columns).
    """
    if data is None:
        return {}
    if hasattr(data, "columns") and hasattr(data, "to_dict"):  # a pandas DataFrame
        columns = {c: list(data[c]) for c in data.columns}
        rows = len(data)
    elif isinstance(data, dict):
        columns = {c: list(v) if isinstance(v, (list, tuple)) or hasattr(v, "tolist") else v for c, v in data.items()}
        bad = [c for c, v in columns.items() if not isinstance(v, list)]
        if bad:
            raise TypeError(f"data as a dict must map column names to lists (one value per prompt); {bad[0]!r} is not")
        lengths = {len(v) for v in columns.values()}
        if len(lengths) > 1:
            raise ValueError(f"data's columns have different lengths {sorted(lengths)}; give one value per prompt")
        rows = lengths.pop() if lengths else n_prompts
    elif isinstance(data, (list, tuple)):
        if not all(isinstance(row, dict) for row in data):
            raise TypeError("data as a list must hold one dict per prompt, e.g. [{'answer': '4'}, ...]")
        names = list(dict.fromkeys(k for row in data for k in row))
        columns = {c: [row.get(c) for row in data] for c in names}
        rows = len(data)
    else:
        raise TypeError(f"data must be a DataFrame, a list of dicts or a dict of lists, got {type(data).__name__}")
    if rows != n_prompts:
        raise ValueError(f"data has {rows} rows for {n_prompts} prompts; give one row per prompt (in prompt order)")
    for name in columns:
        if not isinstance(name, str):
            raise TypeError(f"data's column names must be strings, got {name!r}")
    clash = sorted(set(columns) & set(reserved))
    if clash:
        raise ValueError(f"data's columns {clash} would replace rlgen's own; rename them (e.g. 'gold_{clash[0]}'). "
                         f"Names rlgen writes itself: {', '.join(reserved)}")
    return columns
