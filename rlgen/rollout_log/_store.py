"""Where a rollout log's files live, and how a file becomes visible: whole or not at all.

Owns: the filesystem of a log (a local folder, or an fsspec URL such as `s3://bucket/run`, the
latter through the optional `fsspec` package and its protocol's package, e.g. `s3fs`), listing,
reading bytes, and the one way anything is written: `write_new`, which makes a file appear only
when it is complete and never replaces one that exists. Locally that is a write to a hidden
temporary name in the same folder, then a rename (atomic on POSIX): a process killed mid-write
leaves at most a `.tmp-*` file, which listings skip. On an object store a PUT of the whole object
is atomic already (the object is visible only once uploaded), so the bytes go in one `pipe`.
Knows nothing about parquet, results or rewards: it moves bytes under names.
"""

from __future__ import annotations

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

    def list(self, *names: str) -> list[str]:
        """The file names (not paths) directly in a folder, sorted, without temporary files; [] for
        a folder that does not exist (a log without any part yet)."""
        folder = self.path(*names)
        if self._fs is None:
            try:
                entries = os.listdir(folder)
            except FileNotFoundError:
                return []
        else:
            self._fs.invalidate_cache(folder)  # another writer may have added parts since
            try:
                entries = [posixpath.basename(p.rstrip("/")) for p in self._fs.ls(folder, detail=False)]
            except FileNotFoundError:
                return []
        return sorted(e for e in entries if not e.startswith(_TMP_PREFIX))

    def read_bytes(self, *names: str) -> bytes:
        path = self.path(*names)
        if self._fs is None:
            with open(path, "rb") as f:
                return f.read()
        return bytes(self._fs.cat_file(path))

    def write_new(self, data: bytes, *names: str) -> str:
        """Write `data` as a new file, visible only once complete; return its path.

        Raises:
            LogError: a file of that name exists (nothing already written is ever replaced).
        """
        path = self.path(*names)
        if self.exists(*names):
            raise LogError(f"{path} exists: a rollout log never replaces a file it holds", path=path)
        if self._fs is not None:
            self._fs.makedirs(posixpath.dirname(path), exist_ok=True)
            self._fs.pipe_file(path, data)
            return path
        folder = os.path.dirname(path)
        os.makedirs(folder, exist_ok=True)
        tmp = os.path.join(folder, f"{_TMP_PREFIX}{uuid.uuid4().hex}")
        try:
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            # link() fails where the name exists (rename() would replace it): two writers racing
            # for one name cannot overwrite each other.
            try:
                os.link(tmp, path)
            except FileExistsError:
                raise
            except OSError:  # a filesystem without hard links: rename, after the check above
                os.replace(tmp, path)
        except FileExistsError as err:
            raise LogError(f"{path} exists: a rollout log never replaces a file it holds", path=path) from err
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
        return path

    def arrow_filesystem(self) -> pyarrow.fs.FileSystem:
        """The filesystem for pyarrow's readers (datasets read only the columns and files asked for)."""
        import pyarrow.fs

        if self._fs is None:
            return pyarrow.fs.LocalFileSystem()
        return pyarrow.fs.PyFileSystem(pyarrow.fs.FSSpecHandler(self._fs))


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
