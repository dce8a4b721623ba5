"""The names of a result's columns: one schema, read by every layer that makes or checks a row.

Owns: rlgen's own DataFrame columns (`COLUMNS`, in order), the columns the client adds where they
apply (`CLIENT_COLUMNS`; a background job's weight versions, `VERSION_COLUMNS` and `KV_STALENESS`), those of a multi-turn episode's row (`EPISODE_COLUMNS`), those a rollout log adds (`LOG_COLUMNS`), the columns scoring writes for every prompt group (`GROUP_COLUMNS`), how
to tell the per-function reward columns rlgen wrote from a user's own columns that happen to start
with `reward_` (`reward_output_columns`), the names a user's per-prompt data may not take
(`RESERVED_DATA_NAMES`), and what an `adapter` cell says (`adapter_of`: a missing one is the base
model). Knows nothing about DataFrames, rewards or servers: these are names.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

__all__ = ["CLIENT_COLUMNS", "COLUMNS", "EPISODE_COLUMNS", "GROUP_COLUMNS", "KV_STALENESS", "LOG_COLUMNS",
           "RESERVED_DATA_NAMES", "VERSION_COLUMNS", "adapter_of", "reward_output_columns", "scored_reward_names"]

# Built-in DataFrame columns, in order. Extra columns (from the client, or added by users, e.g.
# rewards) come after them.
COLUMNS = (
    "prompt_index", "sample_index", "prompt", "completion", "finish_reason", "matched_stop",
    "prompt_tokens", "completion_tokens", "cached_tokens", "logprob_sum", "logprob_mean",
    "request_latency_s", "weight_version", "rid", "error", "run", "row_id",
)  # fmt: skip
# Columns the client adds where they apply (streaming timings; a chat prompt's messages; the LoRA
# adapter of each row, on a server that serves adapters): rlgen's
# own, like COLUMNS, but not every result has them. The rest of the extra columns are the user's.
# The weight versions of a background job's row (`Engine.submit`): the oldest and newest version
# index that sampled one of its tokens, the engine's version when the result was built minus the
# oldest (`staleness`), how many requests it took (`n_segments`: more than one when a weight
# update's pause cut it and it was continued), what its tokens attended to (`kv_staleness`, one of
# KV_STALENESS) and the server's `num_retractions` summed over its requests.
VERSION_COLUMNS = ("version_min", "version_max", "staleness", "n_segments", "kv_staleness", "num_retractions")
# `kv_staleness`, from best to worst: "fresh" (every token attended only to keys/values computed by
# the weights that sampled it); "old_prefix" (a request was prefilled while the server's prefix
# cache held prefixes an older version computed, after an update under pause 'retract' or
# 'in_place' that could not flush it: it may have reused one); "old_kv" (under pause 'in_place',
# tokens sampled after the update attended to keys/values the old weights computed).
KV_STALENESS = ("fresh", "old_prefix", "old_kv")
CLIENT_COLUMNS = ("ttft_s", "itl_s", "prompt_messages", "adapter", *VERSION_COLUMNS)
# The columns of a multi-turn episode's row beyond COLUMNS (`rlgen.Episodes`): how it ended, its
# size, its tools and environment, the conversation as messages (prompt_messages is the client's
# column above, also for episodes), and what the drift inspector found (`Episodes.check_drift`).
EPISODE_COLUMNS = (
    "status", "turns", "sampled_tokens", "tool_calls", "tool_calls_failed", "env_seconds", "cached_share",
    "completion_messages", "turn_rewards", "step_rewards", "drift", "drift_turn", "drift_position",
)  # fmt: skip
# The columns a rollout log (`rlgen.RolloutLog`) adds to each row it holds: the training step; the
# prompt's key, stable across steps (the same prompt at step 10 and at step 300 has one key); and
# `retokenized`, True on rows imported from a framework's text-only log, whose token ids were
# made from the text by a tokenizer, not sampled (no logprobs, no token-faithfulness claim).
LOG_COLUMNS = ("step", "prompt_key", "retokenized")
# Columns scoring writes for each prompt group; a second add_rewards call replaces them.
GROUP_COLUMNS = ("reward", "group_mean", "group_std", "group_zero_std", "advantage")
# What `generate(data=...)` refuses as a data column: every name rlgen writes itself.
RESERVED_DATA_NAMES = (*COLUMNS, *CLIENT_COLUMNS, *EPISODE_COLUMNS, *GROUP_COLUMNS)


def scored_reward_names(columns: Iterable[str]) -> list[str]:
    """The names of the reward functions scored into `columns`, in column order: each `<name>` with
    both `reward_<name>` and `reward_<name>_status`."""
    names = list(columns)
    present = set(names)
    return [c[len("reward_"):-len("_status")] for c in names
            if c.startswith("reward_") and c.endswith("_status") and c[:-len("_status")] in present]


def reward_output_columns(columns: Iterable[str]) -> list[str]:
    """The columns among `columns` that scoring wrote: the group columns, and for each scored
    function `<name>` (`scored_reward_names`) `reward_<name>` and `reward_<name>_*`. A user's
    `reward_model` column with no `reward_model_status` is data."""
    names = list(columns)
    scored = scored_reward_names(names)
    owned = {f"reward_{s}" for s in scored}
    return [c for c in names if c in GROUP_COLUMNS or c in owned
            or any(c.startswith(f"reward_{s}_") for s in scored)]


def adapter_of(value: Any) -> str | None:
    """The LoRA adapter an `adapter` cell names; None for the base model (None, or NaN: a DataFrame
    reads a base row's None as NaN)."""
    if value is None or (isinstance(value, float) and value != value):
        return None
    return str(value)
