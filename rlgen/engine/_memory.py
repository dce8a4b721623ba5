"""Server control: the control requests, GPU memory released and taken back, the prefix cache, metrics.

Owns: `ServerControl`: a control POST (behind an sglang-router: to every worker it lists, at once,
since the router has no such routes), the memory tags released and not yet resumed (`release`,
`resume`: by name, as SGLang's scheduler fails on a tag that is not released), `flush_cache` and
`metrics`, with the start-up choices they need (`enable_memory_saver`, `enable_metrics`). Knows
nothing about weights (`_weights` reloads them after a resume), generation or scoring.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..client import _router
from ..client._http import Client, parse_prometheus
from ..core import _loop
from ..core._errors import EngineError

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["ALL_TAGS", "ServerControl"]

# What `release()` without tags frees: every tag SGLang's memory saver knows.
ALL_TAGS = frozenset({"weights", "kv_cache", "cuda_graph"})


class ServerControl:
    """Control requests to the server, and the memory this Engine released on it."""

    def __init__(self, client: Client, *, memory_saver: bool, metrics_enabled: bool) -> None:
        self._client = client
        self.memory_saver = memory_saver
        self.metrics_enabled = metrics_enabled
        self.released: set[str] = set()  # memory tags released and not yet resumed

    def post(self, path: str, body: dict[str, Any], *, what: str, retries: int = 0, backoff_s: float = 1.0) -> Any:
        """POST a control request to the server; behind a router, to every worker it lists, at once,
        raising one WorkerRequestError that names each worker that failed after all were tried.
        Returns the server's answer (behind a router: one worker's)."""
        return _loop.run_sync(self.apost(path, body, what=what, retries=retries, backoff_s=backoff_s))

    async def apost(self, path: str, body: dict[str, Any], *, what: str, retries: int = 0,
                    backoff_s: float = 1.0) -> Any:
        """`post` as a coroutine on rlgen's loop (for a request that must not be cancelled by Ctrl-C)."""
        if isinstance(self._client, _router.RouterClient):
            answers = await self._client.fan_out(path, body, what=what, retries=retries, backoff_s=backoff_s)
            return next(iter(answers.values()), None)
        return await self._client.post(path, body)

    def flush_cache(self) -> None:
        self.post("/flush_cache", {}, what="flush_cache()")

    def release(self, tags: Sequence[str] | None) -> None:
        """Release `tags` (None: all) of the server's GPU memory."""
        if not self.memory_saver:
            raise EngineError("release_memory() needs the server started with enable_memory_saver=True")
        body = {"tags": list(tags)} if tags else {}
        self.post("/release_memory_occupation", body, what="release_memory()")
        self.released = set(tags) if tags else set(ALL_TAGS)

    def resume(self, tags: Sequence[str] | None) -> set[str]:
        """Take back `tags` (None: those this Engine released, by name); returns the tags resumed."""
        resuming = set(tags) if tags else set(self.released)
        body = {"tags": sorted(resuming)} if resuming else {}
        self.post("/resume_memory_occupation", body, what="resume_memory()")
        self.released = self.released - resuming
        return resuming

    def metrics(self) -> pd.DataFrame:
        if not self.metrics_enabled:
            raise EngineError("metrics() needs the Engine started with enable_metrics=True")
        import pandas as pd

        text = _loop.run_sync(self._client.get("/metrics", timeout=30))
        return pd.DataFrame(parse_prometheus(str(text)), columns=["name", "labels", "value"])
