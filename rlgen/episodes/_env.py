"""Environments of multi-turn episodes: what a user writes, normalised, called contained, validated.

Owns: turning what the user passes as `env=` into one object the episode runner drives
(`as_environment`), and the contained call of each of its steps with a per-episode status:

- a function `env(messages, data)` (or `env(messages)`), sync or `async def`, returning the next
  message(s): a str (one user message), a message dict (`{"role": "user" | "tool" | "system",
  "content": str, ...}`), a list of them, or None / "done" to end the episode;
- a class with `reset(data) -> None | messages` and `step(messages) -> same as the function`: one
  instance per episode, made with no arguments; or a factory (a callable taking no arguments)
  returning such an instance. The messages `reset` returns are appended to the prompt's chat before
  the first turn;
- `tool_env(tools, parser="hermes")`: the built-in tool environment. When the assistant's last turn
  has tool calls it runs them (`acall_tool`) and answers with one tool message per call
  (`{"role": "tool", "name": ..., "content": result text}`); a turn without a tool call ends the
  episode ("done"); a malformed call ends it with "bad_tool_call"; a failing tool ends it with the
  tool's status ("tool_error", "tool_timeout", "bad_arguments", "not_serialisable"), or, with
  `on_tool_error="reply"`, answers the model with the error text and goes on (the env turn's `calls` keep the
  failed call's traceback).

What is wrong with `env=` itself is refused by `as_environment` before anything runs (TypeError /
ValueError): an instance where each episode needs its own, an async generator function (it would
yield, never return, the step's messages), a class with no `step`, an empty tool list, a tool
without a docstring (`tool_schema`), a timeout that is not a positive number of seconds or
None (`core._options.check_seconds`, add_rewards' rule; `tool_env(timeout=)` too).

Every step is an `EnvReply`: the new messages, whether the episode is done, and a failure status
that ends the episode (the others go on): "env_error" (the environment raised; `traceback` kept),
"env_timeout" (a step outlived `timeout`; a sync step's thread cannot be stopped and is left to
finish on its own, an `async def` step is cancelled; neither is waited for), "bad_env_return" (it
returned something other than the above: the error says what came back and what is expected). A
step runs as `_tools.run_contained` runs a tool: a sync one in a daemon thread of its own, so hung
steps never hold back the next ones; SystemExit is an "env_error" too. Making a class's or a
factory's instance is contained the same way.

Knows nothing about servers, HTTP, token ids, chat templates, sampling, rollouts or the Engine: it
takes messages and data and returns messages and statuses.
"""

from __future__ import annotations

import copy
import enum
import inspect
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from ..core._options import check_seconds
from ._tool_calls import ParsedTurn, ToolCall, ToolCallParser, outside_think, parse_tool_calls, parse_with_server
from ._tools import Ran, Tool, ToolResult, acall_tool, run_contained, tools_from, within

__all__ = ["ENV_ROLES", "ENV_TIMEOUT", "EnvReply", "Environment", "EpisodeEnv", "Timeout", "ToolEnv", "as_environment",
           "failure_reply", "own_timeout", "tool_env"]

ENV_ROLES = ("user", "tool", "system")


class _CallTimeout(enum.Enum):
    ENV_TIMEOUT = "env_timeout"

    def __repr__(self) -> str:
        return "ENV_TIMEOUT"


# The default of `tool_env(timeout=)` and of the framework adapters' `timeout=`: the call's
# `env_timeout` (`as_environment` gives it; 30 s where no call does). A value given instead wins.
ENV_TIMEOUT = _CallTimeout.ENV_TIMEOUT
Timeout = float | None | Literal[_CallTimeout.ENV_TIMEOUT]


def own_timeout(name: str, value: Timeout, default: float | None = 30.0) -> tuple[float | None, bool]:
    """A `timeout=` that defaults to the call's `env_timeout`, checked: (seconds, whether given).
    Not given (`ENV_TIMEOUT`), the seconds are `default` until a call's `env_timeout` replaces them
    (`Environment.retime`, `ToolEnv.with_timeout`); given, they stay.

    Raises:
        ValueError: not a positive number of seconds or None (`check_seconds`, named `name`).
    """
    if value is ENV_TIMEOUT:
        return default, False
    return check_seconds(name, value), True
_EXPECTED = ('a str (one user message), a message dict {"role": "user" | "tool" | "system", "content": str}, '
             'a list of such dicts, or None / "done" to end the episode')


@dataclass
class EnvReply:
    """What one environment step gave.

    Attributes:
        messages: the new messages (validated dicts), empty when the episode ends.
        done: the environment ended the episode (None or "done", or no tool call for `tool_env`).
        status: None, or the failure status that ends the episode: "env_error", "env_timeout",
            "bad_env_return", "bad_tool_call", or a tool's status.
        error: what went wrong ("ExcType: message" or a sentence), else None.
        traceback: the traceback text of an exception, else None.
        seconds: the step's wall time.
        tool_calls / tool_calls_failed: the calls `tool_env` ran in this step, and those not "ok".
        calls: per call `{"name", "arguments", "status", "error", "result"}` (tool_env and the tool
            adapters), and a failed call's `"traceback"` (None for a status without one: a timeout,
            bad arguments), kept also where `on_tool_error="reply"` lets the episode go on.
        reward: the step's reward, when the environment gives one per step (SkyRL's `step`, a verl
            tool's `execute`): the env turn's `reward`, summed in the episodes' `step_rewards`.
        info: what else the environment said about the step (SkyRL's metadata, a tool's metrics,
            calls found inside reasoning blocks): the env turn's `info`.
        prompt: from `reset` only: the chat that replaces the prompt's (a framework whose reset
            rewrites the prompt: SkyRL's `init`, TRL's text appended to the last user message).
    """

    messages: list[dict[str, Any]] = field(default_factory=list)
    done: bool = False
    status: str | None = None
    error: str | None = None
    traceback: str | None = None
    seconds: float = 0.0
    tool_calls: int = 0
    tool_calls_failed: int = 0
    calls: list[dict[str, Any]] = field(default_factory=list)
    reward: float | None = None
    info: dict[str, Any] = field(default_factory=dict)
    prompt: list[dict[str, Any]] | None = None

    @property
    def ends(self) -> bool:
        return self.done or self.status is not None


def _describe(value: Any) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text[:120] + '...' if len(text) > 120 else text}"


def normalise_return(value: Any, *, what: str = "the environment") -> EnvReply:
    """An environment's return value as an `EnvReply` (a "bad_env_return" one when it is not one of
    the accepted forms, saying what came back and what is expected)."""
    if value is None or (isinstance(value, str) and value == "done"):
        return EnvReply(done=True)
    if isinstance(value, str):
        return EnvReply([{"role": "user", "content": value}])
    items = [value] if isinstance(value, Mapping) else value if isinstance(value, (list, tuple)) else None
    if items is None:
        return EnvReply(status="bad_env_return", error=f"{what} returned {_describe(value)}; expected {_EXPECTED}")
    if not items:
        return EnvReply(status="bad_env_return",
                        error=f"{what} returned an empty list; expected {_EXPECTED} (return \"done\" to end)")
    messages: list[dict[str, Any]] = []
    for i, item in enumerate(items):
        where = f"{what} returned, at item {i}," if len(items) > 1 or not isinstance(value, Mapping) else f"{what} returned"
        if not isinstance(item, Mapping):
            return EnvReply(status="bad_env_return", error=f"{where} {_describe(item)}; expected {_EXPECTED}")
        role, content = item.get("role"), item.get("content")
        if "role" not in item:
            return EnvReply(status="bad_env_return",
                            error=f"{where} {_describe(item)}, a dict without a 'role'; expected {_EXPECTED}")
        if role not in ENV_ROLES:
            return EnvReply(status="bad_env_return",
                            error=f"{where} a message with role {role!r}; an environment's message has role "
                                  f"'user', 'tool' or 'system' (the model writes the 'assistant' turns); "
                                  f"expected {_EXPECTED}")
        if not isinstance(content, str):
            return EnvReply(status="bad_env_return",
                            error=f"{where} a {role!r} message whose content is {_describe(content)}; "
                                  f"expected a str: {_EXPECTED}")
        messages.append(dict(item))
    return EnvReply(messages)


def failure_reply(ran: Ran, *, timed_out: str, note: str = "") -> EnvReply | None:
    """A contained call's failure as the episode's reply: "env_timeout" ("TimeoutError: " and
    `timed_out`, the sentence saying what did not finish), "env_error" (the exception's text and
    `note`, with the traceback); None when the call returned."""
    if ran.timed_out:
        return EnvReply(status="env_timeout", seconds=ran.seconds, error=f"TimeoutError: {timed_out}")
    if ran.error is not None:
        return EnvReply(status="env_error", error=f"{ran.error_text}{note}", traceback=ran.traceback,
                        seconds=ran.seconds)
    return None


async def call_contained(fn: Callable[..., Any], args: Sequence[Any], timeout: float | None, what: str) -> EnvReply:
    """Call `fn(*args)` (sync in a daemon thread of its own, `async def` as a task; `run_contained`)
    and normalise what it returns; an exception is "env_error" (with the traceback), outliving
    `timeout` is "env_timeout" (the call is then given up, not waited for)."""
    ran = await run_contained(fn, args, timeout=timeout)
    failed = failure_reply(ran, timed_out=f"{what} did not finish {within(timeout)} (env_timeout=)")
    if failed is not None:
        return failed
    reply = normalise_return(ran.value, what=what)
    reply.seconds = ran.seconds
    return reply


class EpisodeEnv:
    """One episode's environment: `reset(data)` before the first turn, `step(messages)` after each,
    `close()` once the episode has ended (on every way out but a cancellation).

    `obj` is the framework's own environment object behind this one, if any (a TRL environment
    instance, a verifiers rollout's state): the episode keeps it, and reward functions that take
    `environments` get it (TRL's convention). `tool_schemas`, when not None, are this episode's
    tools for its first prompt (a framework that routes each row to its own environment), in place
    of the call's `Environment.tools`."""

    obj: Any = None
    tool_schemas: list[dict[str, Any]] | None = None

    async def reset(self, data: Any, prompt: Sequence[Mapping[str, Any]] | None = None) -> EnvReply:
        """Before the first turn: `data` is the prompt's data, `prompt` its chat (a framework's
        reset may rewrite it: `EnvReply.prompt`)."""
        return EnvReply()

    async def close(self) -> EnvReply:
        """Free what the episode held (a sandbox, a connection); a failure is an `EnvReply` status."""
        return EnvReply()

    async def step(self, messages: list[dict[str, Any]]) -> EnvReply:  # pragma: no cover - abstract
        raise NotImplementedError


class _FunctionEpisode(EpisodeEnv):
    def __init__(self, fn: Callable[..., Any], with_data: bool, timeout: float | None) -> None:
        self.fn, self.with_data, self.timeout, self.data = fn, with_data, timeout, None
        self.what = f"env function {_name(fn)}"  # named once, not at every step

    async def reset(self, data: Any, prompt: Sequence[Mapping[str, Any]] | None = None) -> EnvReply:
        self.data = data
        return EnvReply()

    async def step(self, messages: list[dict[str, Any]]) -> EnvReply:
        args = (messages, self.data) if self.with_data else (messages,)
        return await call_contained(self.fn, args, self.timeout, self.what)


class _ObjectEpisode(EpisodeEnv):
    def __init__(self, obj: Any, timeout: float | None) -> None:
        self.obj, self.timeout = obj, timeout

    async def reset(self, data: Any, prompt: Sequence[Mapping[str, Any]] | None = None) -> EnvReply:
        reset = getattr(self.obj, "reset", None)
        if reset is None:
            return EnvReply()
        reply = await call_contained(reset, (data,), self.timeout, f"{type(self.obj).__name__}.reset")
        if reply.done and reply.status is None:  # None: nothing to add before the first turn
            return EnvReply(seconds=reply.seconds)
        return reply

    async def step(self, messages: list[dict[str, Any]]) -> EnvReply:
        return await call_contained(self.obj.step, (messages,), self.timeout, f"{type(self.obj).__name__}.step")


class ToolEnv(EpisodeEnv):
    """The built-in tool environment (`tool_env`): stateless, shared by every episode.

    A step reads the assistant's last turn for calls (outside its `<think>` blocks: a call written
    inside one is not run, and the env turn's `info["calls_in_think"]` counts the calls markers
    found there), runs each call (`run_call`) and answers with one message per call
    (`tool_message`). A malformed call is kept as data: the env turn's `calls` gets
    `{"name": None, "status": "bad_tool_call", "parser": ..., "error": ...}` (the error quotes the
    text that could not be read), and the episode ends "bad_tool_call". Subclasses (the framework
    adapters of `rlgen.envs`) change how a call runs and how its answer is worded.

    Attributes:
        tools: the Tools, by name in `by_name`.
        schemas: their function-calling schemas (given to the chat template).
        timeout / timeout_given: seconds per call, and whether `timeout=` gave them (else they
            are the call's `env_timeout`, `with_timeout`).
    """

    def __init__(self, tools: Any, *, parser: str | ToolCallParser = "hermes", timeout: Timeout = ENV_TIMEOUT,
                 on_tool_error: str = "end") -> None:
        if on_tool_error not in ("end", "reply"):
            raise ValueError(f"on_tool_error must be 'end' or 'reply', got {on_tool_error!r}")
        seconds, self.timeout_given = own_timeout("tool_env(timeout=)", timeout)
        if isinstance(parser, str) and parser != "hermes" and not parser.startswith("server"):
            raise ValueError(f"unknown tool-call parser {parser!r}: the built-in one is 'hermes', the server's is "
                             "'server' or 'server:<name>' (an SGLang --tool-call-parser name), or pass a function")
        self.tools: list[Tool] = tools_from(tools)
        self.by_name = {t.name: t for t in self.tools}
        self.schemas = [t.schema for t in self.tools]
        self.parser, self.timeout, self.on_tool_error = parser, seconds, on_tool_error
        # "server[:name]": the server's own parser through /parse_function_call (hermes by default),
        # posted with the client the runner binds (`bind_client`).
        self.server_parser: str | None = None
        if isinstance(parser, str) and parser.startswith("server"):
            name = parser.partition(":")[2] or "hermes"
            if parser not in ("server", f"server:{name}"):
                raise ValueError(f"unknown tool-call parser {parser!r}: write 'server' or 'server:<name>'")
            self.server_parser = name
        self._client: Any = None

    def with_timeout(self, timeout: float | None) -> ToolEnv:
        """This tool environment with the call's `env_timeout` per tool call, when its own
        `timeout=` was not given (else itself: the value given wins)."""
        if self.timeout_given:
            return self
        other = copy.copy(self)
        other.timeout, other.timeout_given = timeout, True
        return other

    def bind_client(self, client: Any) -> None:
        """The client that posts to the server (the runner binds its own), for a "server" parser."""
        self._client = client

    @property
    def parser_name(self) -> str:
        """The parser's name as a call record keeps it: "hermes", "server:<name>" or the function's."""
        if self.server_parser is not None:
            return f"server:{self.server_parser}"
        return self.parser if isinstance(self.parser, str) else _name(self.parser)

    def __repr__(self) -> str:
        return f"tool_env([{', '.join(self.by_name)}], on_tool_error={self.on_tool_error!r})"

    async def parse(self, said: str) -> ParsedTurn | EnvReply:
        """The calls of a turn's text outside its reasoning blocks (an `EnvReply` when there is no
        server to ask)."""
        if self.server_parser is None:
            return parse_tool_calls(said, self.parser)
        if self._client is None:
            return EnvReply(status="env_error", error="tool_env(parser='server'): no server to ask; run it through "
                                                      "Engine.episodes (or bind_client(client))")
        return await parse_with_server(self._client, said, self.tools, parser=self.server_parser)

    async def run_call(self, call: ToolCall) -> ToolResult:
        """Run one call (its tool is among `by_name`): contained, with the timeout."""
        return await acall_tool(self.by_name[call.name], call.arguments, timeout=self.timeout)

    def tool_message(self, call: ToolCall, text: str) -> dict[str, Any]:
        """The message that answers a call: `{"role": "tool", "name": ..., "content": text}`."""
        return {"role": "tool", "name": call.name, "content": text}

    def error_text(self, call: ToolCall, result: ToolResult) -> str:
        """What the model reads for a failed call under `on_tool_error="reply"`."""
        return f"Error: {result.error}"

    def step_reward(self, results: Sequence[ToolResult]) -> float | None:
        """The step's reward from its calls' results (None: tools give no reward)."""
        return None

    async def step(self, messages: list[dict[str, Any]]) -> EnvReply:
        t0 = time.perf_counter()
        last = messages[-1] if messages else {}
        if last.get("role") != "assistant":
            return EnvReply(status="env_error", error="tool_env: the last message is not the assistant's turn")
        said, thought = outside_think(str(last.get("content") or ""))
        parsed = await self.parse(said)
        if isinstance(parsed, EnvReply):
            return parsed
        info = {"calls_in_think": thought.count("<tool_call>")} if "<tool_call>" in thought else {}
        if parsed.error is not None:
            return EnvReply(status="bad_tool_call", error=parsed.error, seconds=time.perf_counter() - t0, info=info,
                            tool_calls=1, tool_calls_failed=1,
                            calls=[{"name": None, "arguments": None, "status": "bad_tool_call", "error": parsed.error,
                                    "parser": self.parser_name}])
        if not parsed.calls:
            return EnvReply(done=True, seconds=time.perf_counter() - t0, info=info)
        reply = EnvReply(info=info)
        results: list[ToolResult] = []
        for call in parsed.calls:
            if call.name not in self.by_name:
                reply.status, reply.messages = "bad_tool_call", []
                reply.error = (f"malformed tool call: no tool is named {call.name!r} "
                               f"(the tools: {', '.join(self.by_name) or 'none'})")
                reply.tool_calls, reply.tool_calls_failed = reply.tool_calls + 1, reply.tool_calls_failed + 1
                reply.calls.append({"name": call.name, "arguments": call.arguments, "status": "bad_tool_call",
                                    "error": "unknown tool", "parser": self.parser_name})
                break
            result = await self.run_call(call)
            results.append(result)
            reply.tool_calls += 1
            reply.calls.append({"name": call.name, "arguments": call.arguments, "status": result.status,
                                "error": result.error, "result": result.text if result.ok else None})
            if not result.ok:
                reply.calls[-1]["traceback"] = result.traceback  # kept under "reply" too, where the episode goes on
                reply.tool_calls_failed += 1
                if self.on_tool_error == "end":
                    reply.status, reply.error, reply.traceback = result.status, \
                        f"tool {call.name!r}: {result.error}", result.traceback
                    reply.messages = []
                    break
            reply.messages.append(self.tool_message(call, result.text or "" if result.ok
                                                    else self.error_text(call, result)))
        reply.reward = self.step_reward(results)
        reply.seconds = time.perf_counter() - t0
        return reply


def tool_env(tools: Any, *, parser: str | ToolCallParser = "hermes", timeout: Timeout = ENV_TIMEOUT,
             on_tool_error: str = "end") -> ToolEnv:
    """The built-in tool environment: runs the tool calls of the assistant's last turn.

    Args:
        tools: functions, Tools or `{name: function}` dicts (as `tools_from`); at least one, each
            with a docstring (the description its schema gives the model).
        parser: "hermes" (`<tool_call>{...}</tool_call>`, read here), "server" / "server:<name>" (the
            server's own parser, SGLang's `--tool-call-parser` names, through `/parse_function_call`;
            hermes by default; the CPU backend knows hermes), or a function text -> ParsedTurn |
            [(name, args)].
        timeout: seconds per tool call ("tool_timeout" after); a positive number, or None (no limit).
            Default: the call's `env_timeout` (30 s unless the call gives another); given here, it
            wins over `env_timeout`.
        on_tool_error: "end" (the episode ends with the tool's status) or "reply" (the error text is
            the tool message, and the episode goes on).

    Raises:
        ValueError: no tools (an environment without tools is a function env(messages, data), or
            a class with step); a bad option. TypeError: a tool `tools_from` refuses.
    """
    env = ToolEnv(tools, parser=parser, timeout=timeout, on_tool_error=on_tool_error)
    if not env.tools:
        raise ValueError(f"tool_env has no tools: pass at least one tool function (got {_describe(tools)}); an "
                         "environment without tools is a function env(messages, data) or a class with step(messages)")
    return env


def _name(fn: Any) -> str:
    return getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or type(fn).__name__


def _positional(fn: Callable[..., Any]) -> tuple[int, int, bool] | None:
    """(required positional, all positional, *args) parameters of `fn`, or None without a signature."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return None
    pos = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    var = any(p.kind is p.VAR_POSITIONAL for p in params)
    return sum(p.default is p.empty for p in pos), len(pos), var


@dataclass
class Environment:
    """The user's `env=` normalised: `tools` (schemas for the chat template, or None) and
    `new()`, one `EpisodeEnv` per episode (construction contained: an `EnvReply` failure instead).

    Two hooks serve environments written for other frameworks (`rlgen.envs`):
    `reward_funcs`, the framework's own rewards, scored once every episode has ended
    (`Engine.episodes` adds them with `add_rewards`, in threads: they may read the episodes'
    `environments`); and `loop`, for a framework whose environment owns its loop (verifiers'
    `rollout` is final): the runner then hands the whole call to it (`LoopCall`), and it fills the
    records as `Episode` would.

    `retime`, set by an adapter whose own `timeout=` was not given: the same environment with
    another timeout, which `as_environment` calls with the call's `env_timeout`."""

    make: Callable[[], Any]
    kind: str                                  # "function", "class", "factory", "tools", "framework"
    tools: list[dict[str, Any]] | None
    timeout: float | None
    reward_funcs: Mapping[str, Callable[..., Any]] | None = None
    loop: Callable[[Any], Awaitable[None]] | None = None
    retime: Callable[[float | None], Environment] | None = None

    async def new(self) -> EpisodeEnv | EnvReply:
        if self.kind in ("function", "tools"):
            return self.make()  # type: ignore[no-any-return]
        # a class, a factory or a framework's environment may take a while (a dataset, a sandbox):
        # contained like a step, off the loop
        ran = await run_contained(self.make, timeout=self.timeout)
        failed = failure_reply(ran, note=" (making the episode's environment)",
                               timed_out=f"making the episode's environment ({_name(self.make)}) did not finish "
                                         f"{within(self.timeout)} (env_timeout=)")
        if failed is not None:
            return failed
        obj = ran.value
        if isinstance(obj, EpisodeEnv):
            return obj
        if not callable(getattr(obj, "step", None)):
            return EnvReply(status="bad_env_return",
                            error=f"the env factory {_name(self.make)} returned {_describe(obj)}; expected an "
                                  "object with a step(messages) method (and optionally reset(data))")
        return _ObjectEpisode(obj, self.timeout)


def _refuse_async_generator(fn: Any, what: str) -> None:
    """An `async def` with `yield` gives an async generator, never the step's messages: refused
    before anything runs (called, it would end every episode with "bad_env_return")."""
    if fn is not None and (inspect.isasyncgenfunction(fn) or inspect.isasyncgenfunction(type(fn).__call__)):
        raise TypeError(f"{what} is an async generator function (async def with yield): an environment's step "
                        "returns its messages; write `return ...` instead of `yield ...`")


def as_environment(env: Any, *, timeout: float | None = 30.0) -> Environment:
    """Normalise `env=`: a function (messages[, data]), a class with reset/step, a factory of such
    objects (a callable taking no arguments), a `tool_env(...)`, or a list / dict of tool functions
    (made into `tool_env(env)`); an `Environment` already made is returned as it is.

    `timeout` (the call's `env_timeout`) bounds each step, and each tool call of a tool list; it
    also reaches a `tool_env(...)` and a framework adapter's environment (`rlgen.envs`) made
    without a `timeout=` of their own (`ToolEnv.with_timeout`, `Environment.retime`); one they
    were given wins.

    Raises:
        TypeError: `env` is none of these (e.g. an instance with step(): pass its class or a factory,
            since each episode needs its own; an async generator function).
        ValueError: `timeout` is not a positive number of seconds or None.
    """
    timeout = check_seconds("env_timeout", timeout)
    if isinstance(env, Environment):
        return env if env.retime is None else env.retime(timeout)
    if isinstance(env, (ToolEnv, list, tuple, Mapping, Tool)):
        built = env.with_timeout(timeout) if isinstance(env, ToolEnv) else tool_env(env, timeout=timeout)
        return Environment(lambda: built, "tools", built.schemas, timeout)
    if inspect.isclass(env):
        if not callable(getattr(env, "step", None)):
            raise TypeError(f"env class {env.__name__} has no step(messages) method; an environment class needs "
                            "step(messages) (and optionally reset(data)): add it, or check its spelling. (A TRL "
                            "environment_factory class is told by a reset(**kwargs) that takes the row's prompt.)")
        for method in ("reset", "step"):
            _refuse_async_generator(getattr(env, method, None), f"{env.__name__}.{method}")
        return Environment(env, "class", None, timeout)
    if not callable(env):
        if callable(getattr(env, "step", None)):
            raise TypeError(f"env is an instance of {type(env).__name__}; every episode needs its own "
                            f"environment: pass the class ({type(env).__name__}) or a factory (lambda: ...)")
        raise TypeError(f"env must be a function env(messages, data), a class with reset/step, a factory, or "
                        f"tool_env(tools); got {_describe(env)}")
    _refuse_async_generator(env, f"env function {_name(env)}")
    shape = _positional(env)
    if shape is not None and shape[0] == 0 and shape[1] == 0 and not shape[2]:
        return Environment(env, "factory", None, timeout)
    with_data = shape is None or shape[2] or shape[1] >= 2
    if shape is not None and shape[0] > 2:
        raise TypeError(f"env function {_name(env)} takes {shape[0]} required arguments; it gets (messages, data)")
    return Environment(lambda: _FunctionEpisode(env, bool(with_data), timeout), "function", None, timeout)
