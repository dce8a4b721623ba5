"""What made a result's rows: `Provenance`, the dict a result keeps as `Rollouts.record`.

Owns: the fields of that dict and where each comes from (rlgen's and the server's versions, the
backend, the model, the served weights' path and content hash, the weight versions the answers
carried, the server's command line, the sampling, the start time, the GPU's name, the completion
cache's hits, the adapters used), for generate() and episodes() alike. Knows nothing about how a
call runs: the call hands in its sampling, weight versions, cache counts and adapters.
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from typing import Any

from ..server._handle import ServerHandle
from ._adapter_choice import AdapterSet
from ._served import ServedWeights

__all__ = ["Provenance"]


class Provenance:
    """The Engine's side of every result's provenance: what it serves, where, and how it was started."""

    def __init__(self, *, model: str, model_path: str, backend: str, server_version: Any, server: ServerHandle,
                 weights: ServedWeights, adapters: AdapterSet) -> None:
        self._fixed = {"server_version": server_version, "backend": backend, "model": model, "model_path": model_path}
        self._backend = backend
        self._server = server
        self._weights = weights
        self._adapters = adapters
        self._gpu_name: str | None = None

    @property
    def model(self) -> str:
        """The served model's name, as results name it."""
        return str(self._fixed["model"])

    def of_call(self, *, started: float, sampling: dict[str, Any], weight_versions: Sequence[Any],
                cache: dict[str, int] | None, adapters: Sequence[str | None] | None = None) -> dict[str, Any]:
        """A call's provenance: `started` (time.time() when it began), its sampling parameters, the
        weight versions its answers carried, the completion cache's counts (None: not used), and
        each prompt's adapter (None: the base model for all)."""
        from .._version import __version__

        weights = self._weights.provenance()
        return {
            "rlgen_version": __version__,
            **self._fixed,
            "weights_path": weights["weights_path"],  # None for weights pushed from tensors: on no disk
            "weights_sha256": weights["weights_sha256"],
            "weight_versions": sorted({str(v) for v in weight_versions if v is not None}),
            "server_args": self._server.argv,
            "sampling": sampling,
            "seed": sampling.get("sampling_seed"),
            "started_utc": datetime.datetime.fromtimestamp(started, datetime.timezone.utc).isoformat(
                timespec="seconds"),
            "gpu": self.gpu(),
            "cache": cache,
            "adapters": self._adapters.provenance(adapters),  # name -> source, rank, sha256, load
        }

    def gpu(self) -> str | None:
        """The GPU's name where the server is on this machine and has one (nvidia-smi, read once)."""
        if self._gpu_name is None and self._backend == "sglang":
            from ..server._process_tree import gpu_name

            self._gpu_name = gpu_name() or ""
        return self._gpu_name or None
