"""Multi-turn episodes, token-in/token-out: the ids of each turn through a chat template, and the drift inspector.

Owns: the token arithmetic of an episode whose history is never re-tokenized (`_template`: the first
prompt, the delta of new messages cut token-wise after a fixed base's last EOS, the closing EOS of a
turn that stopped without one) and the comparison of an episode's ids with the trainer's re-render
of its messages (`_drift`: the first divergence, its cause, a summary over episodes); tools
(`_tools`: plain functions with a function-calling schema from their signature and docstring, called
contained with a per-call status, through rlgen.rewards' thread runner) and reading a model's turn
into tool calls (`_tool_calls`: the built-in "hermes" parser, SGLang's `/parse_function_call`, or a
parser you pass); environments (`_env`), one episode as named state (`_episode`: `Episode`'s start,
sample, step and finish over `/generate` with `input_ids`, each turn a `Turn` of `_result`), the
runner of a call's episodes and the checks of its inputs (`_runner`) and the result
(`_episodes.Episodes`: a `Rollouts` with a row per episode, built from the runner's
`EpisodeRecord`s). Knows nothing about launching servers or the Engine: it takes a client to post
to, a Hugging Face tokenizer with a chat template, messages, ids and functions, and returns ids,
records, tool results, parsed turns and `Episodes`.

Usage::

    from rlgen import episodes
    ids = episodes.first_prompt_ids(tok, [{"role": "user", "content": "2+2?"}])
    ids += sampled                                   # the model's turn, ending with EOS (id 2)
    ids += episodes.closing_ids(tok, sampled)        # [] here; [2] (mask 0) after a stop string
    ids += episodes.message_delta_ids(tok, [{"role": "user", "content": "Sure?"}])
    episodes.drift(tok, messages, ids)               # Drift(cause='same', ...)
"""

from __future__ import annotations

from ._drift import CAUSES, Drift, drift, drift_summary
from ._env import Environment, EnvReply, EpisodeEnv, ToolEnv, as_environment, tool_env
from ._episodes import ROLE_CODES, Episodes, episodes_from_records
from ._result import EpisodeRecord, Turn, turns_frame
from ._runner import run_episodes
from ._template import TemplateError, closing_ids, first_prompt_ids, message_delta_ids
from ._tool_calls import ParsedTurn, ToolCall, ToolCallParser, parse_hermes, parse_tool_calls, parse_with_server
from ._tools import Tool, ToolResult, ToolStatus, acall_tool, call_tool, tool_schema, tools_from

__all__ = [
    "CAUSES",
    "ROLE_CODES",
    "Drift",
    "EnvReply",
    "Environment",
    "EpisodeEnv",
    "EpisodeRecord",
    "Episodes",
    "ParsedTurn",
    "TemplateError",
    "Tool",
    "ToolCall",
    "ToolCallParser",
    "ToolEnv",
    "ToolResult",
    "ToolStatus",
    "Turn",
    "acall_tool",
    "as_environment",
    "call_tool",
    "closing_ids",
    "drift",
    "drift_summary",
    "episodes_from_records",
    "first_prompt_ids",
    "message_delta_ids",
    "parse_hermes",
    "parse_tool_calls",
    "parse_with_server",
    "run_episodes",
    "tool_env",
    "tool_schema",
    "tools_from",
    "turns_frame",
]
