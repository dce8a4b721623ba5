"""verl's tools (`BaseTool` subclasses, `@function_tool` functions), run unchanged as episodes' tools.

Owns `from_verl`: verl tools made into an `Environment` whose episodes call them as verl's
`ToolAgentLoop` does (read from verl 0.9.1, `verl/experimental/agent_loop/tool_agent_loop.py`,
`_call_tool`, and `verl/tools/`):

- the tools: `BaseTool` instances, verl's `FunctionTool` entries, functions decorated with
  `@function_tool` (found in verl's own registry), and/or what verl's `load_all_tools(tool_config_path,
  function_tool_path)` loads (only then is verl imported, by name); their schemas are the ones verl
  gives the chat template, `tool.tool_schema.model_dump(exclude_unset=True, exclude_none=True)`,
  passed through as dicts, never derived again;
- a row's data is verl's dataset row: `tools_kwargs` (top level, or `extra_info.tools_kwargs` as
  verl's dataset reads it) gives each `BaseTool` call its `create_kwargs`; `extra_info.tool_selection`
  narrows the episode's tools (and the schemas its template shows) to those names;
- per call, as `_call_tool`: the arguments as the JSON object verl decodes (a fresh dict); a
  `BaseTool` gets `create(create_kwargs=...)` -> `execute(instance_id, parameters,
  agent_data=...)` -> `release(instance_id)` (release also after a failed execute); a function
  tool is called with the arguments as keywords (a sync one in a thread) and its return read by
  verl's own `normalize_function_tool_return`; `agent_data` is a small stand-in for verl's
  `AgentData`: `messages`, `request_id`, `tools_kwargs`, `metrics`, `extra_fields` (kept for the
  episode, and the episode's `environments` object for reward functions);
- the answer is `{"role": "tool", "content": ToolResponse.text}` (verl's message: no name), cut to
  `max_tool_response_length` characters on `tool_response_truncate_side` as verl cuts it;
- `execute`'s step reward is the env turn's `reward` (summed over the turn's calls; verl's
  `tool_rewards`), its metrics the env turn's `info["tool_metrics"]`; the column `verl_tools` is
  the sum of an episode's step rewards, and a `compute_score` you pass is called per row as verl's
  reward manager calls it (`data_source`, `solution_str`, `ground_truth` from
  `reward_model.ground_truth`, `extra_info`); rlgen's `reward` is their sum.

Where rlgen departs from verl, on purpose: an exception in create/execute/release (or a call
outliving `timeout`) ends the episode with "tool_error" ("tool_timeout") and the traceback
(`on_tool_error="end"`, the default, so a bug is seen); `on_tool_error="reply"` answers the model
with verl's own text, "Error executing tool '<name>': <exception>", and goes on. A call verl
answers "Unknown function ..." or "Invalid JSON ..." ends the episode "bad_tool_call" (kept as data
in the env turn's calls); a call inside `<think>` is not run. The calls of a turn run one after the
other (verl gathers them), all of them unless `max_parallel_calls` is set (verl's default is 1).
A `ToolResponse` with images or videos is "not_serialisable": episodes here are text only.

Knows nothing about servers, token ids, chat templates or the Engine; it never imports verl unless
asked to load tools from paths.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import json
import sys
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..episodes._env import ENV_TIMEOUT, Environment, EnvReply, Timeout, ToolEnv, own_timeout
from ..episodes._tool_calls import ParsedTurn, ToolCall, ToolCallParser
from ..episodes._tools import Tool, ToolResult, run_contained, within

__all__ = ["from_verl", "looks_like_verl"]

_FUNCTION_TOOL_MODULE = "verl.tools.function_tool"
_SIDES = ("left", "right", "middle")


# ---------------------------------------------------------------------------------------------
# recognising verl's tools without importing verl


def _is_base_tool(obj: Any) -> bool:
    return not inspect.isclass(obj) and any(
        c.__name__ == "BaseTool" and c.__module__.startswith("verl") for c in type(obj).__mro__)


def _is_function_tool(obj: Any) -> bool:
    cls = type(obj)
    return cls.__name__ == "FunctionTool" and cls.__module__.startswith("verl")


def _registered(fn: Any) -> Any:
    """The `FunctionTool` verl's registry holds for a function decorated with `@function_tool`
    (the decorator returns the function itself), or None; read from the module verl loaded."""
    module = sys.modules.get(_FUNCTION_TOOL_MODULE)
    registry = getattr(module, "FUNCTION_TOOL_REGISTRY", None) or {}
    return next((entry for entry in registry.values() if getattr(entry, "fn", None) is fn), None)


def _verl_tool(obj: Any) -> Any:
    """`obj` as the object verl's loop holds (a BaseTool or a FunctionTool), or None."""
    if _is_base_tool(obj) or _is_function_tool(obj):
        return obj
    return _registered(obj) if callable(obj) else None


def looks_like_verl(env: Any) -> bool:
    """Whether `env` is verl's tools: a `BaseTool` instance, a `FunctionTool`, or a non-empty
    list of them and of `@function_tool` functions (told by class names and modules, and by verl's
    registry when verl is already imported, so that verl need not be imported)."""
    items = list(env) if isinstance(env, (list, tuple)) else [env]
    return bool(items) and all(_verl_tool(item) is not None for item in items)


# ---------------------------------------------------------------------------------------------
# one episode


class _AgentData:
    """What a verl tool's `execute(..., agent_data=...)` may read of verl's `AgentData`."""

    def __init__(self, tools_kwargs: Mapping[str, Any]) -> None:
        self.messages: list[dict[str, Any]] = []
        self.request_id = uuid.uuid4().hex
        self.tools_kwargs = dict(tools_kwargs)
        self.metrics: dict[str, Any] = {}
        self.extra_fields: dict[str, Any] = {}
        self.tool_rewards: list[float] = []

    def __repr__(self) -> str:
        return f"AgentData(request_id={self.request_id!r}, messages={len(self.messages)})"


@dataclasses.dataclass(frozen=True)
class _Options:
    timeout: float | None
    on_tool_error: str
    parser: str | ToolCallParser
    max_tool_response_length: int | None
    tool_response_truncate_side: str
    max_parallel_calls: int | None


class _VerlEpisode(ToolEnv):
    """One episode of verl tools: the row's tools_kwargs and tool selection, verl's call lifecycle."""

    def __init__(self, tools: Mapping[str, Any], schemas: Mapping[str, dict[str, Any]], options: _Options) -> None:
        super().__init__([Tool(name, _stand_in, schemas[name]) for name in tools], parser=options.parser,
                         timeout=options.timeout, on_tool_error=options.on_tool_error)
        self.verl_tools, self.all_schemas, self.options = dict(tools), dict(schemas), options
        self.obj = _AgentData({})
        self._metrics: list[dict[str, Any]] = []

    async def reset(self, data: Any, prompt: Sequence[Mapping[str, Any]] | None = None) -> EnvReply:
        row = data if isinstance(data, Mapping) else {}
        found = row.get("extra_info")
        extra: Mapping[str, Any] = found if isinstance(found, Mapping) else {}
        tools_kwargs = row.get("tools_kwargs", extra.get("tools_kwargs")) or {}
        if not isinstance(tools_kwargs, Mapping):
            return EnvReply(status="env_error", error=f"the row's tools_kwargs is a {type(tools_kwargs).__name__}; "
                                                      "verl's is a dict {tool name: {'create_kwargs': {...}}}")
        self.obj.tools_kwargs = dict(tools_kwargs)  # the object the runner keeps as the episode's `environments`
        selection = extra.get("tool_selection")
        if selection:  # verl keeps the selected names it knows, in the selection's order
            names = [n for n in selection if n in self.verl_tools]
            self.by_name = {n: self.by_name[n] for n in names}
            self.tool_schemas = [self.all_schemas[n] for n in names]
        return EnvReply()

    async def parse(self, said: str) -> ParsedTurn | EnvReply:
        parsed = await super().parse(said)
        limit = self.options.max_parallel_calls
        if isinstance(parsed, ParsedTurn) and limit is not None and len(parsed.calls) > limit:
            return dataclasses.replace(parsed, calls=parsed.calls[:limit])  # verl runs the first ones only
        return parsed

    async def step(self, messages: list[dict[str, Any]]) -> EnvReply:
        self.obj.messages, self._metrics = messages, []
        reply = await super().step(messages)
        if self._metrics:
            reply.info["tool_metrics"] = self._metrics
        if reply.reward is not None:
            self.obj.tool_rewards.append(reply.reward)
        return reply

    async def run_call(self, call: ToolCall) -> ToolResult:
        tool = self.verl_tools[call.name]
        arguments = json.loads(json.dumps(call.arguments))  # the JSON object verl decodes: a fresh dict
        where = ["call"]
        if _is_function_tool(tool):
            what, run = f"{call.name} (a function tool)", _function_call(tool, arguments)
        else:
            what, run = type(tool).__name__, _lifecycle(tool, call.name, arguments, self.obj, where)
        ran = await run_contained(run, timeout=self.timeout)
        if ran.timed_out:
            error = TimeoutError(f"{what}.{where[0]} did not finish {within(self.timeout)} (timeout=)")
            return ToolResult("tool_timeout", value=error, error=f"TimeoutError: {error}", seconds=ran.seconds)
        if ran.error is not None:
            return ToolResult("tool_error", value=ran.error, error=f"{ran.error_text} (in {what}.{where[0]})",
                              traceback=ran.traceback, seconds=ran.seconds)
        return self._answer(call, ran.value, what, ran.seconds)

    def _answer(self, call: ToolCall, value: Any, what: str, seconds: float) -> ToolResult:
        """A tool's `(ToolResponse, reward, metrics)` as a result: the text cut as verl cuts it."""
        if not (isinstance(value, tuple) and len(value) == 3 and hasattr(value[0], "text")):
            error: Exception = TypeError(f"{what}.execute returned {type(value).__name__}; expected (ToolResponse, reward, "
                              "metrics) as verl's BaseTool.execute returns")
            return ToolResult("tool_error", value=error, error=f"TypeError: {error}", seconds=seconds)
        response, reward, metrics = value
        if getattr(response, "image", None) or getattr(response, "video", None):
            error = ValueError(f"{call.name!r} answered with images or videos; rlgen's episodes are text only "
                               "(a multimodal ToolResponse is not supported)")
            return ToolResult("not_serialisable", value=error, error=f"ValueError: {error}", seconds=seconds)
        self._metrics.append(dict(metrics or {}))
        text = _truncated(response.text, self.options.max_tool_response_length,
                          self.options.tool_response_truncate_side)
        return ToolResult("ok", text=text or "", value=(float(reward) if reward is not None else None, metrics),
                          seconds=seconds)

    def tool_message(self, call: ToolCall, text: str) -> dict[str, Any]:
        return {"role": "tool", "content": text}  # verl's tool message has no name

    def error_text(self, call: ToolCall, result: ToolResult) -> str:
        said = str(result.value) if isinstance(result.value, BaseException) else result.error
        return f"Error executing tool '{call.name}': {said}"

    def step_reward(self, results: Sequence[ToolResult]) -> float | None:
        """The sum of the calls' step rewards; a failed call answered under "reply" counts 0.0, as
        in verl; None when no call gave a reward."""
        rewards = [r.value[0] if r.ok else 0.0 for r in results]
        given = [r for r in rewards if r is not None]
        return float(sum(given)) if given else None


def _stand_in(**kwargs: Any) -> Any:  # pragma: no cover - the calls go through run_call
    raise NotImplementedError("verl tools are called through from_verl's run_call")


def _lifecycle(tool: Any, name: str, arguments: dict[str, Any], agent_data: _AgentData,
               where: list[str]) -> Callable[[], Any]:
    """verl's `_call_tool` for a BaseTool: create, execute, release (also after a failure);
    `where[0]` says which step was running, for the error."""
    async def run() -> Any:
        where[0] = "create"
        instance_id, _ = await tool.create(create_kwargs=agent_data.tools_kwargs.get(name, {}).get("create_kwargs", {}))
        try:
            where[0] = "execute"
            out = await tool.execute(instance_id, arguments, agent_data=agent_data)
        finally:
            if instance_id:
                failed, where[0] = where[0], "release"
                await tool.release(instance_id)
                where[0] = failed
        return out

    return run


def _function_call(tool: Any, arguments: dict[str, Any]) -> Callable[[], Any]:
    """A `FunctionTool` called with the arguments as keywords, its return read by verl's
    `normalize_function_tool_return` (from the module its class comes from); a sync function runs
    in a thread of its own (`run_contained`), as verl's `asyncio.to_thread`."""
    normalize = _normalizer(tool)
    if inspect.iscoroutinefunction(tool.fn):
        async def run_async() -> Any:
            return normalize(await tool.fn(**arguments))

        return run_async
    return lambda: normalize(tool.fn(**arguments))


def _normalizer(tool: Any) -> Callable[[Any], Any]:
    """verl's `normalize_function_tool_return`, from the module the FunctionTool class comes from."""
    normalize = getattr(sys.modules.get(type(tool).__module__), "normalize_function_tool_return", None)
    if normalize is None:
        raise TypeError(f"{type(tool).__module__} has no normalize_function_tool_return; from_verl reads "
                        "function tools as verl 0.9.1 does (use verl >= 0.9.1)")
    return normalize  # type: ignore[no-any-return]


def _truncated(text: str | None, limit: int | None, side: str) -> str | None:
    """verl's cut of a long tool answer (`_call_tool`), by characters."""
    if not text or limit is None or len(text) <= limit:
        return text
    if side == "left":
        return "(truncated)..." + text[-limit:]
    if side == "right":
        return text[:limit] + "...(truncated)"
    half = limit // 2
    return text[:half] + "...(truncated)..." + text[-half:]


# ---------------------------------------------------------------------------------------------
# the environment


def _schema(tool: Any) -> dict[str, Any]:
    """The schema verl's loop gives the chat template, as a dict."""
    schema = tool.tool_schema
    if isinstance(schema, Mapping):
        return dict(schema)
    return dict(schema.model_dump(exclude_unset=True, exclude_none=True))


def _load(tool_config_path: str | None, function_tool_path: str | None) -> list[Any]:
    """verl's own `load_all_tools`, imported by name (verl must be importable)."""
    try:
        registry = importlib.import_module("verl.tools.tool_registry")
    except ImportError as e:
        raise ImportError(f"from_verl(tool_config_path=..., function_tool_path=...) loads the tools with verl's own "
                          f"load_all_tools, and verl does not import here ({type(e).__name__}: {e}); install verl, "
                          "or make the tools yourself and pass them as from_verl([...])") from e
    return list(registry.load_all_tools(tool_config_path, function_tool_path))


def _collect(tools: Any, tool_config_path: str | None, function_tool_path: str | None) -> dict[str, Any]:
    items = [] if tools is None else list(tools) if isinstance(tools, (list, tuple)) else [tools]
    found: list[Any] = []
    for item in items:
        tool = _verl_tool(item)
        if tool is None:
            raise TypeError(f"from_verl takes verl tools: BaseTool instances, FunctionTools or functions decorated "
                            f"with verl's @function_tool; got {item!r} (for plain Python functions use "
                            "rlgen.episodes.tool_env)")
        found.append(tool)
    if tool_config_path is not None or function_tool_path is not None:
        found += _load(tool_config_path, function_tool_path)
    if not found:
        raise ValueError("from_verl has no tools: pass tools=[...], tool_config_path= or function_tool_path=")
    by_name: dict[str, Any] = {}
    for tool in found:
        name = getattr(tool, "name", None)
        if not isinstance(name, str) or not name:
            raise TypeError(f"{tool!r} has no name; a verl tool's name is its tool_schema.function.name")
        if _is_function_tool(tool):
            _normalizer(tool)  # refused here, not at the first call
        if name in by_name and by_name[name] is not tool:
            raise ValueError(f"two tools are named {name!r}; each verl tool name must be unique, rename one")
        by_name[name] = tool
    return by_name


def _score_row(compute_score: Callable[..., Any]) -> Callable[[Mapping[str, Any]], Any]:
    """`compute_score` called on a row as verl's reward manager calls it."""
    def score(row: Mapping[str, Any]) -> Any:
        spec = row.get("reward_model")
        truth = spec.get("ground_truth") if isinstance(spec, Mapping) else row.get("ground_truth")
        extra = row.get("extra_info")
        return compute_score(data_source=row.get("data_source"), solution_str=row.get("completion") or "",
                             ground_truth=truth, extra_info=dict(extra) if isinstance(extra, Mapping) else {})

    score.__qualname__ = getattr(compute_score, "__qualname__", "compute_score")
    return score


def _tool_rewards(row: Mapping[str, Any]) -> float | None:
    steps = row.get("step_rewards")  # none when no call gave a reward
    return float(sum(steps)) if steps is not None and not isinstance(steps, float) and len(steps) else None


_tool_rewards.__qualname__ = "verl tools: the sum of the step rewards"


def from_verl(tools: Any = None, *, tool_config_path: str | None = None, function_tool_path: str | None = None,
              compute_score: Callable[..., Any] | None = None, parser: str | ToolCallParser = "hermes",
              timeout: Timeout = ENV_TIMEOUT, on_tool_error: str = "end", max_tool_response_length: int | None = None,
              tool_response_truncate_side: str = "middle", max_parallel_calls: int | None = None) -> Environment:
    """verl's tools as an environment of `Engine.episodes` (see the module docstring); each prompt's
    `data=` is its verl dataset row (`extra_info.tools_kwargs`, `reward_model.ground_truth`, ...).

    Args:
        tools: `BaseTool` instances, `FunctionTool`s, `@function_tool` functions (one or a list).
        tool_config_path / function_tool_path: verl's `rollout.multi_turn` settings of those names,
            loaded with verl's `load_all_tools` (verl must be importable), added to `tools`.
        compute_score: verl's custom reward function, scored once the episodes have ended.
        parser: how a turn's calls are read ("hermes", verl's `multi_turn.format`; "server" /
            "server:<name>" for SGLang's own; or a function); see `rlgen.episodes.tool_env`.
        timeout: seconds per call (create, execute and release together). Default: the call's
            `env_timeout` (30 s unless the call gives another); given here, it wins over `env_timeout`.
        on_tool_error: "end" (the episode ends with the status and traceback) or "reply" (the model
            reads verl's "Error executing tool ..." and the episode goes on).
        max_tool_response_length / tool_response_truncate_side: verl's settings of those names
            (its config defaults are 256 and "middle"; None here: no cut).
        max_parallel_calls: run only a turn's first calls (verl's default is 1; None: all).

    Raises:
        TypeError / ValueError: something that is not a verl tool, no tools, two tools of one name,
            a bad option; ImportError: paths given and verl does not import.
    """
    if on_tool_error not in ("end", "reply"):
        raise ValueError(f"on_tool_error must be 'end' or 'reply', got {on_tool_error!r}")
    if tool_response_truncate_side not in _SIDES:
        raise ValueError(f"tool_response_truncate_side must be one of {_SIDES}, got {tool_response_truncate_side!r}")
    for name, value in (("max_tool_response_length", max_tool_response_length),
                        ("max_parallel_calls", max_parallel_calls)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ValueError(f"{name} must be a positive int or None, got {value!r}")
    if compute_score is not None and not callable(compute_score):
        raise TypeError(f"compute_score must be a function, got {compute_score!r}")
    seconds, given = own_timeout("from_verl(timeout=)", timeout)
    by_name = _collect(tools, tool_config_path, function_tool_path)
    schemas = {name: _schema(tool) for name, tool in by_name.items()}
    options = _Options(seconds, on_tool_error, parser, max_tool_response_length, tool_response_truncate_side,
                       max_parallel_calls)
    _VerlEpisode(by_name, schemas, options)  # the parser and options checked once, before anything runs
    rewards: dict[str, Callable[..., Any]] = {"verl_tools": _tool_rewards}
    if compute_score is not None:
        rewards[getattr(compute_score, "__name__", "compute_score")] = _score_row(compute_score)

    def build(seconds: float | None) -> Environment:
        timed = dataclasses.replace(options, timeout=seconds)
        return Environment(lambda: _VerlEpisode(by_name, schemas, timed), "framework", list(schemas.values()),
                           seconds, reward_funcs=rewards)

    env = build(seconds)
    env.retime = None if given else build
    return env
