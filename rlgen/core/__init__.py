"""The bottom layer: what every other layer shares and nothing else.

Owns: the exception tree (`_errors`), the prompt and chat types (`_types`), the options schema
shared by every entry point (`_options`), the names of a result's columns (`_columns`), the
background event loop (`_loop`), progress lines (`_progress`), ragged arrays (`_ragged`) and
rlgen's cache directory (`_paths`). Knows nothing about servers, results or rewards: it imports no
other layer.
"""

from __future__ import annotations

from ._errors import RlgenError
from ._options import GenerateOptions, RewardOptions

__all__ = ["GenerateOptions", "RewardOptions", "RlgenError"]
