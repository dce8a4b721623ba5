"""What the views read of a result: the `Rollouts` surface the display, the browser and the plots use.

Owns: `RolloutsView`, a typing Protocol of the members the views read (the DataFrame, token access,
per-row meta_info (an episode's turns), selection, run records). `Rollouts` satisfies it; the views
are typed against it, so they never import the module that defines `Rollouts` (which imports them:
the accessor pattern of pandas' `df.plot`, without an import cycle). Knows nothing about how any member is computed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["RolloutsView"]


class RolloutsView(Protocol):
    """The read-only surface of a `Rollouts` that views draw from."""

    pad_token_id: int
    model: str
    decode: Callable[[list[int]], list[str]] | None
    run_records: dict[str, dict[str, Any] | None]
    meta_info: list[dict[str, Any]]

    @property
    def df(self) -> pd.DataFrame: ...

    @property
    def n_tokens(self) -> int: ...

    @property
    def has_logprobs(self) -> bool: ...

    @property
    def extra_columns(self) -> list[str]: ...

    def __len__(self) -> int: ...

    def __getitem__(self, key: Any) -> RolloutsView: ...

    def where(self, condition: Any) -> RolloutsView: ...

    def tokens(self, i: int) -> dict[str, Any]: ...

    def id_lists(self, which: str = "response") -> list[list[int]]: ...

    def pass_at_k(self, k: int | Sequence[int], *, correct: str = "reward", threshold: float = 1.0) -> pd.Series: ...
