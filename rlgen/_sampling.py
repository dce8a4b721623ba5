"""The one sampling-parameter schema: validated once on the client, mapped 1:1 to SGLang's names.

Owns: the names and defaults of generate()'s sampling options, their validation (ValueError /
TypeError that say what to change, before anything is sent), and the `sampling_params` dict that
SGLang's `/generate` takes. Knows nothing about prompts, HTTP or results.
"""

from __future__ import annotations

import difflib
import math
from dataclasses import dataclass, fields
from typing import Any, Sequence

__all__ = ["Sampling", "check_unknown_options"]

# SGLang option names that rlgen passes through unchanged via `sampling_params=` (validated by the
# server). Listed so that a typo in them still gets a "did you mean".
_SGLANG_EXTRA = (
    "frequency_penalty", "presence_penalty", "json_schema", "regex", "ebnf", "structural_tag",
    "stop_regex", "logit_bias", "spaces_between_special_tokens", "custom_params", "stream_interval",
)


@dataclass(frozen=True)
class Sampling:
    """Sampling options of one generate() call (SGLang's names, except `seed` -> `sampling_seed`)."""

    max_new_tokens: int = 128          # tokens to generate at most (SGLang's default)
    min_new_tokens: int = 0            # EOS / stop tokens are masked until this many were generated
    temperature: float = 1.0           # 0 = greedy; rlgen sends it explicitly (SGLang would use the model's default)
    top_p: float = 1.0                 # nucleus sampling, in (0, 1]
    top_k: int = -1                    # -1 = whole vocabulary
    min_p: float = 0.0                 # in [0, 1]
    repetition_penalty: float = 1.0    # in (0, 2]; 1 = off
    stop: tuple[str, ...] = ()         # stop strings (trimmed from the text, reported as matched)
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    seed: int | None = None            # per-request sampling seed (SGLang `sampling_seed`)
    skip_special_tokens: bool = True
    no_stop_trim: bool = False

    def __post_init__(self) -> None:
        _check_int("max_new_tokens", self.max_new_tokens, minimum=0)
        _check_int("min_new_tokens", self.min_new_tokens, minimum=0)
        if self.min_new_tokens > self.max_new_tokens:
            raise ValueError(f"min_new_tokens ({self.min_new_tokens}) must not exceed max_new_tokens ({self.max_new_tokens})")
        _check_number("temperature", self.temperature)
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0 (0 = greedy), got {self.temperature}")
        _check_number("top_p", self.top_p)
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}; use top_p=1 to turn nucleus sampling off")
        _check_int("top_k", self.top_k, minimum=-1)
        if self.top_k == 0:
            raise ValueError("top_k must be -1 (whole vocabulary) or at least 1, got 0")
        _check_number("min_p", self.min_p)
        if not 0 <= self.min_p <= 1:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}")
        _check_number("repetition_penalty", self.repetition_penalty)
        if not 0 < self.repetition_penalty <= 2:
            raise ValueError(f"repetition_penalty must be in (0, 2] (1 = off), got {self.repetition_penalty}")
        if self.seed is not None:
            _check_int("seed", self.seed, minimum=0)
        object.__setattr__(self, "stop", _as_tuple("stop", self.stop, str))
        object.__setattr__(self, "stop_token_ids", _as_tuple("stop_token_ids", self.stop_token_ids, int))

    def to_sglang(self) -> dict[str, Any]:
        """The `sampling_params` dict for SGLang's /generate (only non-default extras are sent)."""
        params: dict[str, Any] = {
            "max_new_tokens": self.max_new_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": self.top_k,
            "min_p": self.min_p,
        }
        if self.min_new_tokens:
            params["min_new_tokens"] = self.min_new_tokens
        if self.repetition_penalty != 1.0:
            params["repetition_penalty"] = self.repetition_penalty
        if self.stop:
            params["stop"] = list(self.stop)
        if self.stop_token_ids:
            params["stop_token_ids"] = list(self.stop_token_ids)
        if self.ignore_eos:
            params["ignore_eos"] = True
        if self.seed is not None:
            params["sampling_seed"] = self.seed
        if not self.skip_special_tokens:
            params["skip_special_tokens"] = False
        if self.no_stop_trim:
            params["no_stop_trim"] = True
        return params


SAMPLING_NAMES = tuple(f.name for f in fields(Sampling))


def check_unknown_options(options: dict[str, Any], *, known: Sequence[str]) -> None:
    """Raise TypeError for option names generate() does not know, with a "did you mean"."""
    for name in options:
        if name in known:
            continue
        guess = difflib.get_close_matches(name, [*known, *_SGLANG_EXTRA], n=1)
        hint = f"; did you mean {guess[0]!r}?" if guess else ""
        if guess and guess[0] in _SGLANG_EXTRA:
            hint += f" SGLang-only options go in sampling_params={{{guess[0]!r}: ...}}"
        elif name in _SGLANG_EXTRA:
            hint = f"; pass SGLang-only options as sampling_params={{{name!r}: ...}}"
        raise TypeError(f"unknown generate() option {name!r}{hint}")


def _check_int(name: str, value: Any, *, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")


def _check_number(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number, got {type(value).__name__}")
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value}")


def _as_tuple(name: str, value: Any, kind: type) -> tuple:
    if value is None:
        return ()
    if isinstance(value, kind):
        return (value,)
    if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)):
        raise TypeError(f"{name} must be a {kind.__name__} or a list of them, got {type(value).__name__}")
    for item in value:
        if isinstance(item, bool) or not isinstance(item, kind):
            raise TypeError(f"{name} must contain only {kind.__name__} values, got {item!r}")
    return tuple(value)
