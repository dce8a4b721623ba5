"""Type aliases of rlgen's public API: the prompt forms generate() and score() accept.

Owns: the names users and type checkers see for prompts. Knows nothing about how prompts are
tokenized or checked (`client/_prompts.py`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TypeAlias

__all__ = ["Chat", "ChatMessage", "Prompt", "Prompts", "TokenIds"]

ChatMessage: TypeAlias = Mapping[str, str]
"""One chat message: {"role": "system" | "user" | "assistant" | "tool", "content": "..."}."""

Chat: TypeAlias = Sequence[ChatMessage]
"""One conversation, rendered with the model's chat template (and its generation prompt)."""

TokenIds: TypeAlias = Sequence[int]
"""A prompt given as token ids, sent exactly as they are."""

Prompt: TypeAlias = str | TokenIds | Chat
"""One prompt: a string, token ids, or a chat."""

Prompts: TypeAlias = Prompt | Sequence[str] | Sequence[TokenIds] | Sequence[Chat]
"""What generate() takes: one prompt, or a list of prompts of one form."""
