"""Which weights the server serves, as this Engine last set or read them: `ServedWeights`.

Owns: the one account of the served weights: loaded from disk (where from, their content hash
`WeightsHash`, read in a background thread), pushed from tensors (on no disk: no path, no hash),
restored from disk after a push (under the version the disk weights had), the weight version, the
count of this Engine's updates (for default version names), the version index (0 for the weights
the Engine started with, +1 per change of the served weights, each index with the server's
`weight_version` string then: `advance`, `index_of`), what a result's provenance says about them,
and the digest the completion cache keys on. Knows nothing about HTTP, requests or how
weights reach the server: `engine._weights` makes the requests and tells this object what happened.
"""

from __future__ import annotations

from pathlib import Path

from ..core._errors import EngineError
from ..server._weights import WeightsHash

__all__ = ["ServedWeights"]


class ServedWeights:
    """The served weights: `model_path` at start; `hashable=False` where the checkout is not on this
    machine (an attached server's), so no content hash is read."""

    def __init__(self, model_path: str, *, hashable: bool = True) -> None:
        self._model_path = model_path
        self._disk_path: str | None = None        # where the weights were last loaded from (None: model_path)
        self._hash = WeightsHash(model_path if hashable else None)
        self._start_version: str | None = None    # the server's weight version when the Engine connected
        self.version: str | None = None           # the server's weight version, as last read or set
        self._pushed: str | None = None           # the version pushed from tensors, while the server serves it
        self._disk_version: str | None = None     # the version the disk weights had before that push
        self.updates = 0                          # this Engine's loads and pushes, for default version names
        self._labels: list[str | None] | None = None  # the server's weight_version of each version index

    # -- the version index ------------------------------------------------------------------------
    @property
    def index(self) -> int:
        """The version index of the served weights: 0 for those the Engine started with, +1 per change."""
        return 0 if self._labels is None else len(self._labels) - 1

    @property
    def labels(self) -> list[str | None]:
        """The server's `weight_version` string of each version index (a copy)."""
        return list(self._labels) if self._labels is not None else [self.version]

    def advance(self) -> int:
        """The served weights changed (a push, a load, a reload, an adapter replaced, or part of a
        push that failed midway): one more version index, labelled with `version` as it is now."""
        if self._labels is None:
            self._labels = [self._start_version]
        self._labels.append(self.version)
        return self.index

    def index_of(self, version: str | None, *, at_least: int = 0) -> int | None:
        """The version index the server's `weight_version` string `version` names, for a request
        sent at index `at_least` (it ran on those weights or newer ones): the first index from there
        with that string; None where no such index has it (another client changed the weights)."""
        if version is None:
            return None
        labels = self.labels
        return next((i for i in range(max(0, at_least), len(labels)) if labels[i] == version), None)

    def connected(self, version: str | None) -> None:
        """The Engine connected to a server that serves weight version `version` (index 0)."""
        self._start_version = self.version = version
        self._labels = None

    @property
    def disk_path(self) -> str:
        """Where the weights on disk are: the last checkout loaded, else the model's."""
        return self._disk_path or self._model_path

    @property
    def pushed(self) -> bool:
        """Whether the server serves weights pushed from tensors (on no disk)."""
        return self._pushed is not None

    def next_version(self, given: str | None, *, prefix: str) -> str:
        """Count one more update; its version: `given`, else "<prefix>@<n>"."""
        self.updates += 1
        return given or f"{prefix}@{self.updates}"

    def loaded_from_disk(self, path: str, version: str | None) -> None:
        """The server now serves the checkout at `path` under `version`."""
        self._disk_path = str(path)
        self._pushed = None
        self._hash = WeightsHash(path)
        self.version = version

    def pushed_tensors(self, version: str) -> None:
        """The server now serves weights on no disk (a push, or part of one, named `version`); a later
        restore brings back the version the disk weights had. The caller sets `version` from the server."""
        if self._pushed is None:
            self._disk_version = self.version
        self._pushed = version
        self._hash = WeightsHash(None)

    def restore_version(self) -> str | None:
        """The version a reload of `disk_path` takes: the disk weights' own."""
        return self._disk_version if self._pushed is not None else self.version

    def restored(self) -> None:
        """The server serves the disk weights at `disk_path` again (reloaded after a pause or a push)."""
        if self._pushed is not None:
            version = self._disk_version
            self.loaded_from_disk(self.disk_path, version)

    def provenance(self) -> dict[str, str | None]:
        """What a result records about the weights: where they are on disk and their content hash
        (both None for weights pushed from tensors: they are on no disk)."""
        return {"weights_path": None if self._pushed is not None else self.disk_path,
                "weights_sha256": self._hash.result()}

    def cache_digest(self) -> str:
        """The content hash the completion cache keys on; EngineError (saying what to do) where there is none."""
        digest = self._hash.result()
        if digest is not None:
            return digest
        if self._pushed is not None:
            raise EngineError("the completion cache keys completions by the served weights' content hash, and the "
                              "weights pushed with update_weights() have none: pass cache=False, or save them and "
                              "load them with update_weights_from_disk(path)")
        raise EngineError("the completion cache needs the served weights on this machine (their content hash is "
                          f"part of every key), and {self._hash.path or self._model_path!r} is not a local "
                          "checkout: pass cache=False")

    @staticmethod
    def is_local(model_path: str) -> bool:
        """Whether a server's model path is a checkout on this machine (its content can be hashed)."""
        return bool(model_path) and Path(model_path).is_dir()
