"""The content hash of a checkpoint's weights: what a result's record and the completion cache name.

Owns: which files of a Hugging Face checkout count as its weights (the weight files themselves and
`config.json`, which decides how they are read), their SHA-256, and a memo of each file's digest
under rlgen's cache root keyed by the file's path, size, modification time and inode, so a
checkpoint is read once, not at every Engine start. The digest of a checkout is the SHA-256 of the
sorted (relative name, file digest) pairs: it changes when any counted file's bytes change, and not
when only tokenizer files, READMEs or timestamps do (a touched file is re-read, and gives the same
digest). Knows nothing about servers, engines or results.

`WeightsHash` computes in a background thread, so that hashing a large checkpoint overlaps with
the server's own start; whoever needs the digest waits for it then.

Also owns what a checkpoint holds without loading it (`checkpoint_tensors`: each tensor's name,
shape and dtype from the safetensors headers; `ties_word_embeddings`: whether its LM head is its
embedding, from config.json), which a tensor push is checked against before anything is sent.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import hashlib
import json
import os
import struct
import tempfile
import threading
from pathlib import Path

from ..core._paths import cache_dir

__all__ = ["TensorSpec", "WeightsHash", "checkpoint_tensors", "ties_word_embeddings", "weights_sha256"]

_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".msgpack", ".h5")
_ALSO = ("config.json",)
_CHUNK = 8 << 20
# A safetensors header longer than this is not one (the format caps it at 100 MB).
_MAX_HEADER = 100 << 20
_memo_lock = threading.Lock()


def weights_sha256(path: str | os.PathLike[str]) -> str | None:
    """The checkout's weights digest (hex), or None when `path` is not a local directory with weights."""
    root = Path(path)
    if not root.is_dir():
        return None
    files = sorted(p for p in root.rglob("*") if p.is_file() and (p.suffix in _WEIGHT_SUFFIXES or p.name in _ALSO))
    if not any(p.suffix in _WEIGHT_SUFFIXES for p in files):
        return None
    memo = _read_memo()
    outer = hashlib.sha256()
    changed = False
    for file in files:
        st = file.stat()
        key = f"{file.resolve()}|{st.st_size}|{st.st_mtime_ns}|{st.st_ino}"
        digest = memo.get(key)
        if digest is None:
            digest = memo[key] = _file_sha256(file)
            changed = True
        outer.update(f"{file.relative_to(root).as_posix()}\0{digest}\n".encode())
    if changed:
        _write_memo(memo)
    return outer.hexdigest()


class WeightsHash:
    """The digest of one checkout, computed in a daemon thread from construction on."""

    def __init__(self, path: str | os.PathLike[str] | None) -> None:
        self.path = None if path is None else str(path)
        self._future: concurrent.futures.Future[str | None] = concurrent.futures.Future()
        if self.path is None:
            self._future.set_result(None)
            return

        def run() -> None:
            try:
                self._future.set_result(weights_sha256(self.path or ""))
            except OSError:  # unreadable files: no digest, so nothing keyed on it is trusted
                self._future.set_result(None)

        threading.Thread(target=run, name="rlgen-weights-hash", daemon=True).start()

    def result(self) -> str | None:
        """The digest (waits for the thread), or None where the weights are not on this machine."""
        return self._future.result()


def _file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _memo_path() -> Path:
    return cache_dir() / "weights-sha256.json"


def _read_memo() -> dict[str, str]:
    with _memo_lock, contextlib.suppress(OSError, ValueError):
        data = json.loads(_memo_path().read_text())
        if isinstance(data, dict):
            return {str(k): str(v) for k, v in data.items()}
    return {}


def _write_memo(memo: dict[str, str]) -> None:
    """Atomically (a temporary file renamed over the old one); a failure only costs a re-read later."""
    path = _memo_path()
    with _memo_lock, contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".weights-", suffix=".tmp")
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(dict(list(memo.items())[-512:]), f)
            os.replace(tmp, path)
        except OSError:
            with contextlib.suppress(OSError):
                os.unlink(tmp)


# A checkpoint tensor as its file header describes it: shape and safetensors dtype ("BF16", "F32").
TensorSpec = tuple[tuple[int, ...], str]


def checkpoint_tensors(path: str | os.PathLike[str]) -> dict[str, TensorSpec] | None:
    """Name -> (shape, dtype) of every tensor in the checkout's safetensors files, read from their
    headers (nothing is loaded); None where `path` is not a local checkout with safetensors files
    (a .bin-only checkpoint, a hub id, a remote server's path) or a header cannot be read."""
    root = Path(path)
    files = sorted(root.glob("*.safetensors")) if root.is_dir() else []
    if not files:
        return None
    tensors: dict[str, TensorSpec] = {}
    try:
        for file in files:
            with open(file, "rb") as f:
                (size,) = struct.unpack("<Q", f.read(8))
                if size > _MAX_HEADER:
                    return None
                header = json.loads(f.read(size))
            for name, entry in header.items():
                if name != "__metadata__" and isinstance(entry, dict):
                    tensors[name] = (tuple(int(n) for n in entry["shape"]), str(entry["dtype"]))
    except (OSError, ValueError, KeyError, TypeError, struct.error):
        return None
    return tensors


def ties_word_embeddings(path: str | os.PathLike[str]) -> bool | None:
    """Whether the checkout's config ties the LM head to the input embedding (`tie_word_embeddings`,
    also under `text_config`); None where there is no readable config.json saying so."""
    try:
        config = json.loads((Path(path) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    for section in (config, config.get("text_config") if isinstance(config, dict) else None):
        if isinstance(section, dict) and isinstance(section.get("tie_word_embeddings"), bool):
            return bool(section["tie_word_embeddings"])
    return None
