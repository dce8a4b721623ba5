"""Server control: weights, memory and metrics of the server an Engine talks to.

Owns: `flush_cache`, `update_weights_from_disk` (with retries while the server answers 5xx, and
the weight version rows record), `release_memory` / `resume_memory` / `paused` (GPU memory freed
around a training step; weights reloaded after resume), and `metrics`. Knows nothing about
generation or scoring.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..client import _router
from ..client._http import parse_prometheus
from ..core import _loop
from ..core._errors import EngineError, RequestError, ServerRequestError
from ..server._weights import WeightsHash
from ._base import EngineBase

if TYPE_CHECKING:
    import pandas as pd


__all__ = ["ControlMixin"]



class ControlMixin(EngineBase):
    """Control methods of `Engine` (mixed into it)."""

    # -- server control --------------------------------------------------------------------------
    def flush_cache(self) -> None:
        """Drop the server's prefix (radix) cache. SGLang refuses while requests are running."""
        self._check_ready()
        self._control("/flush_cache", {}, what="flush_cache()")

    def _control(self, path: str, body: dict[str, Any], *, what: str, retries: int = 0, backoff_s: float = 1.0) -> Any:
        """POST a control request to the server; behind a router, to every worker it lists, at once
        (the router has no such routes), raising one WorkerRequestError that names each worker that
        failed after all were tried. Returns the server's answer (behind a router: one worker's)."""
        if isinstance(self._client, _router.RouterClient):
            answers = _loop.run_sync(self._client.fan_out(path, body, what=what, retries=retries, backoff_s=backoff_s))
            return next(iter(answers.values()), None)
        return _loop.run_sync(self._client.post(path, body))

    def update_weights_from_disk(self, path: str | os.PathLike[str], *, weight_version: str | None = None,
                                 retries: int = 3, backoff_s: float = 1.0) -> str:
        """Load new weights from a checkout on the server's disk; returns the new weight version.

        Retries transient failures (connection errors, HTTP 5xx/503) with backoff; a rejected path
        (HTTP 400) fails at once. The version defaults to "<dir name>@<n>" so rows stay traceable.
        Behind a router every worker loads it, at once; if some fail, WorkerRequestError names them.
        """
        self._check_ready()
        self._weight_updates += 1
        version = weight_version or f"{Path(path).name}@{self._weight_updates}"
        body = {"model_path": str(path), "weight_version": version}
        if self._behind_router:  # every worker, retried per worker; a failure names the worker
            result = self._control("/update_weights_from_disk", body, what=f"update_weights_from_disk({str(path)!r})",
                                   retries=retries, backoff_s=backoff_s)
        else:
            result = self._update_weights(body, path, retries=retries, backoff_s=backoff_s)
        if isinstance(result, dict) and result.get("success") is False:
            raise ServerRequestError(f"update_weights_from_disk failed: {result.get('message')}", status=400)
        self._weights_path = str(path)
        self._weights_pushed = None
        self._weights = WeightsHash(path)  # the new weights' content hash, for records and the cache
        info = _loop.run_sync(self._client.get_info("model", timeout=30))
        self._weight_version = info.get("weight_version", version)
        return str(self._weight_version)

    def _update_weights(self, body: dict[str, Any], path: str | os.PathLike[str], *, retries: int,
                        backoff_s: float) -> Any:
        """POST /update_weights_from_disk to the server, retrying transient failures."""
        for attempt in range(retries + 1):
            try:
                return _loop.run_sync(self._client.post("/update_weights_from_disk", body))
            except ServerRequestError as err:
                if err.status < 500 or attempt == retries:
                    raise ServerRequestError(f"update_weights_from_disk({str(path)!r}) failed: {err.body}",
                                             status=err.status, body=err.body) from None
            except RequestError:
                if attempt == retries or not self._server_alive():
                    raise
            time.sleep(backoff_s * 2**attempt)
        raise AssertionError("unreachable: the last attempt returns or raises")

    def _server_alive(self) -> bool:
        return self._server is None or self._server.alive()

    def release_memory(self, tags: Sequence[str] | None = None) -> None:
        """Release the server's GPU memory (KV cache, weights); generate() fails until resume_memory()."""
        self._check_ready()
        if not self._memory_saver:
            raise EngineError("release_memory() needs the server started with enable_memory_saver=True")
        body = {"tags": list(tags)} if tags else {}
        self._control("/release_memory_occupation", body, what="release_memory()")
        self._released = set(tags) if tags else {"weights", "kv_cache", "cuda_graph"}

    def resume_memory(self, tags: Sequence[str] | None = None, *, load: str | os.PathLike[str] | None = None,
                      weight_version: str | None = None) -> None:
        """Take the GPU memory back; weights released earlier are reloaded so outputs are unchanged.

        `load`: a checkpoint to load instead (`update_weights_from_disk(load, weight_version=)`):
        one load rather than reloading the old weights and then loading new ones, and the old
        checkpoint need not exist any more.

        Weights pushed from tensors (`update_weights`) are not on disk: a reload brings back the
        checkpoint loaded before them, under its version. Push inside `paused()` to avoid that.
        """
        self._check_ready()
        resumed = self._resume(tags)
        if load is not None:
            self.update_weights_from_disk(load, weight_version=weight_version)
            return
        # SGLang's resume restores the weights' memory but not their values (greedy output comes back
        # empty; the CPU backend does the same). Reload them from disk, keeping the weight version,
        # so outputs are unchanged. The path and the version are the ones this Engine last loaded
        # (connect or update_weights_from_disk), one source for both.
        if "weights" in resumed:
            self._reload_disk_weights("resume_memory() reloading the weights")

    def _resume(self, tags: Sequence[str] | None) -> set[str]:
        """POST /resume_memory_occupation for `tags` (None: those this Engine released, by name: SGLang's
        scheduler fails on a tag that is not released); returns the tags resumed."""
        resuming = set(tags) if tags else set(self._released)
        body = {"tags": sorted(resuming)} if resuming else {}
        self._control("/resume_memory_occupation", body, what="resume_memory()")
        self._released = self._released - resuming
        return resuming

    def _reload_disk_weights(self, what: str) -> None:
        """Load the weights this Engine last loaded from disk again, under the version they had."""
        version = self._disk_version if self._weights_pushed is not None else self._weight_version
        path = self._weights_path or self.model_path
        self._control("/update_weights_from_disk", {"model_path": path, "weight_version": version}, what=what)
        if self._weights_pushed is not None:
            self._weights_pushed = None
            self._weight_version = version
            self._weights = WeightsHash(path)

    @contextlib.contextmanager
    def paused(self, *, load: str | os.PathLike[str] | None = None, weight_version: str | None = None
               ) -> Iterator[None]:
        """Free the server's GPU memory for the block (e.g. a training step), then take it back.

        `load`: the checkpoint the block writes (e.g. `policy.save_pretrained(path)`); leaving the
        block loads it in place of the old weights, as `weight_version` (one load, not a reload of
        the old weights plus `update_weights_from_disk`). If the block raises, the old weights come
        back instead.
        """
        self.release_memory()
        finished = False
        try:
            yield
            finished = True
        finally:
            if finished:
                self.resume_memory(load=load, weight_version=weight_version)
            else:
                self.resume_memory()

    def metrics(self) -> pd.DataFrame:
        """SGLang's Prometheus metrics as a DataFrame (name, labels, value); needs enable_metrics=True."""
        self._check_ready()
        if not self._metrics_enabled:
            raise EngineError("metrics() needs the Engine started with enable_metrics=True")
        import pandas as pd

        text = _loop.run_sync(self._client.get("/metrics", timeout=30))
        return pd.DataFrame(parse_prometheus(str(text)), columns=["name", "labels", "value"])
