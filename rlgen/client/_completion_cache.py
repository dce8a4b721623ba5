"""The opt-in completion cache: a prompt's samples, stored on disk and found again by what made them.

Owns: the key (SHA-256 over everything that decides a prompt's samples: the weights' content
digest, the server's weight version, the prompt's token ids, the sampling parameters including the
seed, n, and the logprob options), the file layout (one file per key under
`<cache root>/completions/<2 hex>/<key>`), atomic writes (a temporary file renamed into place),
and validated reads. A file is a JSON header line (format, key, n, the body's SHA-256) and then the
body (the n answers as JSON); an entry is returned only when the header parses, names this key and
this n, and the body's digest matches, so a truncated, corrupt or foreign file is never returned:
it is counted, removed, and the prompt goes to the server. A call's use of it: `split` (which
prompts the cache answers and which go to the server), `store_finished` (a sent prompt is stored
once all its n samples finished) and `merge` (the hits and the sent answers back in the call's
order, a sample that never came filled as aborted). Knows nothing about servers, HTTP or
`Rollouts`: an entry is the server's answers (JSON-able dicts) for one prompt's n samples, read
through `client._answer`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..core._paths import cache_dir
from ._answer import failed_entry, read_answer

__all__ = ["CompletionCache", "cache_key", "merge", "split", "store_finished"]

_FORMAT = 1


def cache_key(*, weights_sha256: str, weight_version: str | None, prompt_ids: Sequence[int],
              sampling: Mapping[str, Any], n: int, logprobs: bool, top_logprobs: int,
              adapter_sha256: str | None = None) -> str:
    """The key of one prompt's samples (hex SHA-256); equal inputs give equal keys in any process.
    `adapter_sha256`: the content hash of the LoRA adapter sampled with (None: the base model, whose
    keys are those of a server without LoRA)."""
    material = {
        "format": _FORMAT, "weights_sha256": weights_sha256, "weight_version": weight_version,
        "prompt_ids": [int(t) for t in prompt_ids], "sampling": dict(sampling), "n": int(n),
        "logprobs": bool(logprobs), "top_logprobs": int(top_logprobs),
    }
    if adapter_sha256 is not None:
        material["adapter_sha256"] = adapter_sha256
    text = json.dumps(material, sort_keys=True, separators=(",", ":"), default=_jsonable)
    return hashlib.sha256(text.encode()).hexdigest()


class CompletionCache:
    """Entries under `root` (default `<rlgen cache root>/completions`); `rejected` counts the
    entries found unreadable and removed by this object."""

    def __init__(self, root: str | os.PathLike[str] | None = None) -> None:
        self.root = Path(root) if root is not None else cache_dir() / "completions"
        self.rejected = 0

    def path(self, key: str) -> Path:
        return self.root / key[:2] / key

    def get(self, key: str, *, n: int) -> list[dict[str, Any]] | None:
        """The n answers stored under `key`, or None (absent, or not a whole valid entry)."""
        path = self.path(key)
        try:
            raw = path.read_bytes()
        except OSError:
            return None
        answers = _parse(raw, key=key, n=n)
        if answers is None:
            self.rejected += 1
            with contextlib.suppress(OSError):
                path.unlink()
        return answers

    def put(self, key: str, answers: Sequence[Mapping[str, Any]]) -> None:
        """Store one prompt's answers; a failure to write only means the next call asks the server."""
        body = json.dumps(list(answers), separators=(",", ":"), default=_jsonable).encode()
        header = json.dumps({"format": _FORMAT, "key": key, "n": len(answers),
                             "sha256": hashlib.sha256(body).hexdigest()}).encode()
        path = self.path(key)
        with contextlib.suppress(OSError):
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".entry-", suffix=".tmp")
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(header + b"\n" + body)
                os.replace(tmp, path)
            except OSError:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)

    def __repr__(self) -> str:
        return f"<rlgen CompletionCache {str(self.root)!r}>"


Answers = list[dict[str, Any]]


def split(cache: CompletionCache, keys: Sequence[str], *, n: int) -> tuple[dict[int, Answers], list[int]]:
    """Which of a call's prompts (one key each) the cache answers: their stored answers by prompt
    position, and the positions of the rest, in order (the prompts to send)."""
    hits: dict[int, Answers] = {}
    for i, key in enumerate(keys):
        answers = cache.get(key, n=n)
        if answers is not None:
            hits[i] = answers
    return hits, [i for i in range(len(keys)) if i not in hits]


def store_finished(cache: CompletionCache, keys: Sequence[str], sent: Sequence[int],
                   answers: Sequence[dict[str, Any] | None], *, n: int) -> None:
    """Store each sent prompt (`sent[j]`: its position, `answers[j*n:(j+1)*n]`: its samples) whose n
    samples all finished; an aborted, failed or missing sample leaves its prompt unstored."""
    for j, i in enumerate(sent):
        got = answers[j * n:(j + 1) * n]
        if len(got) == n and all(a is not None and read_answer(a).finished for a in got):
            cache.put(keys[i], [a for a in got if a is not None])


def merge(hits: Mapping[int, Sequence[dict[str, Any]]], sent: Sequence[int], answers: Sequence[dict[str, Any] | None],
          *, prompts: int, n: int) -> Answers:
    """A call's n answers per prompt, in prompt order: the cache's hits, the sent prompts' answers
    (`sent[j]`'s at `answers[j*n:(j+1)*n]`), and an aborted stand-in for every sample without an
    answer (an interrupted or failed call's)."""
    merged: list[dict[str, Any] | None] = [None] * (prompts * n)
    for i, stored in hits.items():
        merged[i * n:(i + 1) * n] = list(stored)
    for j, i in enumerate(sent):
        for k in range(n):
            merged[i * n + k] = answers[j * n + k] if j * n + k < len(answers) else None
    return [a if a is not None else failed_entry("aborted before the server answered", reason="abort")
            for a in merged]


def _parse(raw: bytes, *, key: str, n: int) -> list[dict[str, Any]] | None:
    head, sep, body = raw.partition(b"\n")
    if not sep:
        return None
    try:
        header = json.loads(head)
    except ValueError:
        return None
    if (not isinstance(header, dict) or header.get("format") != _FORMAT or header.get("key") != key
            or header.get("n") != n or header.get("sha256") != hashlib.sha256(body).hexdigest()):
        return None
    try:
        answers = json.loads(body)
    except ValueError:
        return None
    if not isinstance(answers, list) or len(answers) != n or not all(isinstance(a, dict) for a in answers):
        return None
    return answers


def _jsonable(value: Any) -> Any:
    if isinstance(value, (tuple, set, frozenset)):
        return list(value)
    raise TypeError(f"{type(value).__name__} is not JSON-able")
