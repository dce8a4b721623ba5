"""What a call needs to talk to the server: `Connection`.

Owns: the client (plain, or an sglang-router's), what the server said about itself at connection
(`/server_info`), the tokenizer and what is read from it once (its vocabulary size, each result's
token-text decoder, its pad id), the context length, prompt normalisation with them, the Engine's
progress setting and a call's progress line, and the Engine's readiness check (`check_ready`,
which raises when the Engine is closed or its server died). Knows nothing about how the server was
started or stops, about weights or about the completion cache.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..client._generate import GenerateJob
from ..client._http import Client
from ..client._prompts import PromptBatch, normalize_prompts
from ..core._types import Prompts
from ..rollouts._token_text import TokenText
from ..server import _info as _server_info

if TYPE_CHECKING:
    from ..core._progress import ProgressLine

__all__ = ["AUTO_CHUNK_MAX", "Connection"]

# The most prompts per /generate request when the caller sets no chunk_size.
AUTO_CHUNK_MAX = 256


@dataclass(eq=False)
class Connection:
    """The client and what the server and tokenizer said, as read once at connection."""

    client: Client
    server_info: dict[str, Any]
    tokenizer: Any
    context_length: int | None
    progress: bool | None                 # the Engine's progress setting (None: auto)
    check_ready: Callable[[], None]       # raises EngineClosedError / ServerDiedError / EngineError
    behind_router: bool = False

    def __post_init__(self) -> None:
        self.token_text = TokenText(self.tokenizer)  # each result's decode: token text for its view
        self.vocab_size = len(self.tokenizer)  # once: some tokenizers rebuild the vocabulary for len()

    @property
    def cpu_backend(self) -> bool:
        """Whether the server is rlgen's CPU backend."""
        return self.server_info.get("rlgen_backend") == "cpu"

    @property
    def pad_id(self) -> int:
        pad = self.tokenizer.pad_token_id
        return int(pad if pad is not None else (self.tokenizer.eos_token_id or 0))

    def running_capacity(self) -> int | None:
        return _server_info.running_capacity(self.server_info)

    def normalize(self, prompts: Prompts, *, max_new_tokens: int) -> PromptBatch:
        return normalize_prompts(prompts, tokenizer=self.tokenizer, vocab_size=self.vocab_size,
                                 context_length=self.context_length, max_new_tokens=max_new_tokens)

    def progress_line(self, job: GenerateJob, progress: bool | None, *, label: str = "generate",
                      unit: str = "sample") -> ProgressLine:
        """The call's progress line: auto mode shows it once the call has run a second."""
        from ..core._progress import ProgressLine

        return ProgressLine(label, total=job.n_samples, unit=unit, show=self.show(progress))

    def show(self, progress: bool | None) -> bool | None:
        """A call's `progress=`, else the Engine's."""
        return self.progress if progress is None else progress
