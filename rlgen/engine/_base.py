"""What every part of an `Engine` shares: its state, the attributes its parts read, and the few
methods they all call.

Owns: `EngineState`, `EngineBase` (the attributes an Engine holds, declared once for the mixins in
`_generation`, `_scoring` and `_control`; the lifecycle check `_check_ready`; the server's command
line; prompt normalisation with the Engine's tokenizer; a call's progress line). Knows nothing
about how an Engine is constructed or closed (`engine._engine`) or what its calls do.
"""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING, Any

from ..client._generate import GenerateJob
from ..client._http import Client
from ..client._prompts import PromptBatch, normalize_prompts
from ..core._errors import EngineClosedError, EngineError
from ..core._types import Prompts
from ..rollouts._token_text import TokenText
from ..server import _keep_alive
from ..server._command import redacted
from ..server._weights import WeightsHash

if TYPE_CHECKING:

    from ..client._completion_cache import CompletionCache
    from ..core._progress import ProgressLine
    from ..rollouts._rollouts import Rollouts
    from ..server._process import ServerProcess

__all__ = ["AUTO_CHUNK_MAX", "EngineBase", "EngineState"]

# The most prompts per /generate request when the caller sets no chunk_size.
AUTO_CHUNK_MAX = 256


class EngineState(enum.Enum):
    READY = "ready"        # generate() works
    FAILED = "failed"      # the server died; create a new Engine
    CLOSED = "closed"      # close() was called


class EngineBase:
    """The state an Engine's parts share (set by `Engine.__init__` / `Engine.connect`)."""

    model: str
    model_path: str
    backend: str
    url: str
    tokenizer: Any
    context_length: int | None
    last_result: Rollouts | None
    _state: EngineState
    _server: ServerProcess | None
    _kept: _keep_alive.Kept | None
    _client: Client
    _server_info: dict[str, Any]
    _progress: bool | None
    _vocab_size: int
    _token_text: TokenText
    _weights: WeightsHash
    _weight_version: str | None
    _weights_path: str | None
    _weights_pushed: str | None
    _disk_version: str | None
    _weight_updates: int
    _released: set[str]
    _gpu_name: str | None
    _cache_mode: bool | str
    _completions: CompletionCache | None
    _warned_unseeded: bool
    _memory_saver: bool
    _metrics_enabled: bool
    _behind_router: bool

    @property
    def state(self) -> EngineState:
        """READY, FAILED (the server died: create a new Engine) or CLOSED. Reading it changes nothing."""
        if self._state is EngineState.READY and self._server is not None and not self._server.alive():
            return EngineState.FAILED
        return self._state

    def _check_ready(self) -> None:
        state = self.state
        if state is EngineState.CLOSED:
            raise EngineClosedError("this Engine is closed; create a new one with rlgen.Engine(...)")
        if state is EngineState.FAILED:
            if self._server is not None:
                self._server.assert_alive()  # raises ServerDiedError with exit code and log tail
            raise EngineError("this Engine's server has failed; create a new Engine")

    def _on_connection_error(self) -> None:
        if self._server is not None and not self._server.alive():
            self._state = EngineState.FAILED
            self._server.assert_alive()

    def _command(self) -> list[str] | None:
        """The server's command line (API key redacted), or None for a server this Engine did not start."""
        server, kept = self._server, self._kept
        return redacted(server.argv) if server is not None else list(kept.record.argv) if kept is not None else None

    def _normalize(self, prompts: Prompts, *, max_new_tokens: int) -> PromptBatch:
        return normalize_prompts(prompts, tokenizer=self.tokenizer, vocab_size=self._vocab_size,
                                 context_length=self.context_length, max_new_tokens=max_new_tokens)

    def _progress_line(self, job: GenerateJob, progress: bool | None, *, label: str = "generate",
                       unit: str = "sample") -> ProgressLine:
        """The call's progress line: auto mode shows it once the call has run a second."""
        from ..core._progress import ProgressLine

        return ProgressLine(label, total=job.n_samples, unit=unit, show=self._progress if progress is None else progress)
