"""Token text for display: each token's real text, from a tokenizer held now or loaded later.

Owns: `TokenText`, the `Rollouts.decode` callable (ids -> one text piece per id) that the view and
the rollout browser draw tokens with, and what survives a parquet round trip: its `source` (the
tokenizer's local path or name), from which `TokenText.load` rebuilds it when a file is read. Knows
nothing about servers, results or HTML.
"""

from __future__ import annotations

import threading
from typing import Any

__all__ = ["TokenText"]


class TokenText:
    """Maps token ids to their text pieces; `source` names the tokenizer it came from.

    Built from a tokenizer object (`TokenText(tokenizer)`), or from a source only
    (`TokenText.load(path)`): then the tokenizer is loaded on the first call, from local files only
    (a repr never downloads). A source that cannot be loaded makes every call raise; `error` then
    says why, and the view falls back to ids with that reason.
    """

    def __init__(self, tokenizer: Any = None, *, source: str | None = None) -> None:
        if tokenizer is None and not source:
            raise ValueError("TokenText needs a tokenizer or a source to load one from")
        self._tokenizer = tokenizer
        self.source: str | None = source if source else _source_of(tokenizer)
        self.error: str | None = None
        self._lock = threading.Lock()

    @classmethod
    def load(cls, source: str) -> TokenText:
        """A TokenText whose tokenizer is loaded from `source` on first use."""
        return cls(source=source)

    def tokenizer(self) -> Any:
        """The tokenizer, loading it on first use; raises OSError (with `error` set) if it cannot."""
        with self._lock:
            if self._tokenizer is None:
                if self.error is not None:
                    raise OSError(self.error)
                try:
                    from ..client._tokenizer import load_tokenizer  # AutoTokenizer's object, lighter when it can

                    self._tokenizer = load_tokenizer(str(self.source), local_files_only=True)
                except Exception as err:  # any failure means "no token text": the caller shows ids
                    self.error = (
                        f"the tokenizer {self.source!r} is not available here ({type(err).__name__}); "
                        "pass Rollouts.from_parquet(path, tokenizer=...) to see token text"
                    )
                    raise OSError(self.error) from err
            return self._tokenizer

    def __call__(self, ids: list[int]) -> list[str]:
        """Each token's real text: the pieces concatenate to the decoded text.

        Incremental: token k's piece is decode(ids[s:k+1]) minus decode(ids[s:done]), where
        ids[:done] already decoded to whole characters and s a few tokens before done (a short
        context keeps this linear and keeps a tokenizer's leading-space rules right). A character
        whose bytes span several tokens belongs to the token that completes it; the tokens before
        it get "", and so do the tokens of a character cut off at the end: never mojibake. Only
        bytes that no later token can complete (invalid UTF-8) show as U+FFFD. Special tokens keep
        their text (e.g. "<|im_end|>").
        """
        tok = self.tokenizer()
        ids = [int(t) for t in ids]

        def text(part: list[int]) -> str:
            return str(tok.decode(part, skip_special_tokens=False, clean_up_tokenization_spaces=False))

        pieces: list[str] = []
        bounds = [0]  # positions p where ids[:p] decodes to whole characters
        for k in range(len(ids)):
            done = bounds[-1]
            start = bounds[max(0, len(bounds) - 5)]
            before, after = text(ids[start:done]), text(ids[start : k + 1])
            if after.endswith("\ufffd") and k - done < 4:
                pieces.append("")  # bytes of a character that a later token completes
                continue
            pieces.append(after[len(before):] if after.startswith(before) else after)
            bounds.append(k + 1)
        return pieces

    def __repr__(self) -> str:
        return f"TokenText(source={self.source!r})"


def _source_of(tokenizer: Any) -> str | None:
    source = getattr(tokenizer, "name_or_path", None)
    return str(source) if source else None
