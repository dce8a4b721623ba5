"""Reading a model's turn into tool calls: the built-in `hermes` parser, SGLang's own parsers, yours.

Owns: `ToolCall` (a name, its arguments, the text it was read from), `ParsedTurn` (the turn's text
without its calls, the calls, and an error when a call could not be read), `parse_hermes` (rlgen's
reading of `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`), `parse_with_server` (SGLang's
`/parse_function_call`, answered by SGLang's parser for the model family, `--tool-call-parser` names,
or by the CPU backend's own hermes parser) and `parse_tool_calls`, which dispatches to "hermes" or to
a parser you pass. A model's malformed call is a result (`ParsedTurn.error`), never an exception.
Knows nothing about running tools (`_tools`), tokenizers, sampling, rollouts or the Engine; of HTTP
it knows only the request and answer of `/parse_function_call`, sent through any object with an
async `post(path, body)` (rlgen's `client._http.Client`).

The CPU backend has its own copy of the hermes reading (`rlgen/cpu_server/_tool_parsers.py`: the
server imports nothing of rlgen, and this layer does not import the server); it answers as SGLang
does (drops what it cannot read, and calls to names not among the tools), while `parse_hermes` here
reports those as `error`. The tests run both on the same cases.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from ._tools import Tool

__all__ = ["ParsedTurn", "ToolCall", "ToolCallParser", "outside_think", "parse_hermes", "parse_tool_calls",
           "parse_with_server", "with_unoffered_calls"]

_OPEN, _CLOSE = "<tool_call>", "</tool_call>"
# What starts a call for some of SGLang's --tool-call-parser names: a turn that holds it but gets no
# call back from the server wrote a call the server could not read.
_CALL_MARKERS = {"hermes": _OPEN, "qwen25": _OPEN, "qwen": _OPEN, "llama3": "<|python_tag|>",
                 "mistral": "[TOOL_CALLS]"}


@dataclass(frozen=True)
class ToolCall:
    """One call the model wrote: the tool's name, its arguments (a dict), and `raw`, the text it was
    read from (for a call read by a server: the server's JSON of the arguments, as SGLang does not
    return the call's text)."""

    name: str
    arguments: dict[str, Any]
    raw: str


@dataclass(frozen=True)
class ParsedTurn:
    """A model's turn read for tool calls.

    Attributes:
        text_without_calls: the turn's text with the call blocks taken out (stripped), for the
            assistant message's content.
        calls: the calls read, in order (those that could be read, when `error` is set too).
        error: None, or "malformed tool call: ..." saying what could not be read (bad JSON, no name,
            arguments that are not an object, an unclosed block); the calls it concerns are left out.
    """

    text_without_calls: str
    calls: tuple[ToolCall, ...] = ()
    error: str | None = None


# A parser you pass: text -> ParsedTurn, or a list of (name, arguments) pairs.
ToolCallParser = Callable[[str], "ParsedTurn | Sequence[tuple[str, Mapping[str, Any]]]"]


class _Poster(Protocol):
    async def post(self, path: str, body: Any = None, **kwargs: Any) -> Any: ...


# ---------------------------------------------------------------------------------------------
# reasoning blocks

_THINK_OPEN, _THINK_CLOSE = "<think>", "</think>"


def outside_think(text: str) -> tuple[str, str]:
    """(the text outside `<think>...</think>` blocks, the text inside them).

    A turn's reasoning is not where it calls tools: a call written inside a block is the model
    thinking about a call, and executing it runs a tool the model did not ask for (verl #4757,
    #6424). Cut as reasoning parsers cut it: a block runs from `<think>` to the next `</think>`; an
    unclosed `<think>` runs to the end of the text; text before a first `</think>` with no
    `<think>` before it is a block too (templates such as Qwen3's open the block in the prompt, so
    the sampled turn starts inside it).
    """
    outside: list[str] = []
    inside: list[str] = []
    first_close, first_open = text.find(_THINK_CLOSE), text.find(_THINK_OPEN)
    pos = 0
    if first_close != -1 and (first_open == -1 or first_close < first_open):
        inside.append(text[:first_close])
        pos = first_close + len(_THINK_CLOSE)
    while (start := text.find(_THINK_OPEN, pos)) != -1:
        outside.append(text[pos:start])
        end = text.find(_THINK_CLOSE, start + len(_THINK_OPEN))
        if end == -1:
            inside.append(text[start + len(_THINK_OPEN):])
            pos = len(text)
            break
        inside.append(text[start + len(_THINK_OPEN):end])
        pos = end + len(_THINK_CLOSE)
    outside.append(text[pos:])
    return "".join(outside), "".join(inside)


# ---------------------------------------------------------------------------------------------
# hermes


def parse_hermes(text: str) -> ParsedTurn:
    """Read every `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` block of `text`.

    Blocks are cut as SGLang 0.5.17's HermesDetector cuts them: from `<tool_call>` to the first
    `</tool_call>` (even one inside a JSON string), or to the end of the text when there is no
    closing tag (a model stopped by the stop string `</tool_call>`, which SGLang trims); each is read
    with `json.loads`. A list of calls in one block is read as several calls; "parameters" is
    accepted for "arguments", and arguments sent as a JSON string are decoded. A block that cannot
    be read is left out of `calls` and named in `error` (SGLang's parser drops every call then; a
    tool environment ends the episode "bad_tool_call"); the other blocks are still read.
    """
    calls: list[ToolCall] = []
    problems: list[str] = []
    kept: list[str] = []
    pos = 0
    while (start := text.find(_OPEN, pos)) != -1:
        kept.append(text[pos:start])
        body_at = start + len(_OPEN)
        close = text.find(_CLOSE, body_at)
        block_end = len(text) if close == -1 else close + len(_CLOSE)
        raw = text[start:block_end]
        try:
            obj = json.loads(text[body_at:len(text) if close == -1 else close].strip())
        except json.JSONDecodeError as e:
            problems.append(f"bad JSON ({e.msg} at char {e.pos}) in {_clip(raw)}")
            pos = block_end
            continue
        for item in obj if isinstance(obj, list) else [obj]:
            call, problem = _call_from_json(item, raw)
            if call is not None:
                calls.append(call)
            else:
                problems.append(f"{problem} in {_clip(raw)}")
        pos = block_end
    kept.append(text[pos:])
    error = "malformed tool call: " + "; ".join(problems) if problems else None
    return ParsedTurn("".join(kept).strip(), tuple(calls), error)


def _call_from_json(item: Any, raw: str) -> tuple[ToolCall | None, str]:
    if not isinstance(item, dict):
        return None, f"a {type(item).__name__} where an object with a name was expected"
    name = item.get("name")
    if not isinstance(name, str) or not name:
        return None, "no name"
    arguments = item.get("arguments", item.get("parameters", {}))
    if isinstance(arguments, str):  # some models send OpenAI's arguments string
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError:
            return None, f"arguments of {name!r} are a string that is not JSON"
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, dict):
        return None, f"arguments of {name!r} are a {type(arguments).__name__}, not an object"
    return ToolCall(name, arguments, raw), ""


def _clip(s: str, n: int = 120) -> str:
    return repr(s if len(s) <= n else s[: n - 3] + "...")


# ---------------------------------------------------------------------------------------------
# SGLang's /parse_function_call
#
# Read from SGLang's source (sgl-project/sglang, python/sglang/srt/entrypoints/http_server.py,
# `parse_function_call_request`; the request type `ParseFunctionCallReq` in
# python/sglang/srt/managers/io_struct.py; the call type `ToolCallItem` in
# python/sglang/srt/function_call/core_types.py; the parser names in `FunctionCallParser.
# ToolCallParserEnum`, python/sglang/srt/function_call/function_call_parser.py):
#   POST /parse_function_call
#   request:  {"text": str, "tools": [{"type": "function", "function": {"name", "description",
#              "parameters"}}], "tool_call_parser": str}   ("hermes", "qwen25", "llama3", "mistral", ...)
#   answer:   200 {"normal_text": str, "calls": [{"tool_index": int, "name": str | null,
#              "parameters": str (the arguments as a JSON string, json.dumps(ensure_ascii=False)),
#              "tool_call_id": str | null (newer versions only)}]}
#   SGLang drops calls it cannot read and calls to names not in "tools" (unless
#   SGLANG_FORWARD_UNKNOWN_TOOLS), answers normal_text = the text unchanged when "tools" is empty,
#   and raises on an unknown parser name (ValueError: "Unsupported tool_call_parser: ..."; a 500),
#   where the CPU backend answers 400.


def _wire_tool(tool: Tool | Mapping[str, Any]) -> dict[str, Any]:
    schema = tool.schema if isinstance(tool, Tool) else tool
    function = schema.get("function", {})
    return {"type": "function", "function": {k: function[k] for k in ("name", "description", "parameters")
                                             if k in function}}


async def parse_with_server(client: _Poster, text: str, tools: Sequence[Tool | Mapping[str, Any]],
                            parser: str = "hermes") -> ParsedTurn:
    """Read `text` with the server's own parser (SGLang's `--tool-call-parser` names; the CPU backend
    knows "hermes") through `POST /parse_function_call`.

    SGLang drops a call it cannot read or whose name is not among `tools`, so `calls` cannot say
    which; when the server found a call marker (its `normal_text` is not `text`) but returned no call,
    `error` says so. HTTP failures (an unknown parser name, a server that is down) raise rlgen's
    request errors: they are not the model's doing.
    """
    body = {"text": text, "tools": [_wire_tool(t) for t in tools], "tool_call_parser": parser}
    answer = await client.post("/parse_function_call", body)
    if not isinstance(answer, dict) or not isinstance(answer.get("calls"), list):
        raise ValueError(f"/parse_function_call answered {answer!r}, not {{'normal_text': ..., 'calls': [...]}}")
    normal = answer.get("normal_text")
    normal = normal if isinstance(normal, str) else ""
    calls: list[ToolCall] = []
    problems: list[str] = []
    for item in answer["calls"]:
        parameters = item.get("parameters") if isinstance(item, dict) else None
        name = item.get("name") if isinstance(item, dict) else None
        try:
            arguments = json.loads(parameters) if isinstance(parameters, str) and parameters else {}
        except json.JSONDecodeError:
            arguments = None
        if not isinstance(name, str) or not name or not isinstance(arguments, dict):
            problems.append(f"the server returned {item!r}")
            continue
        calls.append(ToolCall(name, arguments, parameters if isinstance(parameters, str) else "{}"))
    marker = _CALL_MARKERS.get(parser)
    if not calls and not problems and (normal != text or (marker is not None and marker in text)):
        # SGLang 0.5.17's hermes answers a block it cannot decode with the text unchanged and no
        # calls, as it answers a turn without one: the call marker in the text tells them apart.
        problems.append("the server's parser found a tool call it could not read, or one to a tool not offered "
                        "(SGLang drops both)")
    error = "malformed tool call: " + "; ".join(problems) if problems else None
    return ParsedTurn(normal.strip(), tuple(calls), error)


def with_unoffered_calls(parsed: ParsedTurn, text: str, tools: Sequence[Tool | Mapping[str, Any]],
                         parser: str) -> ParsedTurn:
    """The server's reading `parsed` of `text`, with the calls to tools not offered put back: for a
    framework whose own loop answers such a call and goes on (verifiers' `ToolEnv` answers the
    KeyError), where SGLang drops it. Where the server's parser reads hermes' `<tool_call>` blocks
    ("hermes", "qwen25", "qwen"), rlgen's `parse_hermes` reading of `text` replaces `parsed` when it
    reads every block and one names a tool not among `tools`; else (another format, a block it cannot
    read either, no such call) `parsed` is returned as it is."""
    if _CALL_MARKERS.get(parser) != _OPEN:
        return parsed
    own = parse_hermes(text)
    offered = {_wire_tool(t)["function"].get("name") for t in tools}
    if own.error is None and any(c.name not in offered for c in own.calls):
        return own
    return parsed


# ---------------------------------------------------------------------------------------------
# Dispatch


def parse_tool_calls(text: str, parser: str | ToolCallParser = "hermes") -> ParsedTurn:
    """Read `text` with the built-in "hermes" parser or a parser you pass.

    A parser you pass takes the text and returns a `ParsedTurn`, or a list of (name, arguments)
    pairs (the text is then kept whole). If it raises, or returns something else, the turn gets
    `error` ("malformed tool call: ...") and no calls: a parser's failure on the model's text is
    the model's malformed call, not a crash. For SGLang's own parsers use `parse_with_server`.
    """
    if parser == "hermes":
        return parse_hermes(text)
    if isinstance(parser, str):
        raise ValueError(f"unknown tool-call parser {parser!r}: the built-in one is 'hermes'; for SGLang's "
                         "parsers (--tool-call-parser names) use parse_with_server, or pass a function")
    if not callable(parser):
        raise TypeError(f"parser must be 'hermes' or a function text -> ParsedTurn | [(name, arguments)], "
                        f"got {type(parser).__name__}")
    try:
        result = parser(text)
    except Exception as e:
        return ParsedTurn(text.strip(), (), f"malformed tool call: the parser raised {type(e).__name__}: {e}")
    if isinstance(result, ParsedTurn):
        return result
    calls: list[ToolCall] = []
    try:
        for name, arguments in result:
            if not isinstance(name, str) or not name or not isinstance(arguments, Mapping):
                raise TypeError(f"({name!r}, {type(arguments).__name__})")
            calls.append(ToolCall(name, dict(arguments), json.dumps({"name": name, "arguments": dict(arguments)},
                                                                  ensure_ascii=False, default=str)))
    except (TypeError, ValueError) as e:
        return ParsedTurn(text.strip(), (), "malformed tool call: the parser returned something other than "
                                            f"a ParsedTurn or (name, arguments) pairs: {e}")
    return ParsedTurn(text.strip(), tuple(calls), None)

