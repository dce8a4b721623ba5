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
from dataclasses import dataclass
from typing import Any

__all__ = ["CHAT_ROLES", "PromptBatch", "normalize_prompts"]

# The message roles chat templates render (OpenAI's names, plus Llama 3.1's "ipython"). Anything
# else is a typo that most templates would render silently into the prompt.
CHAT_ROLES = ("system", "user", "assistant", "tool", "developer", "function", "ipython")


@dataclass
class PromptBatch:
    """Normalised prompts: what to send and what to show."""

    kind: str                    # "text", "ids" or "chat"
    ids: list[list[int]]         # token ids, exactly what the server gets
    texts: list[str | None]      # the prompt as text (rendered chat for "chat"; None for "ids")

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
    return PromptBatch(kind=kind, ids=ids, texts=texts)


def _check_chat(conv: Sequence[Any]) -> None:
    for message in conv:
        if not isinstance(message, dict) or "role" not in message or "content" not in message:
            raise TypeError(f"a chat message must be a dict with 'role' and 'content', got {message!r}")
        role = message["role"]
        if role not in CHAT_ROLES:
            guess = difflib.get_close_matches(str(role).lower(), CHAT_ROLES, n=1, cutoff=0.5)
            hint = f"did you mean {guess[0]!r}? " if guess else ""
            raise ValueError(f"unknown chat role {role!r}; {hint}roles are {', '.join(map(repr, CHAT_ROLES))}")
