"""The CPU backend's `/parse_function_call`: SGLang's tool-call parsers, as far as the backend has them.

Owns: the request check and the answer of `POST /parse_function_call` and the one parser the backend
has, "hermes" (`<tool_call>{"name": ..., "arguments": {...}}</tool_call>`), written to answer exactly as
SGLang's HermesDetector under FunctionCallParser.parse_non_stream does. Knows nothing about HTTP
(`_app` routes the request and shapes errors), the model, or the rest of rlgen: the client side's own
reading (`rlgen.episodes._tool_calls.parse_hermes`) is a separate copy, since this package imports
nothing of rlgen and rlgen.episodes does not import the server; the tests run both on the same cases.

SGLang's wire format (sgl-project/sglang: python/sglang/srt/entrypoints/http_server.py
`parse_function_call_request`; python/sglang/srt/managers/io_struct.py `ParseFunctionCallReq`;
python/sglang/srt/function_call/core_types.py `ToolCallItem`; hermes_detector.py and
base_format_detector.py `parse_base_json`):

    request  {"text": str, "tools": [{"type": "function", "function": {"name", "description",
              "parameters"}}] (default []), "tool_call_parser": str | null}
    answer   {"normal_text": str, "calls": [{"tool_index": int, "name": str, "parameters": str}]}

What SGLang 0.5.17's hermes answer is, and so this one (checked against SGLang's own answers on the
H200, 36 cases in tests/data/parse_function_call_cases.json, docs/gpu/2026-12-02i): with no tools,
the text unchanged and no calls. Without `<tool_call>`, the same. Otherwise every block is read,
`<tool_call>(.*?)</tool_call>` or, without a closing tag, `<tool_call>` to the end of the text, each
decoded with `json.loads` (so a `</tool_call>` inside a JSON string ends its block); if any block does
not decode, or holds a value that is not an object, the answer is the text unchanged with no calls
(SGLang catches the error). Else normal_text is the text before the first `<tool_call>`, stripped
(text between and after calls is dropped). A list is several calls. A call whose name is not among
the tools is dropped (SGLang logs a warning; its SGLANG_FORWARD_UNKNOWN_TOOLS is not modelled).
"parameters" is `json.dumps(call.get("parameters") or call.get("arguments", {}), ensure_ascii=False)`.
`tool_index` is the name's position in `tools` (the last one, for a repeated name).

Where the backend differs: an unknown or missing `tool_call_parser` is a 400 naming the parsers it
has; SGLang raises ValueError("Unsupported tool_call_parser: ...") there, which its server answers
500. Newer SGLang versions add `"tool_call_id": null` to each call; 0.5.17's answer is not checked on
the GPU here yet.
"""

from __future__ import annotations

import json
import re
from typing import Any

__all__ = ["PARSERS", "ToolParserError", "parse_function_call"]

PARSERS = ("hermes",)

_OPEN = "<tool_call>"
# SGLang 0.5.17's hermes_detector.py: a block ends at the first `</tool_call>` (even inside a JSON
# string), or runs to the end of the text when it has no closing tag.
_BLOCKS = re.compile(r"<tool_call>(.*?)</tool_call>|<tool_call>(.*)", re.DOTALL)


class ToolParserError(ValueError):
    """A request the backend cannot answer: a bad field, or a parser it does not have (a 400)."""


def parse_function_call(body: Any) -> dict[str, Any]:
    """The answer to one `/parse_function_call` body; ToolParserError for a bad request."""
    if not isinstance(body, dict):
        raise ToolParserError(f"the body must be a JSON object, got {type(body).__name__}")
    text = body.get("text")
    if not isinstance(text, str):
        raise ToolParserError("field 'text' is required and must be a string")
    tools = body.get("tools", [])
    if tools is None:
        tools = []
    if not isinstance(tools, list) or not all(isinstance(t, dict) and isinstance(t.get("function"), dict)
                                              for t in tools):
        raise ToolParserError("field 'tools' must be a list of {'type': 'function', 'function': {'name': ..., ...}}")
    parser = body.get("tool_call_parser")
    if parser not in PARSERS:
        raise ToolParserError(f"Unsupported tool_call_parser: {parser!r}. The CPU backend has: "
                              f"{', '.join(PARSERS)} (SGLang on a GPU has the others)")
    names = [t["function"].get("name") for t in tools]
    if not tools:
        return {"normal_text": text, "calls": []}
    normal_text, calls = parse_hermes(text, names)
    return {"normal_text": normal_text, "calls": calls}


def parse_hermes(text: str, names: list[Any]) -> tuple[str, list[dict[str, Any]]]:
    """(normal_text, calls) as SGLang 0.5.17's HermesDetector.detect_and_parse answers for these tool names."""
    first = text.find(_OPEN)
    if first == -1:
        return text, []
    indices = {name: i for i, name in enumerate(names) if name}
    calls: list[dict[str, Any]] = []
    try:
        for closed, open_ended in _BLOCKS.findall(text):
            raw = closed or open_ended
            if not raw:
                continue
            obj = json.loads(raw.strip())
            for act in obj if isinstance(obj, list) else [obj]:
                name = act.get("name")  # AttributeError for a non-object: caught below, as SGLang does
                if not (name and name in indices):
                    continue  # SGLang: "Model attempted to call undefined function"
                calls.append({"tool_index": indices[name], "name": name,
                              "parameters": json.dumps(act.get("parameters") or act.get("arguments", {}),
                                                       ensure_ascii=False)})
    except Exception:  # SGLang catches any error of any block: no calls, the text unchanged
        return text, []
    return text[:first].strip(), calls
