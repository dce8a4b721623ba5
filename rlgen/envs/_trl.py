"""TRL's environment classes (`GRPOTrainer(environment_factory=...)`), run unchanged as episodes.

Owns `from_trl`: a TRL environment class (or a factory, or a dict of them routed on each row's
`environment` value) made into an `Environment` the episode runner drives as TRL's
`_tool_call_loop` would (read from trl 1.16.0, `trl/trainer/grpo_trainer.py`):

- one instance per episode, `factory()` with no arguments;
- `reset(**row)` before the first turn, `row` being the prompt's data (a dict) plus `prompt`, its
  chat (TRL passes the dataset row whole; a dict factory's `environment` key is not passed); a
  str it returns is appended to the last message's content, with no separator, as TRL does;
- the tools are the public functions of the class (not `reset`, not `get_reward`, no leading "_"),
  bound to the episode's instance, with their schemas from type hints and Google docstrings (the
  schema transformers' `get_json_schema` gives, what TRL hands the chat template);
- a turn's tool calls (read by the call's parser: "hermes", or SGLang's own with "server") are run
  with the arguments as a dict, contained and with a timeout; each answer is the message
  `{"role": "tool", "name": ..., "content": str(result)}` (TRL's `str`, not JSON);
- a turn without a tool call ends the episode ("done"); `max_turns` bounds the rest, as TRL's
  `max_tool_calling_iterations` (plus one: the last turn answers);
- `get_reward()` (sync or `async def`), when the class has one, is the reward named after the class,
  called with `environments=[...]` after every episode has ended, as TRL adds it; reward functions
  you pass (`reward_funcs=`, TRL's own signatures) are called the same way, so they get
  `environments` too.

Where rlgen departs from TRL, on purpose: a failing tool ends the episode with the tool's status and
its traceback (`on_tool_error="end"`, the default, so a bug is seen) instead of answering
`{"error": str(e)}` and going on (`on_tool_error="reply"` does what TRL does); an exception in
`reset` is the episode's "env_error", in `get_reward` that row's reward status "error" (TRL lets
both end the training step); a call TRL's parser cannot read is kept as a "bad_tool_call" (TRL
reads the turn as plain text); a call inside `<think>` is not run.

Knows nothing about servers, token ids, chat templates or the Engine; it imports nothing of TRL.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..episodes._env import ENV_TIMEOUT, Environment, EnvReply, Timeout, ToolEnv, failure_reply, own_timeout
from ..episodes._tool_calls import ToolCall, ToolCallParser
from ..episodes._tools import ToolResult, run_contained, tools_from, within

__all__ = ["from_trl", "looks_like_trl"]

_NOT_TOOLS = ("reset", "get_reward")


def _tool_names(cls: type) -> list[str]:
    """The class's tools as TRL lists them: public functions on the class, not reset/get_reward."""
    return [name for name, _ in inspect.getmembers(cls, predicate=inspect.isfunction)
            if name not in _NOT_TOOLS and not name.startswith("_")]


def looks_like_trl(env: Any) -> bool:
    """Whether `env` has TRL's environment shape: a class with no `step` whose `reset` takes the
    row's `prompt` by keyword (TRL calls `reset(**row)`, and every row has its prompt: `**kwargs`,
    or a parameter named `prompt`), or a dict of such classes. A class with `step` is one of
    rlgen's own; one with `reset(data)` and no `step` is one of rlgen's own missing its `step`, for
    `as_environment` to refuse."""
    if isinstance(env, Mapping):
        return bool(env) and all(looks_like_trl(v) for v in env.values())
    reset = getattr(env, "reset", None)
    return inspect.isclass(env) and callable(reset) and not hasattr(env, "step") and _takes_prompt(reset)


def _takes_prompt(reset: Callable[..., Any]) -> bool:
    """Whether `reset(**row)` can take the row's `prompt`: `**kwargs`, or a parameter of that name."""
    try:
        params = inspect.signature(reset).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.kind is p.VAR_KEYWORD or (p.name == "prompt" and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY))
               for p in params)


class _TRLEpisode(ToolEnv):
    """One episode of a TRL environment: its instance's tools, reset and answers worded as TRL's."""

    def __init__(self, instance: Any, *, parser: str | ToolCallParser, timeout: float | None,
                 on_tool_error: str) -> None:
        methods = {name: getattr(instance, name) for name in _tool_names(type(instance))}
        super().__init__(methods, parser=parser, timeout=timeout, on_tool_error=on_tool_error)
        self.obj = instance
        self.tool_schemas = self.schemas

    async def reset(self, data: Any, prompt: Sequence[Mapping[str, Any]] | None = None) -> EnvReply:
        chat = [dict(m) for m in prompt or []]
        row = {k: v for k, v in data.items() if k != "environment"} if isinstance(data, Mapping) else {}
        row.setdefault("prompt", [dict(m) for m in chat])  # its own copy: the chat is rebuilt below
        what = f"{type(self.obj).__name__}.reset"
        ran = await run_contained(lambda: _text_or_none(self.obj.reset(**row), what), timeout=self.timeout)
        failed = failure_reply(ran, timed_out=f"{what} did not finish {within(self.timeout)} (timeout=)")
        if failed is not None:
            return failed
        if ran.value is not None and chat:
            chat[-1] = {**chat[-1], "content": str(chat[-1].get("content") or "") + ran.value}
        return EnvReply(prompt=chat, seconds=ran.seconds)

    async def run_call(self, call: ToolCall) -> ToolResult:
        result = await super().run_call(call)
        if result.status in ("ok", "not_serialisable"):  # TRL words any value with str()
            value = result.value
            return dataclasses.replace(result, status="ok", error=None,
                                       text=str(value) if not isinstance(value, str) else value)
        return result

    def error_text(self, call: ToolCall, result: ToolResult) -> str:
        message = (result.error or "").partition(": ")[2] or result.error or ""
        return str({"error": message})


def _text_or_none(value: Any, what: str) -> str | None:
    """reset's return as TRL takes it: None, or a str (content blocks are not supported here)."""
    if value is None or isinstance(value, str):
        return value
    raise TypeError(f"{what} returned {type(value).__name__}; rlgen takes None or a str (TRL's multimodal "
                    "content blocks are not supported)")


def _reward_of(cls: type) -> Callable[..., Any]:
    """`get_reward` as TRL wraps it: a batch reward function over `environments`, None for rows
    whose environment is another class."""
    def get_reward(environments: list[Any], **kwargs: Any) -> list[Any]:  # TRL passes the batch columns too
        return [e.get_reward() if type(e) is cls else None for e in environments]  # type: ignore[attr-defined]

    async def aget_reward(environments: list[Any], **kwargs: Any) -> list[Any]:
        return [await e.get_reward() if type(e) is cls else None for e in environments]  # type: ignore[attr-defined]

    fn: Callable[..., Any] = aget_reward if inspect.iscoroutinefunction(getattr(cls, "get_reward", None)) \
        else get_reward
    fn.__qualname__ = f"{cls.__name__}.get_reward"
    return fn


def _reward_funcs(classes: Sequence[type], extra: Any) -> dict[str, Callable[..., Any]]:
    out: dict[str, Callable[..., Any]] = {}
    for cls in dict.fromkeys(classes):
        if callable(getattr(cls, "get_reward", None)):
            out[cls.__name__] = _reward_of(cls)
    if extra is None:
        return out
    funcs = extra.items() if isinstance(extra, Mapping) else \
        ((getattr(f, "__name__", f"reward_{i}"), f) for i, f in enumerate(extra if isinstance(extra, Sequence)
                                                                         else [extra]))
    for name, fn in funcs:
        if not callable(fn):
            raise TypeError(f"reward_funcs must hold functions, got {fn!r} for {name!r}")
        if name in out:
            raise ValueError(f"two rewards are named {name!r}; pass reward_funcs as a dict to name them")
        out[name] = fn
    return out


def from_trl(factory: Any, *, reward_funcs: Any = None, parser: str | ToolCallParser = "hermes",
             timeout: Timeout = ENV_TIMEOUT, on_tool_error: str = "end") -> Environment:
    """A TRL `environment_factory` as an environment of `Engine.episodes` (see the module docstring).

    Args:
        factory: what `GRPOTrainer(environment_factory=...)` takes: a class (or any callable with no
            arguments returning an instance) with `reset(**row)`, optionally `get_reward()`, and its
            tools as public methods; or a dict `{name: factory}`, each row choosing by its data's
            `environment` value.
        reward_funcs: TRL reward functions (a function, a list, or a dict by name), called after
            the episodes with `environments=` as TRL calls them; their columns join get_reward's.
        parser: how a turn's tool calls are read ("hermes", "server" / "server:<name>" for SGLang's
            own parser, or a function); see `rlgen.episodes.tool_env`.
        timeout: seconds per tool call, and for reset. Default: the call's `env_timeout` (30 s
            unless the call gives another); given here, it wins over `env_timeout`.
        on_tool_error: "end" (the episode ends with the tool's status and traceback) or "reply"
            (the model reads `{'error': ...}` and the episode goes on, as in TRL).

    Raises:
        TypeError / ValueError: a factory that is not a class or callable, an instance that has no
            `reset` or one that cannot take the row's `prompt` by keyword, a tool without type hints or
            docstring arguments (TRL's rule), a bad option.
    """
    if on_tool_error not in ("end", "reply"):
        raise ValueError(f"on_tool_error must be 'end' or 'reply', got {on_tool_error!r}")
    seconds, given = own_timeout("from_trl(timeout=)", timeout)
    factories = dict(factory) if isinstance(factory, Mapping) else {None: factory}
    classes: dict[Any, type] = {}
    schemas: dict[str, dict[str, Any]] = {}
    for name, make in factories.items():
        if not callable(make):
            raise TypeError(f"environment_factory {name!r} must be a class or a function with no arguments, "
                            f"got {make!r}")
        cls = make if inspect.isclass(make) else type(make())  # TRL probes one instance too
        reset = getattr(cls, "reset", None)
        if not callable(reset):
            raise TypeError(f"{cls.__name__} has no reset method; a TRL environment defines reset(**kwargs)")
        if not _takes_prompt(reset):
            raise TypeError(f"{cls.__name__}.reset cannot take the row's prompt: TRL calls reset(**row) with the "
                            "row's columns and its prompt; write reset(self, **kwargs) (or name prompt among its "
                            "parameters)")
        functions = {n: getattr(cls, n) for n in _tool_names(cls)}
        for f in functions.values():
            _check_as_trl(cls, f)
        for tool in tools_from({n: _unbound(f) for n, f in functions.items()}):
            schemas.setdefault(tool.name, tool.schema)
        classes[name] = cls

    rewards = _reward_funcs(list(classes.values()), reward_funcs) or None

    def build(seconds: float | None) -> Environment:
        return Environment(lambda: _TRLRow(factories, parser=parser, timeout=seconds, on_tool_error=on_tool_error),
                           "framework", list(schemas.values()), seconds, reward_funcs=rewards)

    env = build(seconds)
    env.retime = None if given else build
    return env


class _TRLRow(_TRLEpisode):
    """An episode whose instance is made at reset, by the factory its row names (the only one, or
    the data's `environment` value for a dict of factories); making it is contained as reset is."""

    def __init__(self, factories: Mapping[Any, Callable[[], Any]], *, parser: str | ToolCallParser,
                 timeout: float | None, on_tool_error: str) -> None:
        self.factories = factories
        self.options: dict[str, Any] = {"parser": parser, "timeout": timeout, "on_tool_error": on_tool_error}
        self.timeout, self._client = timeout, None

    async def reset(self, data: Any, prompt: Sequence[Mapping[str, Any]] | None = None) -> EnvReply:
        routed = list(self.factories) != [None]
        key = data.get("environment") if routed and isinstance(data, Mapping) else None
        if key not in self.factories:
            return EnvReply(status="env_error",
                            error=f"the row's environment is {key!r}, not among the environment_factory names "
                                  f"{list(self.factories)}; give each row an 'environment' value in data=")
        make = self.factories[key]
        what = f"environment_factory[{key!r}]" if routed else _name(make)
        ran = await run_contained(make, timeout=self.timeout)
        failed = failure_reply(ran, timed_out=f"{what}() did not finish {within(self.timeout)}",
                               note=f" (making the episode's environment, {what}())")
        if failed is not None:
            return failed
        client = self._client
        _TRLEpisode.__init__(self, ran.value, **self.options)
        if client is not None:
            self.bind_client(client)
        reply = await _TRLEpisode.reset(self, data, prompt)
        reply.seconds += ran.seconds
        return reply


def _check_as_trl(cls: type, fn: Callable[..., Any]) -> None:
    """Refuse a tool TRL would refuse: transformers' `get_json_schema` (what TRL's chat template
    call runs on each tool) needs a type hint and a docstring `Args:` line for every parameter."""
    from transformers.utils.chat_template_utils import get_json_schema

    try:
        get_json_schema(_unbound(fn))
    except Exception as e:  # transformers' TypeError / DocstringParsingException
        raise TypeError(f"{cls.__name__}.{fn.__name__} is not a tool TRL can offer: {e} (TRL builds each tool's "
                        "schema with transformers' get_json_schema: give every parameter a type hint and a line "
                        "under 'Args:' in a Google-style docstring)") from None


def _unbound(fn: Callable[..., Any]) -> Callable[..., Any]:
    """A method's function without its `self`, for its schema (TRL hands bound methods over)."""
    signature = inspect.signature(fn)
    params = list(signature.parameters.values())[1:]

    def tool(*args: Any, **kwargs: Any) -> Any:  # pragma: no cover - a schema's stand-in, never called
        raise NotImplementedError

    tool.__name__, tool.__doc__ = fn.__name__, fn.__doc__
    tool.__signature__ = signature.replace(parameters=params)  # type: ignore[attr-defined]
    tool.__annotations__ = {k: v for k, v in getattr(fn, "__annotations__", {}).items() if k != "self"}
    return tool


def _name(fn: Any) -> str:
    return getattr(fn, "__qualname__", None) or type(fn).__name__
