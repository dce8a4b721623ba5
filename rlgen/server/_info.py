"""What a server says about itself: SGLang's `/server_info` (or the CPU backend's), interpreted.

Owns: reading from a server's info dict the facts the client acts on: how many requests it runs at
once, the model's context length, and whether it honours per-request sampling seeds. Knows nothing
about HTTP (the caller fetched the dict) or about processes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

__all__ = ["context_length", "honours_seed", "memory_usage", "running_capacity"]


def running_capacity(server_info: dict[str, Any]) -> int | None:
    """How many requests the server runs at once: SGLang's effective max_running_requests, summed
    over its data-parallel ranks (/server_info's internal_states); None where it does not say."""
    states = server_info.get("internal_states")
    if not isinstance(states, list):
        return None
    total = 0
    for state in states:
        count = state.get("effective_max_running_requests_per_dp") if isinstance(state, dict) else None
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            return None
        total += count
    return total or None


def memory_usage(server_info: dict[str, Any]) -> list[dict[str, Any]] | None:
    """SGLang's own account of the GPU memory it took, one entry per data-parallel rank (behind a
    router: per rank of every worker): weights, KV cache and CUDA graphs in GB and the KV cache's
    token capacity, as its /server_info's internal_states say at the time it was read; None where
    the server does not say (the CPU backend, older SGLang)."""
    states = server_info.get("internal_states")
    usage = [s.get("memory_usage") for s in states if isinstance(s, dict)] if isinstance(states, list) else []
    if not usage or not all(isinstance(u, dict) for u in usage):
        return None
    return [dict(u) for u in usage if isinstance(u, dict)]


def context_length(server_info: dict[str, Any], tokenizer: Any, model_path: str) -> int | None:
    """The model's context: an explicit server setting, else the checkout's config, else what the
    server says is the longest input (SGLang's `max_req_input_len`, a few tokens under the context)."""
    value = server_info.get("context_length")
    if isinstance(value, int) and value > 0:
        return value
    config = Path(model_path) / "config.json"
    if model_path and config.is_file():
        value = json.loads(config.read_text()).get("max_position_embeddings")
        if isinstance(value, int):
            return value
    value = server_info.get("max_req_input_len")
    if isinstance(value, int) and value > 0:
        return value
    limit = getattr(tokenizer, "model_max_length", None)
    return limit if isinstance(limit, int) and limit < 10**9 else None


def honours_seed(server_info: dict[str, Any]) -> bool:
    """Whether `sampling_seed` makes sampling reproducible: always on the CPU backend; on SGLang only
    in deterministic-inference mode."""
    return server_info.get("rlgen_backend") == "cpu" or bool(server_info.get("enable_deterministic_inference"))
