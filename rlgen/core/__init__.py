"""The bottom layer: what every other layer shares and nothing else.

Owns: the exception tree (`core._errors`), the prompt and chat types (`core._types`), the options schema
shared by every entry point (`core._options`), the names of a result's columns (`_columns`), the
background event loop (`core._loop`), progress lines (`core._progress`), ragged arrays (`core._ragged`) and
rlgen's cache directory (`core._paths`). Knows nothing about servers, results or rewards: it imports no
other layer.
"""

from __future__ import annotations

from ._errors import RlgenError
from ._options import GenerateOptions, RewardOptions

__all__ = ["GenerateOptions", "RewardOptions", "RlgenError"]
