"""Tool-call parsing parity: SGLang's `/parse_function_call` (`--tool-call-parser hermes`) against the
CPU backend's answers to the same model-like turns.

Owns the fixed set of cases (`CASES`: valid calls, several calls, text around calls, stopped at the
stop string, malformed JSON, unknown tools, no call, no tools) and the fixture
tests/data/parse_function_call_cases.json (the cases, the tools, the CPU backend's answers):

    python scripts/gpu/parse_parity.py record                 # CPU machine: start the CPU backend,
                                                              # post every case, write the fixture
    python scripts/gpu/parse_parity.py compare --url URL --out parse_parity.json
                                                              # GPU machine: post the fixture's cases
                                                              # to SGLang, diff against its answers

The request is SGLang 0.5.17's (python/sglang/srt/entrypoints/http_server.py
`parse_function_call_request`, `ParseFunctionCallReq` in managers/io_struct.py):
`POST /parse_function_call {"text", "tools": [{"type": "function", "function": {"name",
"description", "parameters"}}], "tool_call_parser": "hermes"}`, answered `{"normal_text", "calls":
[{"tool_index", "name", "parameters"}]}` (`ToolCallItem.model_dump()`). The comparison drops keys
whose value is None (newer SGLang adds `"tool_call_id": null`), then calls a case "same" when the
answers are equal, "same calls" when only normal_text differs, "same arguments" when the calls'
parameters differ only as JSON text, else "different"; HTTP failures are "http <status>".
Knows nothing of rlgen's client-side parser (tests/test_cpu_server_tool_calls.py compares that).
"""

from __future__ import annotations

import argparse
import http.client
import json
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

REPO = Path(__file__).resolve().parents[2]
FIXTURE = REPO / "tests" / "data" / "parse_function_call_cases.json"
PARSER = "hermes"

TOOLS: list[dict[str, Any]] = [
    {"type": "function", "function": {
        "name": "calculate", "description": "Evaluate an arithmetic expression.",
        "parameters": {"type": "object", "properties": {"expression": {"type": "string", "description": "e.g. '12 * 7'"}},
                       "required": ["expression"]}}},
    {"type": "function", "function": {
        "name": "search", "description": "Search the notes.",
        "parameters": {"type": "object", "properties": {"query": {"type": "string", "description": "what to look for"},
                                                        "k": {"type": "integer", "description": "how many results"}},
                       "required": ["query"]}}},
]


def _call(name: str, args: Any, key: str = "arguments") -> str:
    return "<tool_call>" + json.dumps({"name": name, key: args}, ensure_ascii=False) + "</tool_call>"


CALC = _call("calculate", {"expression": "12 * 7"})
SEARCH = _call("search", {"query": "owls", "k": 2})

# (name, text, tools offered?) -- model-like assistant turns
CASES: list[tuple[str, str, bool]] = [
    ("no call", "The answer is 84.", True),
    ("no call, empty", "", True),
    ("no call, whitespace", "  \n ", True),
    ("one call", CALC, True),
    ("one call, newlines inside the tags", '<tool_call>\n{"name": "calculate", "arguments": {"expression": "3 + 4"}}\n</tool_call>', True),
    ("one call, text before", f"Let me compute that.\n{CALC}", True),
    ("one call, text before and after", f"Let me compute that. {CALC} I will wait for the result.", True),
    ("one call, stopped at </tool_call> (no closing tag)", '<tool_call>{"name": "calculate", "arguments": {"expression": "9 * 9"}}', True),
    ("one call, no closing tag, trailing space", 'Sure. <tool_call>\n{"name": "calculate", "arguments": {"expression": "2"}}\n', True),
    ("two calls", CALC + SEARCH, True),
    ("two calls, text between", f"First {CALC} then {SEARCH} done.", True),
    ("three calls", CALC + "\n" + SEARCH + "\n" + _call("calculate", {"expression": "1/3"}), True),
    ("list of calls in one block", '<tool_call>[{"name": "search", "arguments": {"query": "a"}}, '
                                   '{"name": "calculate", "arguments": {"expression": "5-1"}}]</tool_call>', True),
    ("parameters instead of arguments", _call("search", {"query": "bees"}, key="parameters"), True),
    ("arguments as a JSON string", _call("calculate", '{"expression": "6 * 7"}'), True),
    ("empty arguments", _call("calculate", {}), True),
    ("arguments null", _call("calculate", None), True),
    ("no arguments key", '<tool_call>{"name": "calculate"}</tool_call>', True),
    ("nested arguments", _call("search", {"query": "x", "filters": {"year": 2020, "tags": ["a", "b"]}}), True),
    ("unicode arguments", _call("search", {"query": "κόσμος 世界", "k": 1}), True),
    ("</tool_call> inside a string", '<tool_call>{"name": "search", "arguments": {"query": "a </tool_call> b"}}</tool_call>', True),
    ("unknown tool", _call("weather", {"city": "Paris"}), True),
    ("unknown tool, then a known one", _call("weather", {"city": "Paris"}) + CALC, True),
    ("malformed JSON: missing brace", '<tool_call>{"name": "calculate", "arguments": {"expression": "1+1"</tool_call>', True),
    ("malformed JSON, then a valid call", '<tool_call>{"name": "calculate", "arguments": {"expression": "1+1"</tool_call>' + CALC, True),
    ("valid call, then truncated JSON", CALC + '\n<tool_call>{"name": "calc', True),
    ("malformed JSON: single quotes", "<tool_call>{'name': 'calculate', 'arguments': {'expression': '2*3'}}</tool_call>", True),
    ("malformed JSON: trailing comma", '<tool_call>{"name": "calculate", "arguments": {"expression": "2*3",}}</tool_call>', True),
    ("not an object: a string", 'x <tool_call>"calculate 2*3"</tool_call>', True),
    ("not an object: a number", "<tool_call>42</tool_call>", True),
    ("no name", '<tool_call>{"arguments": {"expression": "1"}}</tool_call>', True),
    ("name not a string", '<tool_call>{"name": 7, "arguments": {}}</tool_call>', True),
    ("empty block", "<tool_call></tool_call>", True),
    ("upper-case tag (not a call)", '<TOOL_CALL>{"name": "calculate", "arguments": {"expression": "1"}}</TOOL_CALL>', True),
    ("JSON in a code fence, no tags", '```json\n{"name": "calculate", "arguments": {"expression": "1"}}\n```', True),
    ("one call, no tools offered", CALC, False),
]


def post(url: str, path: str, body: Any, *, timeout: float = 30.0) -> tuple[int, Any]:
    """POST JSON with plain http.client (no proxy between us and a loopback server); (status, decoded body)."""
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port, timeout=timeout)
    try:
        conn.request("POST", path, body=json.dumps(body), headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        raw = resp.read()
    finally:
        conn.close()
    try:
        return resp.status, json.loads(raw)
    except ValueError:
        return resp.status, raw.decode("utf-8", "replace")[:500]


def request_body(text: str, with_tools: bool, tools: list[dict[str, Any]], parser: str = PARSER) -> dict[str, Any]:
    return {"text": text, "tools": tools if with_tools else [], "tool_call_parser": parser}


def _clean(answer: Any) -> Any:
    """The answer without None-valued keys in its calls (SGLang versions differ in `tool_call_id`)."""
    if not isinstance(answer, dict) or not isinstance(answer.get("calls"), list):
        return answer
    calls = [{k: v for k, v in c.items() if v is not None} if isinstance(c, dict) else c for c in answer["calls"]]
    return {**answer, "calls": calls}


def _decoded_calls(answer: dict[str, Any]) -> list[Any]:
    out = []
    for c in answer.get("calls") or []:
        try:
            params = json.loads(c.get("parameters")) if isinstance(c.get("parameters"), str) else c.get("parameters")
        except ValueError:
            params = c.get("parameters")
        out.append((c.get("tool_index"), c.get("name"), params))
    return out


def classify(expected: Any, status: int, got: Any) -> str:
    """How SGLang's answer compares with the CPU backend's (see the module docstring)."""
    if status != 200:
        return f"http {status}"
    a, b = _clean(expected), _clean(got)
    if a == b:
        return "same"
    if not isinstance(b, dict) or not isinstance(a, dict):
        return "different"
    calls_equal = a.get("calls") == b.get("calls")
    if calls_equal:
        return "same calls"  # normal_text differs
    if _decoded_calls(a) == _decoded_calls(b):
        return "same arguments" if a.get("normal_text") == b.get("normal_text") else "same arguments, other text"
    return "different"


def record(args: argparse.Namespace) -> int:
    """Post every case to the CPU backend (at --url, else one started here) and write the fixture."""
    eng = None
    url = args.url
    if url is None:
        import rlgen

        eng = rlgen.Engine(backend="cpu", progress=False)
        url = eng.url
    try:
        cases = []
        for name, text, with_tools in CASES:
            status, answer = post(url, "/parse_function_call", request_body(text, with_tools, TOOLS))
            if status != 200:
                print(f"the CPU backend answered {status} to {name!r}: {answer}", file=sys.stderr)
                return 1
            cases.append({"name": name, "text": text, "tools": with_tools, "cpu_answer": answer})
    finally:
        if eng is not None:
            eng.close()
    names = [c["name"] for c in cases]
    if len(set(names)) != len(names):
        print("case names must be unique", file=sys.stderr)
        return 1
    fixture = {
        "about": "Model-like assistant turns posted to POST /parse_function_call with tool_call_parser "
                 "'hermes', and the CPU backend's answers (rlgen/cpu_server/_tool_parsers.py). Written by "
                 "`python scripts/gpu/parse_parity.py record`; tests/test_cpu_server_tool_calls.py checks the CPU "
                 "backend still answers so; scripts/gpu/episodes.sh parse compares SGLang's answers with these.",
        "parser": PARSER,
        "tools": TOOLS,
        "recorded_at": time.strftime("%Y-%m-%d"),
        "cases": cases,
    }
    Path(args.fixture).write_text(json.dumps(fixture, indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {len(cases)} cases to {args.fixture}")
    return 0


def compare(args: argparse.Namespace) -> int:
    """Post the fixture's cases to the server at --url; write every answer and a diff summary."""
    fixture = json.loads(Path(args.fixture).read_text())
    rows = []
    for case in fixture["cases"]:
        body = request_body(case["text"], case["tools"], fixture["tools"], fixture["parser"])
        t0 = time.perf_counter()
        try:
            status, answer = post(args.url, "/parse_function_call", body)
        except OSError as err:
            status, answer = 0, f"{type(err).__name__}: {err}"
        verdict = classify(case["cpu_answer"], status, answer)
        rows.append({"name": case["name"], "verdict": verdict, "status": status, "ms": 1e3 * (time.perf_counter() - t0),
                     "server_answer": answer, "cpu_answer": case["cpu_answer"], "text": case["text"]})
    # a parser the CPU backend lacks: it answers 400; SGLang raises ValueError (a 500, or its own 400)
    unknown = post(args.url, "/parse_function_call", request_body(CALC, True, fixture["tools"], "no-such-parser"))
    counts: dict[str, int] = {}
    for r in rows:
        counts[r["verdict"]] = counts.get(r["verdict"], 0) + 1
    summary = {"url": args.url, "cases": len(rows), "verdicts": counts,
               "all_same": counts.get("same", 0) == len(rows),
               "differences": [{k: r[k] for k in ("name", "verdict", "status", "text", "cpu_answer", "server_answer")}
                               for r in rows if r["verdict"] != "same"],
               "unknown_parser": {"status": unknown[0], "answer": unknown[1]},
               "rows": rows}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(summary, indent=1, ensure_ascii=False))
    width = max(len(r["name"]) for r in rows)
    for r in rows:
        print(f"  {r['name']:{width}s}  {r['verdict']}")
    print(f"\n{len(rows)} cases: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    for d in summary["differences"]:
        print(f"\nDIFF {d['name']} ({d['verdict']}): text {d['text']!r}\n  cpu    {json.dumps(d['cpu_answer'], ensure_ascii=False)}"
              f"\n  server {json.dumps(d['server_answer'], ensure_ascii=False)}")
    print(f"\nunknown parser name: HTTP {unknown[0]} {str(unknown[1])[:200]}")
    print(f"wrote {args.out}")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("mode", choices=("record", "compare"))
    ap.add_argument("--url", default=None, help="the server (compare: required; record: default a CPU backend started here)")
    ap.add_argument("--fixture", default=str(FIXTURE))
    ap.add_argument("--out", default="parse_parity.json", help="compare: where to write the answers and the diff")
    args = ap.parse_args()
    if args.mode == "compare":
        if not args.url:
            ap.error("compare needs --url")
        return compare(args)
    return record(args)


if __name__ == "__main__":
    sys.exit(main())
