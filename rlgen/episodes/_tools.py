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
the function itself). It refuses a function without a description for every argument; rlgen's own
builder (below) then gives the same format from what there is. A function without a docstring is
refused by both (TypeError saying to add one): its schema would have no description, and the model
would not be told what the tool does. Both follow the same rules, and the tests compare them on
functions both accept:

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

Calls run contained: `call_tool` as reward functions do in `rlgen.rewards`' thread mode
(`run_calls(mode="thread")`, reused here), `acall_tool` through `run_contained`, which this module
owns for the environment's steps too (`_env`): a plain function runs in a daemon thread that no
other call holds (`_workers`: an idle worker, or a new one; never asyncio's default executor,
whose few threads a hung call would hold: the next calls queued behind it and timed out without
having started, and `asyncio.run()` and interpreter exit joined it), an `async def` one as a task
of its own (started at once on Python 3.12+: a call that does not wait ends before the next).
Exceptions become "tool_error" with the
traceback (SystemExit and KeyboardInterrupt too: out of a task they would stop the event loop that
runs every episode), a call that outlives `timeout` becomes "tool_timeout". **A timed-out call
cannot be killed**: Python cannot stop a thread, so the call goes on in its daemon thread until it
returns on its own (an `async def` tool is cancelled instead, which stops it at its next await; one
that ignores the cancellation is left running). Either way nothing waits for it past the timeout:
the episode ends with that status, and the stray call no longer counts against `MAX_THREADS`.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import re
import sys
import time
import types
import weakref
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints

from ..core._loop import is_async
from ..rewards._exec import Call, run_calls
from ._workers import run_in_worker

__all__ = ["MAX_THREADS", "Ran", "Tool", "ToolResult", "ToolStatus", "acall_tool", "call_tool", "run_contained",
           "tool_schema", "tools_from", "within"]

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
            has no docstring, takes *args or **kwargs, has a parameter without a type hint or a
            hint with no JSON form; ValueError: the name is not 1-64 letters, digits, "_" or "-".
    """
    own = _own_schema(fn, name)  # checks everything, whichever builder answers
    if not own["function"]["description"]:
        tool = own["function"]["name"]
        where = f"to {getattr(fn, '__qualname__', tool)}" if getattr(fn, "__name__", None) != "<lambda>" else \
            "to the lambda (its __doc__ = '...')"
        raise TypeError(f"tool {tool!r} has no docstring: its schema would have no description, so the model would "
                        f"not be told what it does; add a docstring {where} (a first line saying what it does, then "
                        "an 'Args:' line per parameter)")
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
    cancelled at the timeout), a plain one runs in a daemon thread of its own (given up, not stopped,
    at the timeout); see `run_contained`. The same statuses as `call_tool`."""
    fn, bad = _bind(tool, arguments)
    if bad is not None:
        return bad
    ran = await run_contained(fn, kwargs=dict(arguments), timeout=timeout)
    if ran.timed_out:
        how = "a thread cannot be stopped: the call goes on until it returns" if ran.in_thread else \
            "the coroutine was cancelled"
        return ToolResult("tool_timeout", error=f"TimeoutError: did not finish {within(timeout)}; {how}",
                          seconds=ran.seconds)
    if ran.error is not None:
        return ToolResult("tool_error", error=ran.error_text, traceback=ran.traceback, seconds=ran.seconds)
    return _serialised(ran.value, ran.seconds)


def _bind(tool: Tool | Callable[..., Any], arguments: Any) -> tuple[Callable[..., Any], ToolResult | None]:
    """The function to call, and a "bad_arguments" result when `arguments` do not bind to it."""
    fn = tool.function if isinstance(tool, Tool) else tool
    if not isinstance(arguments, Mapping) or not all(isinstance(k, str) for k in arguments):
        return fn, ToolResult("bad_arguments", error=f"TypeError: arguments must be an object of named arguments, "
                                                     f"got {type(arguments).__name__}")
    try:
        signature = inspect.signature(fn)
    except ValueError:  # no signature to check against: let the call tell
        return fn, None
    params = signature.parameters.values()
    if not any(p.kind is p.VAR_KEYWORD for p in params):  # an invented name first: bind() would name a missing one
        named = [p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
        unexpected = [k for k in arguments if k not in named]
        if unexpected:
            return fn, ToolResult("bad_arguments", error=f"TypeError: got an unexpected keyword argument "
                                                         f"{unexpected[0]!r} (it takes {', '.join(map(repr, named)) or 'none'})")
    try:
        signature.bind(**arguments)
    except TypeError as e:
        return fn, ToolResult("bad_arguments", error=f"TypeError: {e}")
    return fn, None


def _serialised(value: Any, seconds: float) -> ToolResult:
    if isinstance(value, str):
        return ToolResult("ok", text=value, value=value, seconds=seconds)
    try:
        text = json.dumps(value, ensure_ascii=False, allow_nan=False)
    except Exception as e:  # TypeError, ValueError (NaN, a cycle), RecursionError (too deep), a broken __iter__
        return ToolResult("not_serialisable", value=value, error=f"{type(e).__name__}: {e}", seconds=seconds)
    return ToolResult("ok", text=text, value=value, seconds=seconds)


# ---------------------------------------------------------------------------------------------
# Contained calls on an event loop (tools here, the environment's steps in `_env`)


def within(timeout: float | None) -> str:
    """A timeout as every message of a contained call words it: "within 2 s", or "with no time
    limit" for None (such a call never times out; a sentence made before the call's outcome is
    known must still take None: the episodes' `env_timeout=None`)."""
    return "with no time limit" if timeout is None else f"within {timeout:g} s"


# Plain functions running at once per event loop, each in a daemon thread of its own; more wait for
# a slot (before their timeout starts). A call given up at its timeout frees its slot though its
# thread goes on, so hung calls never hold back the next ones.
MAX_THREADS = 256

_SLOTS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore] = weakref.WeakKeyDictionary()


@dataclass(frozen=True)
class Ran:
    """What `run_contained` saw: the value, or the exception raised (any but a cancellation of the
    caller: SystemExit too), or `timed_out`; the call's wall time; whether it ran in a thread."""

    value: Any = None
    error: BaseException | None = None
    timed_out: bool = False
    seconds: float = 0.0
    in_thread: bool = False

    @property
    def error_text(self) -> str | None:
        if self.error is None:
            return None
        said = str(self.error)
        if not said and isinstance(self.error, KeyboardInterrupt):  # the call's own, never Ctrl-C on rlgen's call
            said = "raised inside the call, with no message (contained: it ended this call's episode only)"
        return f"{type(self.error).__name__}: {said or 'raised with no message'}"

    @property
    def traceback(self) -> str | None:
        """The traceback from the user's code down: rlgen's own frames above it (the thread or
        task that ran the call) are left out."""
        import os
        import traceback as tb

        if self.error is None:
            return None
        frames, package = self.error.__traceback__, os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        while frames is not None and frames.tb_next is not None and \
                os.path.abspath(frames.tb_frame.f_code.co_filename).startswith(package + os.sep):
            frames = frames.tb_next
        return "".join(tb.format_exception(type(self.error), self.error, frames))


class _Raised(Exception):
    """A SystemExit or KeyboardInterrupt raised by user code, carried as an Exception: out of a task
    (or a future's result awaited in one), asyncio re-raises those two out of the event loop."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(error)
        self.error = error


class _TimedOut(Exception):
    pass


async def run_contained(fn: Callable[..., Any], args: Sequence[Any] = (), kwargs: Mapping[str, Any] | None = None, *,
                        timeout: float | None) -> Ran:
    """Call `fn(*args, **kwargs)` from a task on the running loop, contained: an `async def`
    function (or an object whose `__call__` is one) as a task of its own, a plain one in a daemon
    thread that runs nothing else meanwhile (a reused worker, `_workers`; at most `MAX_THREADS` at
    once per loop); a coroutine a plain function returns is awaited too, within the same `timeout`. Never raises for what `fn` does, and never
    waits for it past `timeout`: a task is then cancelled, a thread left to finish on its own (see
    the module docstring). Cancelling the caller gives the call up the same way."""
    kw = dict(kwargs or {})
    loop = asyncio.get_running_loop()
    if is_async(fn):
        t0 = time.perf_counter()
        try:
            value = await _within(_started(loop, _carried(lambda: fn(*args, **kw))), timeout)
        except _TimedOut:
            return Ran(timed_out=True, seconds=time.perf_counter() - t0)
        except _Raised as e:
            return Ran(error=e.error, seconds=time.perf_counter() - t0)
        except Exception as e:
            return Ran(error=e, seconds=time.perf_counter() - t0)
        return Ran(value, seconds=time.perf_counter() - t0)
    slots = _SLOTS.get(loop)
    if slots is None:
        slots = _SLOTS[loop] = asyncio.Semaphore(MAX_THREADS)
    async with slots:
        t0 = time.perf_counter()
        try:
            value = await _within(_in_thread(loop, fn, args, kw), timeout)
            if inspect.isawaitable(value):  # a plain function that returned a coroutine
                left = None if timeout is None else max(0.0, timeout - (time.perf_counter() - t0))
                coroutine = value
                value = await _within(_started(loop, _carried(lambda: coroutine)), left)
        except _TimedOut:
            return Ran(timed_out=True, seconds=time.perf_counter() - t0, in_thread=True)
        except _Raised as e:
            return Ran(error=e.error, seconds=time.perf_counter() - t0, in_thread=True)
        except Exception as e:
            return Ran(error=e, seconds=time.perf_counter() - t0, in_thread=True)
        return Ran(value, seconds=time.perf_counter() - t0, in_thread=True)


def _started(loop: asyncio.AbstractEventLoop, coroutine: Coroutine[Any, Any, Any]) -> asyncio.Future[Any]:
    """A task of `coroutine`, started at once where Python can (3.12+, `eager_start`): a call that
    does not wait for anything (most environment steps) is then finished before this returns,
    without a turn of the event loop for each of hundreds of episodes."""
    if sys.version_info >= (3, 12):
        return asyncio.Task(coroutine, loop=loop, eager_start=True)  # type: ignore[call-arg,unused-ignore]
    return loop.create_task(coroutine)


async def _carried(make: Callable[[], Awaitable[Any]]) -> Any:
    """Await what `make()` gives, SystemExit and KeyboardInterrupt carried as `_Raised`."""
    try:
        return await make()
    except (SystemExit, KeyboardInterrupt) as e:
        raise _Raised(e) from None


def _in_thread(loop: asyncio.AbstractEventLoop, fn: Callable[..., Any], args: Sequence[Any],
               kwargs: Mapping[str, Any]) -> asyncio.Future[Any]:
    """A future of `fn(*args, **kwargs)` run on a daemon worker thread (`_workers`: an idle one or a
    new one, never one busy with another call); a future given up (cancelled) before the call
    ends ignores what it brings."""
    future: asyncio.Future[Any] = loop.create_future()

    def settle(value: Any, error: BaseException | None) -> None:
        if future.done():
            return
        if error is None:
            future.set_result(value)
        else:
            future.set_exception(error)

    def work() -> None:
        value, error = None, None
        try:
            value = fn(*args, **kwargs)
        except BaseException as e:  # everything, SystemExit included: reported, not raised here
            error = e if isinstance(e, Exception) else _Raised(e)
        try:
            loop.call_soon_threadsafe(settle, value, error)
        except RuntimeError:  # the loop is closed: nobody waits for this call any more
            pass

    run_in_worker(work)
    return future


async def _within(future: asyncio.Future[Any], timeout: float | None) -> Any:
    """`future`'s result, or `_TimedOut` after `timeout` seconds; either way (and when the caller
    is cancelled) `future` is cancelled but not waited for."""
    if future.done():  # it finished as it started (`_started`)
        return _outcome(future)
    try:
        done, _ = await asyncio.wait({future}, timeout=timeout)
    except asyncio.CancelledError:
        future.cancel()
        future.add_done_callback(_forget)
        raise
    if not done:
        future.cancel()
        future.add_done_callback(_forget)
        raise _TimedOut
    return _outcome(future)


def _outcome(future: asyncio.Future[Any]) -> Any:
    """A finished call's value, or what it raised."""
    if future.cancelled():  # the call's own CancelledError (this caller was not cancelled): its failure
        raise _Raised(asyncio.CancelledError("the call raised CancelledError (it was not cancelled by rlgen)"))
    return future.result()


def _forget(future: asyncio.Future[Any]) -> None:
    """Read a given-up future's outcome, so that asyncio does not log "exception never retrieved"."""
    if not future.cancelled():
        future.exception()
