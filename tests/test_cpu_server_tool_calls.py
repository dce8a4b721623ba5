"""The CPU backend's `/parse_function_call` (rlgen.cpu_server._tool_parsers): SGLang's request and
answer shape and its hermes behaviour, in-process on the same cases as the client's `parse_hermes`, and
over HTTP on a real server (with `rlgen.episodes.parse_with_server` as the client); and the answers
recorded in tests/data/parse_function_call_cases.json (scripts/gpu/parse_parity.py), which the GPU
run compares with SGLang's."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from _cpu_server_process import post, running_server

from rlgen.cpu_server._tool_parsers import ToolParserError, parse_function_call
from rlgen.episodes import ParsedTurn, ToolCall, parse_hermes, parse_with_server, tools_from


def calculate(expression: str) -> str:
    """Evaluate an arithmetic expression.

    Args:
        expression: e.g. '12 * 7'
    """
    return expression


def search(query: str, k: int = 3) -> list[str]:
    """Search the notes.

    Args:
        query: what to look for
        k: how many results
    """
    return []


TOOLS = [t.schema for t in tools_from([calculate, search])]
CALC = '<tool_call>{"name": "calculate", "arguments": {"expression": "12 * 7"}}</tool_call>'
SEARCH = '<tool_call>\n{"name": "search", "arguments": {"query": "κόσμος", "k": 2}}\n</tool_call>'

BAD = '<tool_call>{"name": "calculate", "arguments": {"expression": "1+1"</tool_call>'

# (text, SGLang 0.5.17's hermes answer (normal_text, [(tool_index, name, parameters)]), as recorded
# on the H200, whether parse_hermes reports an error). The client keeps the text around calls and
# reports what it cannot read; SGLang keeps the text before the first call and drops the rest silently.
CASES: list[tuple[str, tuple[str, list[tuple[int, str, str]]], bool]] = [
    ("The answer is 84.", ("The answer is 84.", []), False),
    (CALC, ("", [(0, "calculate", '{"expression": "12 * 7"}')]), False),
    (f"Let me see.\n{CALC}\n{SEARCH}\nthen more", ("Let me see.", [(0, "calculate", '{"expression": "12 * 7"}'),
                                                                  (1, "search", '{"query": "κόσμος", "k": 2}')]), False),
    # one block SGLang 0.5.17 cannot decode loses every call of the turn: the text comes back whole
    (BAD + CALC, (BAD + CALC, []), True),
    (f"{CALC}\n" + '<tool_call>{"name": "calc', (f"{CALC}\n" + '<tool_call>{"name": "calc', []), True),
    ('<tool_call>{"arguments": {"expression": "1"}}</tool_call>', ("", []), True),
    # SGLang 0.5.17 ends a block at the first </tool_call>, even inside a JSON string: no call
    ('<tool_call>{"name": "echo", "arguments": {"s": "a </tool_call> b"}}</tool_call>',
     ('<tool_call>{"name": "echo", "arguments": {"s": "a </tool_call> b"}}</tool_call>', []), True),
    ('Sure. <tool_call>\n{"name": "calculate", "arguments": {"expression": "2"}}\n',
     ("Sure.", [(0, "calculate", '{"expression": "2"}')]), False),
    ('<tool_call>[{"name": "search", "parameters": {"query": "a"}}, {"name": "calculate", "arguments": {}}]</tool_call>',
     ("", [(1, "search", '{"query": "a"}'), (0, "calculate", "{}")]), False),
    ('x <tool_call>"not an object"</tool_call>', ('x <tool_call>"not an object"</tool_call>', []), True),
]


def _answer(normal: str, calls: list[tuple[int, str, str]]) -> dict[str, Any]:
    return {"normal_text": normal, "calls": [{"tool_index": i, "name": n, "parameters": p} for i, n, p in calls]}


@pytest.mark.parametrize(("text", "expected", "client_error"), CASES)
def test_server_and_client_hermes_on_the_same_cases(text: str, expected: tuple[str, list[Any]],
                                                    client_error: bool) -> None:
    answer = parse_function_call({"text": text, "tools": TOOLS, "tool_call_parser": "hermes"})
    assert answer == _answer(*expected)
    turn = parse_hermes(text)
    assert (turn.error is not None) == client_error, turn.error
    # the calls the server returns, the client reads too, in order, with the same arguments (SGLang
    # stops at the first block it cannot decode, the client reads on: it may have more)
    known = [(c.name, c.arguments) for c in turn.calls if c.name in ("calculate", "search")]
    served = [(c["name"], json.loads(c["parameters"])) for c in answer["calls"]]
    assert known[: len(served)] == served
    assert len(known) == len(served) or client_error


def test_server_parser_without_tools_or_markers_returns_the_text() -> None:
    assert parse_function_call({"text": CALC, "tool_call_parser": "hermes"}) == {"normal_text": CALC, "calls": []}
    assert parse_function_call({"text": " hi ", "tools": TOOLS, "tool_call_parser": "hermes"}) == \
        {"normal_text": " hi ", "calls": []}


def test_server_parser_refuses_what_it_lacks() -> None:
    for body in ({"text": CALC, "tools": TOOLS, "tool_call_parser": "qwen25"}, {"text": CALC, "tools": TOOLS},
                 {"tools": TOOLS, "tool_call_parser": "hermes"}, {"text": CALC, "tools": [1], "tool_call_parser": "hermes"},
                 [1]):
        with pytest.raises(ToolParserError):
            parse_function_call(body)


class _UrllibPoster:
    """parse_with_server's client: POST JSON, answer the decoded body (raises on a non-200)."""

    def __init__(self, url: str) -> None:
        self.url = url

    async def post(self, path: str, body: Any = None, **kwargs: Any) -> Any:
        def send() -> Any:
            request = urllib.request.Request(self.url + path, data=json.dumps(body).encode(), method="POST",
                                             headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(request, timeout=30) as response:
                return json.loads(response.read())

        return await asyncio.to_thread(send)


@pytest.mark.timeout(180)
def test_real_server_answers_parse_function_call(model_path: str) -> None:
    with running_server(model_path) as srv:
        text = f"Let me compute.\n{CALC}\n{SEARCH}"
        status, answer = post(srv.url + "/parse_function_call", {"text": text, "tools": TOOLS, "tool_call_parser": "hermes"})
        assert status == 200
        assert answer == {"normal_text": "Let me compute.", "calls": [
            {"tool_index": 0, "name": "calculate", "parameters": '{"expression": "12 * 7"}'},
            {"tool_index": 1, "name": "search", "parameters": '{"query": "κόσμος", "k": 2}'}]}

        status, answer = post(srv.url + "/parse_function_call", {"text": text, "tools": TOOLS, "tool_call_parser": "llama3"})
        assert status == 400 and "hermes" in answer["message"] and "llama3" in answer["message"]
        status, answer = post(srv.url + "/parse_function_call", b"{not json")
        assert status == 400

        turn = asyncio.run(parse_with_server(_UrllibPoster(srv.url), text, tools_from([calculate, search])))
        assert turn == ParsedTurn("Let me compute.", (
            ToolCall("calculate", {"expression": "12 * 7"}, '{"expression": "12 * 7"}'),
            ToolCall("search", {"query": "κόσμος", "k": 2}, '{"query": "κόσμος", "k": 2}')), None)
        # the server still generates after these requests
        status, out = post(srv.url + "/generate", {"text": "Hello", "sampling_params": {"max_new_tokens": 2}})
        assert status == 200 and out["meta_info"]["completion_tokens"] == 2


FIXTURE = Path(__file__).resolve().parent / "data" / "parse_function_call_cases.json"


def _fixture_cases() -> list[dict[str, Any]]:
    return list(json.loads(FIXTURE.read_text())["cases"])


@pytest.mark.parametrize("case", _fixture_cases(), ids=lambda c: c["name"])
def test_the_cpu_backend_answers_each_case_as_sglang_0_5_17_did_on_the_gpu(case: dict[str, Any]) -> None:
    # `sglang_answer`: SGLang's own /parse_function_call answer (--tool-call-parser hermes), recorded
    # on the H200 (docs/gpu/2026-12-02i/episodes/parse_parity.json).
    fixture = json.loads(FIXTURE.read_text())
    body = {"text": case["text"], "tools": fixture["tools"] if case["tools"] else [],
            "tool_call_parser": fixture["parser"]}
    assert parse_function_call(body) == case["sglang_answer"]


def test_the_fixture_holds_every_case_of_the_parity_script() -> None:
    spec = importlib.util.spec_from_file_location("parse_parity", FIXTURE.parents[2] / "scripts/gpu/parse_parity.py")
    assert spec is not None and spec.loader is not None
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    fixture = json.loads(FIXTURE.read_text())
    assert [(c["name"], c["text"], c["tools"]) for c in fixture["cases"]] == script.CASES, \
        "the cases changed: run `python scripts/gpu/parse_parity.py record`"
    assert fixture["tools"] == script.TOOLS and fixture["parser"] == script.PARSER
    assert len(fixture["cases"]) >= 30
