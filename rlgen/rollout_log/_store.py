"""Where a rollout log's files live, and how a file becomes visible: whole or not at all, and never twice.

Owns: the filesystem of a log (a local folder, or an fsspec URL such as `s3://bucket/run`, the
latter through the optional `fsspec` package and its protocol's package, e.g. `s3fs`), listing
(a whole folder, or the names under a prefix: on S3 one filtered listing, not the folder's),
reading bytes, and the ways anything is written, each create-only (nothing is ever replaced):
- `create` / `write_new`: a file that appears only when complete. Locally: a write to a hidden
  temporary name in the same folder, then a hard link to the name (atomic on POSIX, and it fails
  where the name exists, so of two writers of one name exactly one wins); a process killed
  mid-write leaves at most a `.tmp-*` file, which listings skip. On an object store one PUT of the
  whole object (visible only once uploaded), made conditional (`pipe_file(mode="create")`: on S3
  an `If-None-Match: *` PUT, which S3 refuses where the key exists).
- `claim`: a small marker that two processes cannot both create: locally `O_CREAT | O_EXCL`, on
  an object store the same conditional PUT. The log claims a part's (step, name) this way.
An fsspec filesystem whose `pipe_file` takes no `mode` (an old s3fs) gets a check, then a plain
PUT: not atomic (`atomic_create` says which). Knows nothing about parquet, results or rewards: it
moves bytes under names.
"""

from __future__ import annotations

import inspect
import json
import os
import posixpath
import uuid
from typing import TYPE_CHECKING, Any

from ..core._errors import LogError

if TYPE_CHECKING:
    import pyarrow.fs

__all__ = ["Store", "open_store"]

_TMP_PREFIX = ".tmp-"


class Store:
    """A log's root folder and the operations the log needs, over a local path or fsspec."""

    def __init__(self, root: str, fs: Any = None, *, url: str | None = None) -> None:
        self.root = root  # a local absolute path, or the fsspec path (no protocol) under `fs`
        self._fs = fs  # None: the local filesystem through os
        self.url = url or root

    @property
    def is_local(self) -> bool:
        return self._fs is None

    def path(self, *names: str) -> str:
        return os.path.join(self.root, *names) if self._fs is None else posixpath.join(self.root, *names)

    def exists(self, *names: str) -> bool:
        path = self.path(*names)
        return os.path.exists(path) if self._fs is None else bool(self._fs.exists(path))

    def is_dir(self, *names: str) -> bool:
        path = self.path(*names)
        return os.path.isdir(path) if self._fs is None else bool(self._fs.isdir(path))

    def list(self, *names: str, prefix: str = "") -> list[str]:
        """The file names (not paths) directly in a folder, sorted, without temporary files; [] for
        a folder that does not exist (a log without any part yet). `prefix`: only names starting
        with it; on an object store whose filesystem filters by prefix (s3fs `find(prefix=)`: a
        `ListObjectsV2` with `Prefix`) only those are listed, not the whole folder."""
        folder = self.path(*names)
        if self._fs is None:
            try:
                entries = os.listdir(folder)
            except FileNotFoundError:
                return []
        else:
            self._fs.invalidate_cache(folder)  # another writer may have added parts since
            try:
                entries = _fs_names(self._fs, folder, prefix)
            except FileNotFoundError:
                return []
        return sorted(e for e in entries if e.startswith(prefix) and not e.startswith(_TMP_PREFIX))

    def read_bytes(self, *names: str) -> bytes:
        path = self.path(*names)
        if self._fs is None:
            with open(path, "rb") as f:
                return f.read()
        return bytes(self._fs.cat_file(path))

    @property
    def atomic_create(self) -> bool:
        """Whether `create` and `claim` are atomic here: locally always; on fsspec where the
        filesystem's `pipe_file` takes `mode="create"` (s3fs 2024.12 and later: a conditional PUT)."""
        return self._fs is None or "mode" in inspect.signature(self._fs.pipe_file).parameters

    def create(self, data: bytes, *names: str) -> bool:
        """Write `data` as a new file, visible only once complete, where no file of that name exists;
        True where written, False where one exists (it is left as it is)."""
        path = self.path(*names)
        if self._fs is not None:
            return self._put_new(self._fs, path, data)
        return not os.path.exists(path) and _link_new(path, data, exclusive=False)

    def write_new(self, data: bytes, *names: str) -> str:
        """Write `data` as a new file, visible only once complete; return its path.

        Raises:
            LogError: a file of that name exists (nothing already written is ever replaced).
        """
        path = self.path(*names)
        if not self.create(data, *names):
            raise LogError(f"{path} exists: a rollout log never replaces a file it holds", path=path)
        return path

    def claim(self, record: dict[str, Any], *names: str) -> bool:
        """Create a small marker file holding `record` (JSON) where none of that name exists, in one
        step two processes cannot both win (locally a hard link, else O_CREAT | O_EXCL; fsspec: a
        conditional PUT). True where this call created it."""
        path = self.path(*names)
        data = json.dumps(record).encode()
        if self._fs is not None:
            return self._put_new(self._fs, path, data)
        return _link_new(path, data, exclusive=True)

    def read_json(self, *names: str) -> dict[str, Any] | None:
        """A small JSON file (a claim) as a dict; None where it is missing, or not (yet) whole JSON."""
        try:
            loaded = json.loads(self.read_bytes(*names))
        except (OSError, ValueError):
            return None
        return loaded if isinstance(loaded, dict) else None

    def remove(self, *names: str) -> None:
        """Delete one file (a claim whose writer failed); a file that is gone already is fine."""
        path = self.path(*names)
        try:
            if self._fs is None:
                os.unlink(path)
            else:
                self._fs.rm_file(path)
        except FileNotFoundError:
            pass

    def _put_new(self, fs: Any, path: str, data: bytes) -> bool:
        """One PUT of the whole object, refused by the store where the key exists (where the
        filesystem offers it; else a check first, which two simultaneous writers can both pass)."""
        fs.makedirs(posixpath.dirname(path), exist_ok=True)
        if not self.atomic_create:
            if fs.exists(path):
                return False
            fs.pipe_file(path, data)
            return True
        try:
            fs.pipe_file(path, data, mode="create")
        except FileExistsError:
            return False
        return True

    def arrow_filesystem(self) -> pyarrow.fs.FileSystem:
        """The filesystem for pyarrow's readers (datasets read only the columns and files asked for)."""
        import pyarrow.fs

        if self._fs is None:
            return pyarrow.fs.LocalFileSystem()
        return pyarrow.fs.PyFileSystem(pyarrow.fs.FSSpecHandler(self._fs))


def _fs_names(fs: Any, folder: str, prefix: str) -> list[str]:
    """The names in an fsspec folder: listed by prefix where the filesystem can, else all."""
    if prefix and "prefix" in inspect.signature(fs.find).parameters:
        found = fs.find(folder, prefix=prefix, maxdepth=1)
    else:
        found = fs.ls(folder, detail=False)
    return [posixpath.basename(p.rstrip("/")) for p in found]


def _link_new(path: str, data: bytes, *, exclusive: bool) -> bool:
    """Write `data` to a hidden temporary file beside `path`, then hard-link it to `path`: the file
    appears whole, and where `path` exists link() fails (rename() would replace it), so of two
    writers racing for one name exactly one wins. True where this call made `path`. On a
    filesystem without hard links: with `exclusive`, O_CREAT | O_EXCL (one winner; the content
    follows), else a rename (whole; the caller checked the name is free)."""
    folder = os.path.dirname(path)
    os.makedirs(folder, exist_ok=True)
    tmp = os.path.join(folder, f"{_TMP_PREFIX}{uuid.uuid4().hex}")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        try:
            os.link(tmp, path)
        except FileExistsError:
            return False
        except OSError:  # no hard links here
            if not exclusive:
                os.replace(tmp, path)
                return True
            try:
                fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                return False
            with os.fdopen(fd, "wb") as out:
                out.write(data)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return True


def open_store(path: str | os.PathLike[str], *, storage_options: dict[str, Any] | None = None) -> Store:
    """The store of `path`: a local folder, or an fsspec URL (`s3://...`, `gs://...`, `memory://...`)
    with `storage_options` passed to its filesystem (credentials, `endpoint_url`, ...).

    Raises:
        LogError: a URL, but fsspec (or the protocol's package) is not installed.
    """
    text = os.fspath(path)
    if "://" not in text or text.startswith("file://"):
        if storage_options:
            raise LogError("storage_options are for fsspec URLs (s3://..., gs://...); this path is local", path=text)
        local = text[len("file://"):] if text.startswith("file://") else text
        return Store(os.path.abspath(os.path.expanduser(local)))
    try:
        import fsspec
    except ImportError as err:
        raise LogError(f"{text} is a URL: reading or writing it needs fsspec and its protocol's package "
                       "(pip install 'rlgen[s3]' for s3://)", path=text) from err
    try:
        fs, root = fsspec.core.url_to_fs(text, **(storage_options or {}))
    except ImportError as err:
        raise LogError(f"{text}: {err} (pip install 'rlgen[s3]' for s3://)", path=text) from err
    return Store(root.rstrip("/"), fs, url=text.rstrip("/"))
