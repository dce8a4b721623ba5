"""Tools for multi-turn episodes: plain Python functions, their JSON schemas, and contained calls.

Owns: `Tool` (a name, a function, its function-calling schema), `tool_schema(fn)` (the OpenAI / Hugging
Face function-calling schema derived from the signature and docstring), `tools_from(...)` (functions,
Tools or `{name: function}` dicts to a list of Tools, with clear errors), and `call_tool` /
`acall_tool`, which call one tool on a model's arguments and report what happened as a `ToolResult`
(ok with the text for the next message, or a status: "tool_error", "tool_timeout", "bad_arguments",
"not_serialisable"). Knows nothing about servers, HTTP, parsing a model's text into calls
(`_tool_calls`), tokenizers, rollouts or the Engine: it takes functions and argument dicts and returns
schemas and results.

The schema, and the choice between two builders: `transformers.utils.get_json_schema` is what
`tokenizer.apply_chat_template(tools=[fn])` uses, so when transformers is installed and accepts the
function, its schema is the one used (a chat template then renders `Tool.schema` exactly as it renders
the function itself). It refuses a function without a docstring or without a description for every
argument; rlgen's own builder (below) then gives the same format from what there is. Both follow
the same rules, and the tests compare them on functions both accept:

- name: the function's `__name__` (a lambda or a `functools.partial` has none: pass `{"name": fn}`);
- description: the docstring's text before its `Args:` / `Returns:` / `Raises:` sections;
- parameters: one property per parameter; `Args:` lines (Google style, `name: text` or
  `name (type): text`, continuation lines joined) give the property's description;
- types: int -> "integer", float -> "number", str -> "string", bool -> "boolean", list[X] -> "array"
  with items X, tuple[X, Y] -> "array" with prefixItems, dict[str, X] -> "object" (with
  additionalProperties X), Literal[...] -> "enum", Any -> {} (any value), X | None (or Optional[X])
  -> X with "nullable": true, X | Y -> "type": [X, Y];
- required: the parameters without a default (so `x: int | None = None` is optional and
  `x: int | None` is required but may be null, as in transformers);
- "return": the return annotation's schema, when there is one (transformers adds it too).

A parameter without a type hint is an error (TypeError naming it), as in transformers: guessing
"string" would tell the model to send text to a function that may want a number. `*args` and
`**kwargs` are errors too: the model calls tools with named arguments only.

Calls run contained, as reward functions do in `rlgen.rewards`' thread mode (`run_calls(mode="thread")`,
reused here): exceptions become "tool_error" with the traceback, a call that outlives `timeout` becomes
"tool_timeout". **A timed-out call cannot be killed**: Python cannot stop a thread, so the call goes on
in its daemon thread until it returns on its own (an `async def` tool is cancelled instead, which stops
it at its next await). The episode ends with that status; the stray thread is not waited for.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import re
import time
import types
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints

from ..rewards._exec import Call, run_calls

__all__ = ["Tool", "ToolResult", "ToolStatus", "acall_tool", "call_tool", "tool_schema", "tools_from"]

ToolStatus = Literal["ok", "tool_error", "tool_timeout", "bad_arguments", "not_serialisable"]

# OpenAI's rule for function names; SGLang's parsers match names literally.
_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_SECTIONS = re.compile(r"^\s*(Args|Arguments|Parameters|Returns|Return|Raises|Yields|Examples?|Notes?):\s*$",
                       re.IGNORECASE | re.MULTILINE)
_ARG_LINE = re.compile(r"^(\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)$")


@dataclass(frozen=True)
class Tool:
    """A function the model may call: its name (what the model writes), the function, and its
    function-calling schema (`{"type": "function", "function": {"name", "description", "parameters"}}`),
    the form chat templates and SGLang's `/parse_function_call` take."""

    name: str
    function: Callable[..., Any]
    schema: dict[str, Any]


@dataclass(frozen=True)
class ToolResult:
    """What one tool call did.

    Attributes:
        status: "ok"; "tool_error" (the tool raised); "tool_timeout" (it outlived the timeout; a
            thread cannot be stopped, so a sync tool may still be running); "bad_arguments" (the
            arguments do not bind to the signature: missing, unknown or not a dict);
            "not_serialisable" (it returned a value `json.dumps` refuses: NaN, a set, an object).
        text: the tool's answer as the text of the next message when ok (a str return as is, any
            other value as JSON), else None.
        value: the value the tool returned (also for "not_serialisable"), else None.
        error: "ExcType: message" when not ok, else None.
        traceback: the traceback text for "tool_error", else None.
        seconds: the call's wall time (until it was given up, for a timeout).
    """

    status: ToolStatus
    text: str | None = None
    value: Any = None
    error: str | None = None
    traceback: str | None = None
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.status == "ok"


# ---------------------------------------------------------------------------------------------
# Schemas


def tool_schema(fn: Callable[..., Any], *, name: str | None = None) -> dict[str, Any]:
    """The function-calling schema of `fn` (see the module docstring for the rules and for which
    builder answers: transformers' `get_json_schema` when it accepts `fn`, else rlgen's own).

    Args:
        fn: a function (or `async def` function) with a type hint on every parameter.
        name: the name the model calls it by (default: `fn.__name__`).

    Raises:
        TypeError: `fn` is not callable, has no name (a lambda, a partial) and none was given,
            takes *args or **kwargs, has a parameter without a type hint or a hint with no JSON
            form; ValueError: the name is not 1-64 letters, digits, "_" or "-".
    """
    own = _own_schema(fn, name)  # checks everything, whichever builder answers
    theirs = _transformers_schema(fn)
    if theirs is None:
        return own
    theirs["function"]["name"] = own["function"]["name"]
    return theirs


def _transformers_schema(fn: Callable[..., Any]) -> dict[str, Any] | None:
    try:
        from transformers.utils.chat_template_utils import get_json_schema
    except Exception:  # not installed, or broken: rlgen's own builder answers
        return None
    try:
        schema = get_json_schema(fn)
    except Exception:  # no docstring, an undocumented argument, a hint it does not know
        return None
    return schema if isinstance(schema, dict) and isinstance(schema.get("function"), dict) else None


def _tool_name(fn: Callable[..., Any], name: str | None) -> str:
    if not callable(fn):
        raise TypeError(f"a tool must be a function, got {type(fn).__name__}")
    if name is None:
        name = getattr(fn, "__name__", None)
        if not isinstance(name, str) or name == "<lambda>":
            raise TypeError(f"{fn!r} has no name the model could call it by (a lambda or a partial): "
                            "pass it as {'name': fn}")
    if not isinstance(name, str) or not _NAME.match(name):
        raise ValueError(f"tool name {name!r} must be 1-64 letters, digits, '_' or '-'")
    return name


def _own_schema(fn: Callable[..., Any], name: str | None) -> dict[str, Any]:
    tool_name = _tool_name(fn, name)
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError) as e:
        raise TypeError(f"tool {tool_name!r}: cannot read its signature ({e})") from None
    try:
        hints = get_type_hints(fn)
    except Exception as e:
        raise TypeError(f"tool {tool_name!r}: cannot resolve its type hints ({type(e).__name__}: {e})") from None
    description, arg_docs, returns_doc = _parse_docstring(inspect.getdoc(fn) or "")
    properties: dict[str, Any] = {}
    required: list[str] = []
    for param in signature.parameters.values():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            star = "*" if param.kind == param.VAR_POSITIONAL else "**"
            raise TypeError(f"tool {tool_name!r} takes {star}{param.name}: a tool's parameters must be named "
                            "one by one (the model passes named arguments only)")
        if param.kind == param.POSITIONAL_ONLY:
            raise TypeError(f"tool {tool_name!r}: parameter {param.name!r} is positional-only; the model passes "
                            "named arguments only")
        if param.name not in hints:
            raise TypeError(f"tool {tool_name!r}: parameter {param.name!r} has no type hint; give it one "
                            "(e.g. `{0}: str`) so its schema says what the model must send".format(param.name))
        prop = _hint_schema(hints[param.name], f"tool {tool_name!r}, parameter {param.name!r}")
        if param.name in arg_docs:
            prop["description"] = arg_docs[param.name]
        properties[param.name] = prop
        if param.default is param.empty:
            required.append(param.name)
    function: dict[str, Any] = {"name": tool_name, "description": description,
                                "parameters": {"type": "object", "properties": properties, "required": required}}
    if "return" in hints and hints["return"] is not type(None):
        try:
            function["return"] = _hint_schema(hints["return"], "return")
        except TypeError:
            pass  # a return type without a JSON form says nothing the model needs
        else:
            if returns_doc:
                function["return"]["description"] = returns_doc
    return {"type": "function", "function": function}


_SIMPLE: dict[Any, str] = {int: "integer", float: "number", str: "string", bool: "boolean", type(None): "null",
                           list: "array", tuple: "array", dict: "object"}


def _hint_schema(hint: Any, where: str) -> dict[str, Any]:
    """The JSON schema of one type hint (transformers' forms); TypeError for a hint without one."""
    if hint is Any:
        return {}
    if hint in _SIMPLE:
        return {"type": _SIMPLE[hint]}
    origin, args = get_origin(hint), get_args(hint)
    if origin is Union or origin is types.UnionType:
        nullable = type(None) in args
        subs = [_hint_schema(a, where) for a in args if a is not type(None)]
        if len(subs) == 1:
            out = subs[0]
        elif all(set(s) == {"type"} for s in subs):
            out = {"type": [s["type"] for s in subs]}
        else:
            out = {"anyOf": subs}
        if nullable:
            out["nullable"] = True
        return out
    if origin is Literal:
        kinds = {_SIMPLE.get(type(v)) for v in args}
        out = {"type": kinds.pop()} if len(kinds) == 1 and None not in kinds else {}
        out["enum"] = list(args)
        return out
    if origin in (list, Sequence, Iterable) or (isinstance(origin, type) and issubclass(origin, (list, set, frozenset))):
        return {"type": "array", "items": _hint_schema(args[0], where)} if args else {"type": "array"}
    if origin is tuple:
        if not args or (len(args) == 2 and args[1] is Ellipsis):
            return {"type": "array", **({"items": _hint_schema(args[0], where)} if args else {})}
        return {"type": "array", "prefixItems": [_hint_schema(a, where) for a in args]}
    if origin in (dict, Mapping):
        out = {"type": "object"}
        if len(args) == 2:
            out["additionalProperties"] = _hint_schema(args[1], where)
        return out
    raise TypeError(f"{where}: the type hint {hint!r} has no JSON form; use int, float, str, bool, list[...], "
                    "dict[str, ...], Literal[...], Any, or a union of those")


def _parse_docstring(doc: str) -> tuple[str, dict[str, str], str]:
    """(description, {argument: description}, returns description) of a Google-style docstring."""
    headers = list(_SECTIONS.finditer(doc))
    description = (doc[: headers[0].start()] if headers else doc).strip()
    args: dict[str, str] = {}
    returns = ""
    for i, header in enumerate(headers):
        body = doc[header.end(): headers[i + 1].start() if i + 1 < len(headers) else len(doc)]
        kind = header.group(1).lower()
        if kind in ("args", "arguments", "parameters"):
            args = _parse_args_block(body)
        elif kind in ("returns", "return"):
            returns = " ".join(line.strip() for line in body.strip().splitlines())
    return description, args, returns


def _parse_args_block(body: str) -> dict[str, str]:
    lines = [line for line in body.splitlines() if line.strip()]
    if not lines:
        return {}
    indent = min(len(line) - len(line.lstrip()) for line in lines)
    out: dict[str, str] = {}
    current: str | None = None
    for line in lines:
        depth = len(line) - len(line.lstrip())
        match = _ARG_LINE.match(line.strip())
        if depth == indent and match:
            current = match.group(1)
            out[current] = match.group(2).strip()
        elif current is not None:
            out[current] = f"{out[current]} {line.strip()}".strip()
    return out


# ---------------------------------------------------------------------------------------------
# Lists of tools


def tools_from(funcs: Any) -> list[Tool]:
    """Tools from functions, Tools, `{name: function}` dicts, or a list mixing them.

    A dict's key is the name the model calls the function by (the way to name a lambda or a partial).
    Names must be unique.

    Raises:
        TypeError / ValueError: as `tool_schema`, or a duplicate name, or something that is not a
            function, a Tool or a dict of them.
    """
    items: list[Any] = [funcs] if callable(funcs) or isinstance(funcs, (Tool, Mapping)) else list(funcs)
    tools: list[Tool] = []
    for item in items:
        if isinstance(item, Tool):
            tools.append(item)
        elif isinstance(item, Mapping):
            for key, fn in item.items():
                tools.append(fn if isinstance(fn, Tool) and fn.name == key else
                             Tool(key, fn, tool_schema(fn.function if isinstance(fn, Tool) else fn, name=key)))
        elif callable(item):
            schema = tool_schema(item)
            tools.append(Tool(schema["function"]["name"], item, schema))
        else:
            raise TypeError(f"tools must be functions, Tools or {{name: function}} dicts, got {type(item).__name__}")
    seen: set[str] = set()
    for tool in tools:
        if tool.name in seen:
            raise ValueError(f"two tools are named {tool.name!r}; name them apart with {{'other_name': fn}}")
        seen.add(tool.name)
    return tools


# ---------------------------------------------------------------------------------------------
# Calls


def call_tool(tool: Tool | Callable[..., Any], arguments: Any, *, timeout: float | None = 30.0) -> ToolResult:
    """Call `tool` with the model's `arguments` (a dict of named arguments), contained.

    The call runs in a daemon thread (`rlgen.rewards`' `run_calls(mode="thread")`); an `async def`
    tool is awaited on rlgen's background loop (so do not call this from that loop: use
    `await acall_tool(...)` there). A call that outlives `timeout` seconds is given up as
    "tool_timeout" but not stopped (see the module docstring). Never raises for what the tool
    does; Ctrl-C still stops the wait (KeyboardInterrupt).
    """
    fn, bad = _bind(tool, arguments)
    if bad is not None:
        return bad
    outcome = run_calls(fn, [Call(kwargs=dict(arguments))], mode="thread", timeout=timeout, workers=1)[0]
    if outcome.status == "ok":
        return _serialised(outcome.value, outcome.seconds)
    if outcome.status == "timeout":
        return ToolResult("tool_timeout", error=outcome.error, seconds=outcome.seconds)
    return ToolResult("tool_error", error=outcome.error, traceback=outcome.traceback, seconds=outcome.seconds)


async def acall_tool(tool: Tool | Callable[..., Any], arguments: Any, *, timeout: float | None = 30.0) -> ToolResult:
    """`call_tool` for code that runs on an event loop: an `async def` tool is awaited here (and
    cancelled at the timeout), a plain one runs in a worker thread (given up, not stopped, at the
    timeout). The same statuses as `call_tool`."""
    import traceback as tb

    fn, bad = _bind(tool, arguments)
    if bad is not None:
        return bad
    t0 = time.perf_counter()
    if inspect.iscoroutinefunction(fn):
        pending: Any = fn(**arguments)
    else:
        pending = asyncio.get_running_loop().run_in_executor(None, lambda: fn(**arguments))
    try:
        value = await asyncio.wait_for(pending, timeout)
        if inspect.isawaitable(value):  # a plain function that returned a coroutine
            value = await asyncio.wait_for(value, timeout)
    except asyncio.TimeoutError:
        how = "the coroutine was cancelled" if inspect.iscoroutinefunction(fn) else \
            "a thread cannot be stopped: the call goes on until it returns"
        return ToolResult("tool_timeout", error=f"TimeoutError: did not finish within {timeout:g} s; {how}",
                          seconds=time.perf_counter() - t0)
    except Exception as e:
        return ToolResult("tool_error", error=f"{type(e).__name__}: {e}", traceback="".join(tb.format_exception(e)),
                          seconds=time.perf_counter() - t0)
    return _serialised(value, time.perf_counter() - t0)


def _bind(tool: Tool | Callable[..., Any], arguments: Any) -> tuple[Callable[..., Any], ToolResult | None]:
    """The function to call, and a "bad_arguments" result when `arguments` do not bind to it."""
    fn = tool.function if isinstance(tool, Tool) else tool
    if not isinstance(arguments, Mapping) or not all(isinstance(k, str) for k in arguments):
        return fn, ToolResult("bad_arguments", error=f"TypeError: arguments must be an object of named arguments, "
                                                     f"got {type(arguments).__name__}")
    try:
        inspect.signature(fn).bind(**arguments)
    except TypeError as e:
        return fn, ToolResult("bad_arguments", error=f"TypeError: {e}")
    except ValueError:  # no signature to check against: let the call tell
        pass
    return fn, None


def _serialised(value: Any, seconds: float) -> ToolResult:
    if isinstance(value, str):
        return ToolResult("ok", text=value, value=value, seconds=seconds)
    try:
        text = json.dumps(value, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as e:
        return ToolResult("not_serialisable", value=value, error=f"{type(e).__name__}: {e}", seconds=seconds)
    return ToolResult("ok", text=text, value=value, seconds=seconds)
