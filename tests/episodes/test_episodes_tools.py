"""rlgen.episodes' tools and tool calls: schemas from signatures and docstrings, contained calls and
their statuses, the hermes parser, SGLang's /parse_function_call answer mapped, parsers you pass."""

from __future__ import annotations

import asyncio
import functools
import json
import math
import sys
import time
from typing import Any, Literal, Optional

import pytest

from rlgen.episodes import (
    ParsedTurn,
    Tool,
    ToolCall,
    acall_tool,
    call_tool,
    parse_hermes,
    parse_tool_calls,
    parse_with_server,
    tool_schema,
    tools_from,
)
from rlgen.episodes._tools import _own_schema


def calculate(expression: str) -> str:
    """Evaluate an arithmetic expression.

    Args:
        expression: e.g. '12 * 7'
    """
    return str(eval(expression, {"__builtins__": {}}))  # test-only calculator


def search(query: str, k: int, score: float, exact: bool, tags: list[str], filters: dict,
           order: Literal["asc", "desc"], page: int | None, lang: Optional[str] = None,  # noqa: UP045
           cursor: str | None = "start") -> list[str]:
    """Search the notes.

    Longer explanation that stays in the description.

    Args:
        query: what to look for
        k: how many results,
            at most 10
        score (float): the lowest score kept
        exact: match whole words only
        tags: tags every result has
        filters: field -> value
        order: sort order
        page: the page
        lang: a language code
        cursor: where to resume

    Returns:
        the titles found
    """
    return []


SEARCH_PROPERTIES = {
    "query": {"type": "string", "description": "what to look for"},
    "k": {"type": "integer", "description": "how many results, at most 10"},
    "score": {"type": "number", "description": "the lowest score kept"},
    "exact": {"type": "boolean", "description": "match whole words only"},
    "tags": {"type": "array", "items": {"type": "string"}, "description": "tags every result has"},
    "filters": {"type": "object", "description": "field -> value"},
    "order": {"type": "string", "enum": ["asc", "desc"], "description": "sort order"},
    "lang": {"type": "string", "nullable": True, "description": "a language code"},
    "page": {"type": "integer", "nullable": True, "description": "the page"},
    "cursor": {"type": "string", "nullable": True, "description": "where to resume"},
}


# ---- schemas -------------------------------------------------------------------------------------------


def test_calculator_schema_is_the_function_calling_format() -> None:
    schema = tool_schema(calculate)
    assert schema["type"] == "function"
    fn = schema["function"]
    assert fn["name"] == "calculate"
    assert fn["description"] == "Evaluate an arithmetic expression."
    assert fn["parameters"] == {"type": "object",
                                "properties": {"expression": {"type": "string", "description": "e.g. '12 * 7'"}},
                                "required": ["expression"]}
    assert fn["return"] == {"type": "string"}
    assert _own_schema(calculate, None) == schema


def test_typed_function_schema_types_descriptions_and_required() -> None:
    own = _own_schema(search, None)["function"]
    assert own["description"] == "Search the notes.\n\nLonger explanation that stays in the description."
    assert own["parameters"]["properties"] == SEARCH_PROPERTIES
    # no default -> required, even when None is allowed (may be null, must be sent); a default -> optional
    assert own["parameters"]["required"] == ["query", "k", "score", "exact", "tags", "filters", "order", "page"]
    assert own["return"] == {"type": "array", "items": {"type": "string"}, "description": "the titles found"}


def test_own_schema_matches_transformers_where_both_answer() -> None:
    get_json_schema = pytest.importorskip("transformers.utils.chat_template_utils").get_json_schema
    for fn in (calculate, search):
        assert _own_schema(fn, None) == get_json_schema(fn), fn.__name__
        assert tool_schema(fn) == get_json_schema(fn)


def test_function_without_documented_arguments_gets_rlgen_own_schema() -> None:
    def add(a: int, b: int = 1) -> int:
        """Add two numbers."""
        return a + b

    schema = tool_schema(add)  # transformers refuses it (no Args: lines): rlgen's builder answers
    assert schema["function"]["description"] == "Add two numbers."
    assert schema["function"]["parameters"] == {"type": "object", "required": ["a"],
                                                "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}


def test_function_without_a_docstring_is_refused_saying_to_add_one() -> None:
    def add(a: int, b: int = 1) -> int:
        return a + b

    with pytest.raises(TypeError, match=r"tool 'add' has no docstring: its schema would have no description.*"
                                        r"add a docstring to .*add \(a first line"):
        tool_schema(add)
    with pytest.raises(TypeError, match="has no docstring"):
        tools_from({"plus": add})


def test_schema_errors_are_clear() -> None:
    with pytest.raises(TypeError, match=r"no name.*\{'name': fn\}"):
        tool_schema(lambda x: x)
    with pytest.raises(TypeError, match=r"no name"):
        tool_schema(functools.partial(calculate))

    def star(x: int, *rest: int) -> int:
        return x

    def kw(x: int, **more: Any) -> int:
        return x

    def untyped(x, y: int) -> int:  # type: ignore[no-untyped-def]
        return y

    def weird(x: object) -> int:
        return 0

    with pytest.raises(TypeError, match=r"\*rest"):
        tool_schema(star)
    with pytest.raises(TypeError, match=r"\*\*more"):
        tool_schema(kw)
    with pytest.raises(TypeError, match=r"parameter 'x' has no type hint"):
        tool_schema(untyped)
    with pytest.raises(TypeError, match=r"no JSON form"):
        tool_schema(weird)
    with pytest.raises(ValueError, match=r"letters, digits"):
        tool_schema(calculate, name="has space")


def test_tools_from_functions_tools_and_named_dicts() -> None:
    tool = tools_from(calculate)[0]
    assert tool == Tool("calculate", calculate, tool_schema(calculate))
    double: Any = lambda x: 2 * x
    double.__annotations__ = {"x": int}
    with pytest.raises(TypeError, match=r"tool 'double' has no docstring.*to the lambda \(its __doc__ = "):
        tools_from({"double": double})
    double.__doc__ = "Double a number."
    tools = tools_from([tool, {"double": double}, search])
    assert [t.name for t in tools] == ["calculate", "double", "search"]
    assert tools[1].schema["function"]["name"] == "double"
    with pytest.raises(ValueError, match=r"two tools are named 'calculate'"):
        tools_from([calculate, calculate])
    with pytest.raises(TypeError, match=r"functions, Tools or"):
        tools_from([calculate, 3])


# ---- calls and their statuses ----------------------------------------------------------------------------


def test_call_tool_ok_returns_text_for_the_next_message() -> None:
    result = call_tool(tools_from(calculate)[0], {"expression": "12 * 7"}, timeout=10)
    assert (result.status, result.text, result.ok) == ("ok", "84", True)

    def stats(xs: list[float]) -> dict:
        return {"mean": sum(xs) / len(xs), "name": "μ"}

    result = call_tool(stats, {"xs": [1, 2]})
    assert result.text == '{"mean": 1.5, "name": "μ"}' and result.value == {"mean": 1.5, "name": "μ"}


def test_call_tool_error_has_the_exception_and_traceback() -> None:
    result = call_tool(calculate, {"expression": "1 / 0"})
    assert result.status == "tool_error" and result.text is None
    assert result.error == "ZeroDivisionError: division by zero"
    assert result.traceback is not None and "ZeroDivisionError" in result.traceback


def test_call_tool_timeout_gives_up_without_waiting() -> None:
    def slow(seconds: float) -> str:
        time.sleep(seconds)
        return "done"

    t0 = time.monotonic()
    result = call_tool(slow, {"seconds": 3.0}, timeout=0.2)
    assert result.status == "tool_timeout" and time.monotonic() - t0 < 2.0
    assert result.error is not None and "cannot stop" in result.error


def test_call_tool_bad_arguments() -> None:
    for arguments in ({}, {"expression": "1", "extra": 2}, ["1"], None, {"expresion": "1"}):
        result = call_tool(calculate, arguments)
        assert result.status == "bad_arguments", arguments
        assert result.error and result.error.startswith("TypeError")


def test_call_tool_not_serialisable() -> None:
    def returns(kind: str) -> Any:
        return {"set": {1, 2}, "object": object(), "nan": math.nan}[kind]

    for kind in ("set", "object", "nan"):
        result = call_tool(returns, {"kind": kind})
        assert result.status == "not_serialisable" and result.text is None, kind
        assert result.value is not None


def test_async_tools_are_awaited_and_cancelled_at_the_timeout() -> None:
    async def lookup(key: str) -> str:
        await asyncio.sleep(0.01)
        return key.upper()

    async def hang(key: str) -> str:
        await asyncio.sleep(30)
        return key

    assert call_tool(lookup, {"key": "a"}).text == "A"
    assert call_tool(hang, {"key": "a"}, timeout=0.2).status == "tool_timeout"

    async def main() -> list[Any]:
        return [await acall_tool(lookup, {"key": "b"}), await acall_tool(hang, {"key": "b"}, timeout=0.1),
                await acall_tool(calculate, {"expression": "2 ** 10"}), await acall_tool(calculate, {"expression": "1/0"}),
                await acall_tool(calculate, {"x": 1})]

    results = asyncio.run(main())
    assert [r.status for r in results] == ["ok", "tool_timeout", "ok", "tool_error", "bad_arguments"]
    assert results[0].text == "B" and results[2].text == "1024"


# ---- hermes --------------------------------------------------------------------------------------------

CALC = '<tool_call>{"name": "calculate", "arguments": {"expression": "12 * 7"}}</tool_call>'


def test_hermes_one_call() -> None:
    turn = parse_hermes(CALC)
    assert turn == ParsedTurn("", (ToolCall("calculate", {"expression": "12 * 7"}, CALC),), None)


def test_hermes_two_calls_and_text_around_them() -> None:
    other = '<tool_call>\n{"name": "search", "arguments": {"query": "x", "k": 2}}\n</tool_call>'
    turn = parse_hermes(f"Let me compute.\n{CALC}\nand look up\n{other}\nDone.")
    assert [(c.name, c.arguments) for c in turn.calls] == [("calculate", {"expression": "12 * 7"}),
                                                           ("search", {"query": "x", "k": 2})]
    assert turn.calls[1].raw == other and turn.error is None
    assert turn.text_without_calls == "Let me compute.\n\nand look up\n\nDone."


def test_hermes_plain_text_has_no_calls() -> None:
    assert parse_hermes("  The answer is 84.\n") == ParsedTurn("The answer is 84.", (), None)


def test_hermes_malformed_json_is_an_error_not_an_exception() -> None:
    bad = '<tool_call>{"name": "calculate", "arguments": {"expression": "1+1"</tool_call>'
    turn = parse_hermes(f"{bad}\n{CALC}")
    assert turn.error is not None and turn.error.startswith("malformed tool call: bad JSON")
    assert [c.name for c in turn.calls] == ["calculate"] and turn.calls[0].raw == CALC  # the good one is kept


def test_hermes_missing_name_and_non_object_arguments() -> None:
    turn = parse_hermes('<tool_call>{"arguments": {"x": 1}}</tool_call>')
    assert turn.calls == () and turn.error is not None and "no name" in turn.error
    turn = parse_hermes('<tool_call>{"name": "f", "arguments": [1, 2]}</tool_call>')
    assert turn.calls == () and turn.error is not None and "not an object" in turn.error
    turn = parse_hermes('<tool_call>"just a string"</tool_call>')
    assert turn.calls == () and turn.error is not None


def test_hermes_reads_what_sglang_reads() -> None:
    # the end tag ends the block even inside an argument string (SGLang 0.5.17's regex, checked on the
    # H200): the call cannot be read; no end tag is needed when the model stopped at it
    inside = parse_hermes('<tool_call>{"name": "echo", "arguments": {"s": "a </tool_call> b"}}</tool_call>')
    assert inside.calls == () and inside.error is not None and "bad JSON" in inside.error
    stopped = parse_hermes('Sure. <tool_call>\n{"name": "calculate", "arguments": {"expression": "2"}}\n')
    assert (stopped.text_without_calls, len(stopped.calls), stopped.error) == ("Sure.", 1, None)
    # a list is several calls; "parameters" for "arguments"; arguments as a JSON string
    many = parse_hermes('<tool_call>[{"name": "a", "arguments": {}}, {"name": "b", "parameters": {"x": 1}}]</tool_call>')
    assert [(c.name, c.arguments) for c in many.calls] == [("a", {}), ("b", {"x": 1})]
    as_string = parse_hermes('<tool_call>{"name": "a", "arguments": "{\\"x\\": 1}"}</tool_call>')
    assert as_string.calls[0].arguments == {"x": 1}
    truncated = parse_hermes('<tool_call>{"name": "calculate", "argu')
    assert truncated.calls == () and truncated.error is not None


# ---- parsers you pass, and the server's answer ------------------------------------------------------------


def test_parse_tool_calls_with_a_parser_you_pass() -> None:
    assert parse_tool_calls(CALC).calls[0].name == "calculate"
    turn = parse_tool_calls("CALL add 1 2", lambda text: [("add", {"a": 1, "b": 2})])
    assert [(c.name, c.arguments) for c in turn.calls] == [("add", {"a": 1, "b": 2})]
    own = ParsedTurn("x", (), None)
    assert parse_tool_calls("x", lambda text: own) is own

    def broken(text: str) -> Any:
        raise ValueError("cannot read")

    turn = parse_tool_calls("x", broken)
    assert turn.calls == () and turn.error == "malformed tool call: the parser raised ValueError: cannot read"
    turn = parse_tool_calls("x", lambda text: [("add", 3)])
    assert turn.calls == () and turn.error is not None
    with pytest.raises(ValueError, match=r"parse_with_server"):
        parse_tool_calls("x", "llama3")


class _FakeServer:
    def __init__(self, answer: Any) -> None:
        self.answer, self.sent = answer, None

    async def post(self, path: str, body: Any = None, **kwargs: Any) -> Any:
        self.sent = (path, body)
        return self.answer


def test_parse_with_server_maps_sglang_answer() -> None:
    tools = tools_from([calculate, search])
    answer = {"normal_text": "Sure.", "calls": [
        {"tool_index": 0, "name": "calculate", "parameters": '{"expression": "12 * 7"}', "tool_call_id": None}]}
    server = _FakeServer(answer)
    turn = asyncio.run(parse_with_server(server, f"Sure. {CALC}", tools, "hermes"))
    assert turn == ParsedTurn("Sure.", (ToolCall("calculate", {"expression": "12 * 7"}, '{"expression": "12 * 7"}'),),
                              None)
    path, body = server.sent  # type: ignore[misc]
    assert path == "/parse_function_call" and body["tool_call_parser"] == "hermes" and body["text"] == f"Sure. {CALC}"
    assert body["tools"][0] == {"type": "function", "function": {k: tools[0].schema["function"][k]
                                                                 for k in ("name", "description", "parameters")}}
    # SGLang dropped what it could not read: no calls although the text had a marker
    dropped = asyncio.run(parse_with_server(_FakeServer({"normal_text": "Hm.", "calls": []}), "Hm. <tool_call>{",
                                            tools))
    assert dropped.calls == () and dropped.error is not None and dropped.error.startswith("malformed tool call")
    plain = asyncio.run(parse_with_server(_FakeServer({"normal_text": "84", "calls": []}), "84", tools))
    assert plain == ParsedTurn("84", (), None)
    bad = asyncio.run(parse_with_server(_FakeServer({"normal_text": "", "calls": [{"name": "f", "parameters": "{"}]}),
                                        "x", tools))
    assert bad.calls == () and bad.error is not None
    json.dumps(body)  # what is sent is plain JSON


@pytest.mark.skipif(sys.version_info < (3, 12), reason="eager tasks are Python 3.12+")
def test_an_async_call_that_never_waits_ends_before_the_event_loop_turns() -> None:
    # hundreds of episodes' steps each paid a turn of the loop (and a task's scheduling) for nothing
    from rlgen.episodes._tools import run_contained

    async def quick() -> int:
        return 5

    async def main() -> None:
        coro = run_contained(quick, timeout=1.0)
        with pytest.raises(StopIteration) as stop:
            coro.send(None)
        assert stop.value.value.value == 5

    asyncio.run(main())
