"""Loading a model's tokenizer: the answers `AutoTokenizer` gives, without its imports where that is proven.

Owns: `load_tokenizer(source)` and the records under `<cache>/tokenizers/` it keeps about each
local checkout: which class `AutoTokenizer` returned for it and, where it passed the probes, the
frozen state a `LightTokenizer` serves it from. Knows nothing about servers, engines, prompts or results.

Why: `AutoTokenizer` lives in `transformers.models.auto`, whose imports pull in torch, sympy
(through `torch.distributed`), `transformers.generation` and, where they are installed,
`torch._dynamo`, FSDP and sklearn: seconds in a fresh process. Even the class it returns is not
enough to avoid them: `PreTrainedTokenizerFast.from_pretrained` imported torch on transformers
5.17 (not on 5.24), while `tokenizers` alone reads a tokenizer.json in a fraction of a second.
The timings are in docs/archive/benchmarks-rounds-2026-12.md, "Reattach".

How, per local checkout (a directory):

1. The first load goes through `AutoTokenizer.from_pretrained`, as before. Its class is recorded,
   and its state is frozen (`_tokenizer_snapshot.snapshot`: the Rust backend's JSON as transformers
   left it, after its added tokens and post-processor updates, plus special tokens, chat template
   and limits). The `LightTokenizer` built from that state must answer every probe exactly as the
   transformers tokenizer does (`_tokenizer_snapshot.differs`: ids, decoding, vocabulary, special tokens,
   chat templates); then the state is recorded too, and the light one is returned (with the
   transformers one behind it, `.hf`).
2. A later load of the same files, under the same transformers and tokenizers (the key: every
   file of the checkout but its weights, by name, size and mtime, and the installed packages'
   files), is the recorded state: no transformers import at all. A checkout whose tokenizer failed
   a probe, or has no Rust backend (a slow, sentencepiece-only tokenizer), has its class recorded
   instead, and a later load calls that class's `from_pretrained`: the call `AutoTokenizer` ends
   with (it adds only `_from_auto=True`, for the Hub's user agent), without its model imports.
3. A class from the checkout's own code (`auto_map`) is never recorded (remote code runs only
   through AutoTokenizer's own checks), nor is a Hub name (not a directory): those, a changed file,
   other package versions and a record that fails to load go through `AutoTokenizer`, as before.

The Engine that launches a server loads its tokenizer while the server starts, so it writes the
record that a later kernel's reattach reads.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import importlib.util
import json
import os
import tempfile
from pathlib import Path
from typing import Any

from ..core._paths import cache_dir
from ._light_tokenizer import LightTokenizer
from ._tokenizer_snapshot import differs, snapshot

__all__ = ["load_tokenizer", "record_of", "records_dir"]

_RECORD_VERSION = 2  # a new version ignores older records (their states may lack what LightTokenizer reads)
# Files of a checkout that never change its tokenizer: left out of the key, so that weights
# written into the checkout (a weight update saved in place) keep the tokenizer's record.
_WEIGHTS = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".h5", ".msgpack", ".ckpt", ".onnx", ".index.json")


def records_dir() -> Path:
    """Where the records live (`<cache>/tokenizers`): `<key>.json`, and `<key>.backend.json` for a light one."""
    return cache_dir() / "tokenizers"


def load_tokenizer(source: str | os.PathLike[str], *, local_files_only: bool = False) -> Any:
    """The tokenizer of `source` (a local checkout, or a Hub name) as `AutoTokenizer` loads it: a
    `LightTokenizer` with the same answers where that is proven for these files, else the
    transformers tokenizer (module docstring).

    Raises what `AutoTokenizer.from_pretrained` raises (OSError, ValueError, ...) when it cannot.
    """
    kwargs = {"local_files_only": True} if local_files_only else {}
    path = Path(source)
    key = _key(path) if path.is_dir() else None
    record = _read(key) if key is not None else None
    if record is not None and key is not None:
        try:
            if record.get("light"):
                recorded = dict(record["state"], name_or_path=str(source))
                return LightTokenizer(recorded, (records_dir() / f"{key}.backend.json").read_text())
            return _class(record).from_pretrained(str(source), **kwargs)
        except Exception:  # a record that no longer fits: AutoTokenizer decides again below
            pass
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(str(source), **kwargs)
    if key is None or not type(hf).__module__.startswith("transformers."):
        return hf
    light: LightTokenizer | None = None
    state: dict[str, Any] | None = None
    backend: str | None = None
    try:
        state, backend = snapshot(hf)
        light = LightTokenizer(state, backend, hf=hf)
        why_not = differs(hf, light)
    except ValueError as err:
        why_not = f"no snapshot: {err}"
    except Exception as err:  # whatever breaks the light one, the transformers tokenizer is loaded: use it
        why_not = f"no light tokenizer: {type(err).__name__}: {err}"
    ok = light is not None and why_not is None
    _write(key, {"module": type(hf).__module__, "class": type(hf).__name__, "light": ok,
                 "state": state if ok else None, "why_not_light": why_not}, backend=backend if ok else None)
    return light if ok else hf


def record_of(source: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The record for `source`'s files as they are now: `module` and `class` (AutoTokenizer's
    choice), `light` (whether a `LightTokenizer` serves it) and `why_not_light` (the first probe it
    failed); None if there is none (the next load goes through AutoTokenizer)."""
    path = Path(source)
    key = _key(path) if path.is_dir() else None
    return None if key is None else _read(key)


def _package_files(name: str) -> list[Any]:
    """What identifies an installed package without importing it: its `__init__` file's path, size
    and mtime, and the dist-info folders (which name the version) beside it."""
    spec = importlib.util.find_spec(name)
    if spec is None or spec.origin is None:
        return [name, None]
    origin = Path(spec.origin)
    st = origin.stat()
    site = origin.parent.parent
    dist = sorted(n for n in os.listdir(site) if n.startswith(f"{name}-") and n.endswith((".dist-info", ".egg-info")))
    return [name, str(origin), st.st_size, st.st_mtime_ns, dist]


def _key(path: Path) -> str | None:
    """A digest of all that `AutoTokenizer`'s choice and the tokenizer depend on: the checkout's files
    (not its weights) and the packages that read them; None if they cannot be read."""
    try:
        files: list[tuple[str, int, int]] = []
        for directory in (path, path / "additional_chat_templates"):
            if directory.is_dir():
                with os.scandir(directory) as entries:
                    for entry in entries:
                        if entry.is_file() and not entry.name.endswith(_WEIGHTS):
                            st = entry.stat()
                            files.append((os.path.relpath(entry.path, path), st.st_size, st.st_mtime_ns))
        packages = [_package_files(name) for name in ("transformers", "tokenizers", "jinja2", "mistral_common")]
    except (OSError, ValueError, ImportError):
        return None
    parts = [_RECORD_VERSION, str(path.resolve()), sorted(files), packages]
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()


def _read(key: str) -> dict[str, Any] | None:
    try:
        record = json.loads((records_dir() / f"{key}.json").read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def _class(record: dict[str, Any]) -> Any:
    module, name = record["module"], record["class"]
    if not (isinstance(module, str) and isinstance(name, str) and module.startswith("transformers.")):
        raise ValueError(f"not a transformers class: {module}.{name}")
    return getattr(importlib.import_module(module), name)


def _write(key: str, record: dict[str, Any], *, backend: str | None) -> None:
    """Write `record` (and the light state's backend first): atomically, private to this user, best
    effort (a cache that cannot be written costs the next load its speed, nothing else)."""
    directory = records_dir()
    with contextlib.suppress(OSError):
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        if backend is not None:
            _atomic(directory / f"{key}.backend.json", backend)
        _atomic(directory / f"{key}.json", json.dumps(record))


def _atomic(target: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".tmp-", suffix=".json")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
