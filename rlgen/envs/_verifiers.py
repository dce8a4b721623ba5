"""verifiers' v0 environments (`vf.MultiTurnEnv`, `vf.ToolEnv`, ...), run unchanged: their own loop, rlgen as the model.

Owns `from_verifiers`: a verifiers v0 `Environment` instance made into an `Environment` whose
`loop` runs the environment's own rollouts (`rollout` is `@final` in verifiers: the environment
owns the loop), with rlgen plugged in as its model client (read from verifiers 0.3.1,
`verifiers/legacy/envs/multiturn_env.py`, `clients/client.py`, `types.py`, `rubrics/rubric.py`):

- per prompt and sample, `await vf_env.rollout(input, client, model, sampling_args)`, all at once;
  `input` is `{**data, "prompt": chat, "example_id": prompt_index}` (a non-dict data item is the
  row's `answer`); then per prompt, as `Environment.generate` scores a group, the rubric's
  `score_group` over the n states (`dummy_score_group` when the environment does not score) and
  its `cleanup` per state;
- the client (a `vf.Client` subclass, made when first used: verifiers is imported only then)
  answers `get_response(prompt, model, sampling_args, tools, state=...)` token in, token out: the
  first call of a rollout renders its messages and tools once (`EpisodeCall.first_ids`, one render
  for the n rollouts of a prompt); each later call
  checks that the history verifiers passes is the one already sent, and appends only the template
  delta of the messages that are new (`EpisodeCall.delta_ids`), after a closing EOS where the last
  turn did not sample one: the history's ids are the ids sampled, never re-tokenized. The turn is
  sampled through the runner's sender (seeding, batching, the bound on requests in flight);
  with tools, its calls are read outside `<think>` blocks by the server's parser (SGLang's
  `/parse_function_call`) or `hermes` (a call to a tool not offered, which SGLang drops, is put back
  where the server's parser reads hermes' blocks: verifiers answers it, as in its own loop), and answered as `vf.Response` with a `ResponseMessage`
  (content without the call blocks, `tool_calls=[ToolCall(id, name, arguments JSON)]`,
  finish_reason, is_truncated, `tokens=ResponseTokens(prompt_ids, prompt_mask, completion_ids,
  completion_mask, completion_logprobs)`), so verifiers' trajectory holds the very ids rlgen sent;
- one `EpisodeRecord` per rollout, filled as `Episode` fills it (ids, loss mask, logprobs, turn
  ids, roles, messages as the ids render them, assistant and env turns), its `env` the rollout's
  final state: the result is a plain `Episodes`, and `check_drift()` works on it;
- the rubric's `state["reward"]` is the reward named after the environment's class, and its
  metrics (`state["metrics"]`) columns `reward_<name>_<metric>`, through `Environment.reward_funcs`
  (they read the episodes' `environments`, the final states).

Statuses: verifiers' stop conditions ("max_turns_reached" is "max_turns", "prompt_too_long"
"context_limit", "timeout_reached" "env_timeout", any other "done"); a `vf.Error` verifiers caught
into `state["error"]` (`ToolParseError` "bad_tool_call", `ToolCallError` "tool_error",
`ModelError` "request_error", any other "env_error", with its text, causes and traceback); any
other exception out of `rollout` that episode's "env_error" with its traceback (the others go on);
outliving `timeout=` "env_timeout", and so is an environment step outliving `step_timeout=` (the
call's `env_timeout` by default: `_StepClock`). rlgen's own ends win: `max_turns` (verifiers asks for one turn
more), "context_limit" (raised to verifiers as `OverlongPromptError`), "request_error",
"template_error", "error" (a bug here, with its traceback). A call the parser cannot read is kept
as data (the env turn's `calls`), never sent to verifiers, so never run; an episode that ends right
after one ends "bad_tool_call". History that the environment rewrote is drift: the record's
messages take the rewritten ones (the ids keep what was sent), the env turn's `info` names them,
and `check_drift()` shows where.

What is not supported, and why: `docs/environments.md`. Knows nothing about servers, HTTP or the
Engine; verifiers is imported only when a rollout's client is made.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import importlib
import json
import time
import traceback as tb
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..core._options import check_seconds
from ..episodes._env import ENV_TIMEOUT, Environment, Timeout, own_timeout
from ..episodes._episode import EpisodeCall, sample_turn
from ..episodes._result import EpisodeRecord, Turn
from ..episodes._runner import LoopCall
from ..episodes._tool_calls import ParsedTurn, outside_think, parse_hermes, parse_with_server, with_unoffered_calls
from ..episodes._tools import within

__all__ = ["from_verifiers", "looks_like_verifiers"]

# Statuses the runner's side gives (not the environment's failures): an env turn never carries them.
_OWN_ENDS = ("done", "max_turns", "context_limit", "request_error", "template_error", "error")
# A state key naming why the rubric could not score the rollout (read by the reward function).
_SCORING_ERROR = "rlgen_scoring_error"


def looks_like_verifiers(env: Any) -> bool:
    """Whether `env` is a verifiers v0 environment instance (its class derives from a class named
    `Environment` in a `verifiers` module; told without importing verifiers). verifiers v1's `Env`
    is not one: it is driven from behind its model endpoint only."""
    return not isinstance(env, type) and any(
        c.__name__ == "Environment" and c.__module__.startswith("verifiers") and ".v1" not in c.__module__
        for c in type(env).__mro__)


# ---------------------------------------------------------------------------------------------
# messages: verifiers' (pydantic models or dicts) as plain dicts, and as the chat template takes them


def _plain(obj: Any) -> dict[str, Any]:
    """A verifiers message or tool (a pydantic model, or a dict) as a plain dict without Nones."""
    if hasattr(obj, "model_dump"):
        return dict(obj.model_dump(exclude_none=True))
    return {k: v for k, v in dict(obj).items() if v is not None}


def _text(content: Any) -> str:
    """A message's content as text: a str, or its text parts joined (other parts are refused)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    parts: list[str] = []
    for part in content:
        kind = part.get("type") if isinstance(part, Mapping) else getattr(part, "type", None)
        if kind != "text":
            raise ValueError(f"a message holds a {kind!r} content part; rlgen's verifiers client renders text "
                             "messages through the chat template (images and audio are not supported)")
        parts.append(str(part["text"] if isinstance(part, Mapping) else part.text))
    return "".join(parts)


def _key(message: Mapping[str, Any]) -> tuple[Any, ...]:
    """What makes two messages the same for the history check: role, text, tool calls, call id."""
    calls = tuple((c.get("id"), c.get("name"), c.get("arguments")) for c in message.get("tool_calls") or ())
    return (message.get("role"), _text(message.get("content")), calls, message.get("tool_call_id"))


def _chat_message(message: Mapping[str, Any]) -> dict[str, Any]:
    """A verifiers message as the chat template renders it (OpenAI's shape of tool calls)."""
    role = message.get("role")
    if role == "text":
        raise ValueError("a completion-style message (role 'text', message_type='completion'); rlgen runs chat "
                         "environments through the chat template")
    out: dict[str, Any] = {"role": role, "content": _text(message.get("content"))}
    for k in ("name", "tool_call_id"):
        if message.get(k) is not None:
            out[k] = message[k]
    if message.get("tool_calls"):
        out["tool_calls"] = [{"id": c.get("id"), "type": "function",
                              "function": {"name": c.get("name"), "arguments": _arguments(c.get("arguments"))}}
                             for c in message["tool_calls"]]
    return out


def _chat(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """`_chat_message` of each; a message rlgen cannot render is the environment's "bad_env_return"."""
    try:
        return [_chat_message(m) for m in messages]
    except ValueError as e:
        raise _Stop("bad_env_return", f"ValueError: {e}") from e


def _arguments(raw: Any) -> Any:
    try:
        return json.loads(raw) if isinstance(raw, str) else raw
    except json.JSONDecodeError:
        return raw


def _schemas(tools: Sequence[Any] | None) -> list[dict[str, Any]] | None:
    """verifiers' `vf.Tool`s (name, description, parameters) as function-calling schemas."""
    if not tools:
        return None
    out = []
    for tool in map(_plain, tools):
        function = {k: tool[k] for k in ("name", "description", "parameters") if k in tool}
        out.append({"type": "function", "function": function})
    return out


# ---------------------------------------------------------------------------------------------
# one rollout, token in and token out


class _Stop(Exception):
    """rlgen ends the rollout: the client raises it to verifiers as `OverlongPromptError`
    (`overlong`: a stop verifiers reads as truncation) or `ModelError`."""

    def __init__(self, status: str, error: str | None, traceback: str | None = None, *, overlong: bool = False):
        super().__init__(error or status)
        self.status, self.error, self.traceback, self.overlong = status, error, traceback, overlong


@dataclass
class _Sampled:
    """One assistant turn as verifiers gets it back."""

    content: str
    reasoning: str | None
    calls: list[tuple[str, str, str]]           # (id, name, arguments as JSON)
    finish_reason: str
    prompt_ids: list[int]
    completion_ids: list[int]
    completion_logprobs: list[float]
    rid: str | None


class _StepClock:
    """The environment's stretches of one rollout, each bounded by `seconds` (`step_timeout`, the
    call's `env_timeout`): from the rollout's start to its first model call (`setup_state`), and
    from each answer to the next call or the rollout's end (`env_response` with its tools, the stop
    conditions). A stretch that outlives it cancels the rollout (`expired`); the model's time is
    never counted. Sync work that blocks the event loop cannot be stopped this way (as with
    `timeout=`)."""

    def __init__(self, task: asyncio.Future[Any], seconds: float | None) -> None:
        self.task, self.seconds, self.expired = task, seconds, False
        self._timer: asyncio.TimerHandle | None = None
        self.resume()

    def pause(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def resume(self) -> None:
        self.pause()
        if self.seconds is not None and not self.task.done():
            self._timer = asyncio.get_running_loop().call_later(self.seconds, self._expire)

    def _expire(self) -> None:
        self._timer = None
        if not self.task.done():
            self.expired = True
            self.task.cancel()


@dataclass
class _Rollout:
    """One rollout's bookkeeping: the record it fills, the messages verifiers has been sent
    (`seen`, as `_key`s), the turns, and how rlgen ended it (`ended`). Knows nothing of verifiers'
    classes: it takes and gives plain dicts."""

    call: EpisodeCall
    record: EpisodeRecord
    parser: str
    seen: list[tuple[Any, ...]] = field(default_factory=list)
    turns: list[Turn] = field(default_factory=list)
    turn: int = -1                                  # the last assistant turn
    ended: _Stop | None = None
    state: Any = None
    tools: list[dict[str, Any]] | None = None
    returned_at: float = 0.0                        # when the last turn went back to verifiers
    clock: _StepClock | None = None                 # bounds the environment's steps between turns
    calls: list[dict[str, Any]] = field(default_factory=list)  # the last turn's calls, for its env turn
    bad_call: str | None = None                     # the last turn's malformed call, if any
    in_think: int = 0                               # the last turn's call markers inside <think> (not read)

    async def respond(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, budget: int,
                      state: Any = None) -> _Sampled:
        """The next assistant turn for verifiers' `messages` (raises `_Stop` when rlgen ends it)."""
        if state is not None:
            self.state = state
        if self.ended is not None:
            raise self.ended
        if self.clock is not None:
            self.clock.pause()  # the model's turn: not the environment's time
        try:
            if not self.seen:
                self._start(messages, tools)
            else:
                self._take_env(messages)
            return await self._sample(budget)
        except _Stop as stop:
            self.ended = stop
            raise
        except Exception as e:  # a bug here, not the environment's: the episode's "error"
            self.ended = _Stop("error", f"{type(e).__name__}: {e}", "".join(tb.format_exception(e)))
            raise self.ended from e
        finally:
            if self.clock is not None:
                self.clock.resume()

    def _start(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> None:
        record, call = self.record, self.call
        record.messages = _chat(messages)
        record.n_prompt_messages = len(record.messages)
        self.tools = _schemas(tools) if tools is not None else call.environment.tools
        try:
            first = call.first_ids(record.messages, self.tools)
        except Exception as e:  # a chat the template refuses
            raise _Stop("template_error", f"{type(e).__name__}: {e}") from e
        record.prompt_len = len(first)
        record.extend(first, role="prompt", turn=0)
        self.seen = [_key(m) for m in messages]

    def _take_env(self, messages: list[dict[str, Any]]) -> None:
        """The environment's messages since the last turn: an env turn, then their delta (or an end)."""
        call, record, k = self.call, self.record, self.turn
        new, rewritten = self._new_messages(messages)
        said = _chat(new)
        waited = time.perf_counter() - self.returned_at
        record.env_seconds += waited
        answered = {m.get("tool_call_id"): m["content"] for m in said if m["role"] == "tool"}
        for c in self.calls:
            if c.get("id") in answered:
                c["status"], c["result"] = "answered", answered[c["id"]]
        info: dict[str, Any] = {"rewritten_history": rewritten} if rewritten else {}
        turn = self._env_turn(text="\n".join(m["content"] for m in said) or None, latency_s=waited,
                              roles=[m["role"] for m in said], info=info)
        if k + 1 >= call.max_turns:  # verifiers asks for one turn more than max_turns
            raise _Stop("max_turns", None, overlong=True)
        if not said:
            raise _Stop("bad_env_return", "the environment answered the last turn with no message: there is "
                                          "nothing new to send (env_response returned [])")
        try:
            delta = call.delta_ids(said)
        except Exception as e:  # TemplateError, or a template that refuses the messages
            raise _Stop("template_error", f"{type(e).__name__}: {e}") from e
        if not call.fits(len(record.ids) + len(delta)):  # never sent: kept in the turns frame only
            raise _Stop("context_limit", f"turn {k + 1}: the environment's reply ({len(delta)} tokens) was not "
                                         f"sent: {call.too_long(len(record.ids) + len(delta))}", overlong=True)
        record.messages.extend(said)
        record.extend(delta, role="env", turn=k)
        turn.tokens = len(delta)
        self.seen.extend(_key(m) for m in new)

    def _env_turn(self, **fields: Any) -> Turn:
        """The env turn after the last assistant turn, with that turn's calls (then forgotten)."""
        info = {**fields.pop("info", {}), **({"calls_in_think": self.in_think} if self.in_think else {})}
        turn = Turn(self.turn, "env", tool_calls=len(self.calls) or None, calls=self.calls, info=info,
                    tool_calls_failed=sum(c["status"] == "bad_tool_call" for c in self.calls) or None, **fields)
        self.turns.append(turn)
        self.calls, self.in_think = [], 0
        return turn

    def _new_messages(self, messages: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[int]]:
        """The messages after those already sent, and the indices of history the environment
        rewrote (the record's messages take the rewritten ones: the ids keep what was sent)."""
        n = len(self.seen)
        keys = [_key(m) for m in messages]
        if len(messages) > n and keys[:n] == self.seen:
            return messages[n:], []
        last = max((i for i, m in enumerate(messages) if m.get("role") == "assistant"), default=-1)
        history, new = messages[:last + 1], messages[last + 1:]
        record = self.record
        if len(history) == n:
            rewritten = [i for i in range(n) if keys[i] != self.seen[i]]
            for i in rewritten:
                record.messages[i] = _chat([history[i]])[0]
        else:  # messages dropped or added: the whole history as the environment now has it
            rewritten = list(range(len(history)))
            record.messages = _chat(history)
        self.seen = keys[:last + 1]
        return new, rewritten

    async def _sample(self, budget: int) -> _Sampled:
        """One turn sampled through the runner's sender, into the record, read for tool calls."""
        call, record = self.call, self.record
        k = self.turn + 1
        got = await sample_turn(call, record, k, budget)
        if isinstance(got, tuple):
            status, error = got
            raise _Stop(status, error, overlong=status == "context_limit")
        self.turns.append(got.turn)
        self.turn = k
        content, reasoning, calls = await self._read_calls(got.turn.text or "")
        finish = "tool_calls" if calls else "length" if got.finish == "length" else "stop"
        self.seen.append(_key({"role": "assistant", "content": content,
                               "tool_calls": [{"id": i, "name": n, "arguments": a} for i, n, a in calls]}))
        self.returned_at = time.perf_counter()
        return _Sampled(content, reasoning, calls, finish, record.ids[:got.sent], got.ids, got.logprobs, got.rid)

    async def _read_calls(self, text: str) -> tuple[str, str | None, list[tuple[str, str, str]]]:
        """(content for verifiers, the reasoning, the calls) of a turn; without tools, the text whole.
        A malformed call is kept in `self.calls` (the env turn's `calls`), never returned."""
        if not self.tools:
            return text, None, []
        said, thought = outside_think(text)
        if self.parser == "hermes":
            parsed: ParsedTurn = parse_hermes(said)
        else:
            name = self.parser.partition(":")[2] or "hermes"
            parsed = await parse_with_server(self.call.sender.client, said, self.tools, parser=name)
            parsed = with_unoffered_calls(parsed, said, self.tools, name)  # verifiers answers those itself
        r = self.record
        calls = [(f"call_{r.prompt_index}_{r.sample_index}_{self.turn}_{j}", c.name,
                  json.dumps(c.arguments, ensure_ascii=False)) for j, c in enumerate(parsed.calls)]
        self.calls = [{"id": i, "name": n, "arguments": json.loads(a), "status": "unanswered"} for i, n, a in calls]
        self.bad_call = parsed.error
        if parsed.error is not None:
            self.calls.append({"name": None, "arguments": None, "status": "bad_tool_call", "error": parsed.error,
                               "parser": self.parser})
        self.in_think = thought.count("<tool_call>")
        return parsed.text_without_calls, thought or None, calls

    def finish(self, state: Any, failure: _Stop | None, *, cancelled: bool = False) -> None:
        """The record's status (rlgen's end, else `failure`, else the state's), its last env turn
        and its turns; on every way out (a cancelled rollout keeps "running" for the runner)."""
        record = self.record
        try:
            self.state = state if state is not None else self.state
            if cancelled:
                return
            end = self.ended or failure or _end_of_state(self.state)
            status, error = end.status, end.error
            if status == "done" and self.bad_call is not None:
                status, error = "bad_tool_call", self.bad_call
            record.status, record.error, record.traceback = status, error, end.traceback
            if status == "max_turns" and self.ended is not None and isinstance(self.state, dict):
                # rlgen's max_turns reached verifiers as OverlongPromptError: say what stopped it
                self.state["stop_condition"], self.state["prompt_too_long"] = "max_turns_reached", False
            stop = self.state.get("stop_condition") if isinstance(self.state, Mapping) else None
            env_status = status if status not in _OWN_ENDS else None
            if self.turns and self.turns[-1].role == "assistant":
                waited = time.perf_counter() - self.returned_at
                record.env_seconds += waited
                self._env_turn(latency_s=waited, status=env_status, done=status == "done",
                               info={"stop_condition": stop} if stop else {})
            elif self.turns and env_status is not None:
                self.turns[-1].status = env_status
        finally:
            record.turns = [t.as_dict() for t in self.turns]
            record.env = self.state


def _end_of_state(state: Any) -> _Stop:
    """How verifiers ended a rollout that returned: its caught error, else its stop condition."""
    if not isinstance(state, Mapping):
        return _Stop("env_error", f"the rollout returned {type(state).__name__}, not a state")
    error = state.get("error")
    if error is not None:
        return _error_end(error)
    stop = state.get("stop_condition")
    if stop == "timeout_reached" or state.get("timed_out"):
        return _Stop("env_timeout", "TimeoutError: the rollout outlived the environment's timeout_seconds")
    if stop == "prompt_too_long":
        return _Stop("context_limit", "the prompt is too long for the model (verifiers' prompt_too_long)")
    return _Stop("max_turns" if stop == "max_turns_reached" else "done", None)


def _error_end(error: Any) -> _Stop:
    """A `vf.Error` from `state["error"]` as a status (by its classes' names), its text and causes."""
    if isinstance(error, Mapping):  # a state already serialised (`State.finalize`)
        return _Stop("env_error", f"{error.get('error')}: {error.get('message')}")
    names = {c.__name__ for c in type(error).__mro__}
    status = ("bad_tool_call" if "ToolParseError" in names else "tool_error" if "ToolCallError" in names
              else "context_limit" if "OverlongPromptError" in names else "request_error" if "ModelError" in names
              else "env_error")
    text = f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
    cause = error.__cause__ or error.__context__
    while cause is not None:
        text += f" (from {type(cause).__name__}: {cause})"
        cause = cause.__cause__ or cause.__context__
    trace = "".join(tb.format_exception(error)) if isinstance(error, BaseException) else None
    return _Stop(status, text, trace)


# ---------------------------------------------------------------------------------------------
# verifiers' side: the client class, the call's loop, the rubric's rewards


@functools.cache
def _client_class() -> type:
    """rlgen's `vf.Client` (verifiers imported now): `get_response` is the rollout's `respond`."""
    try:
        vf: Any = importlib.import_module("verifiers")
        base = vf.Client
    except (ImportError, AttributeError) as e:
        raise ImportError(f"from_verifiers needs verifiers' v0 API (verifiers<=0.3.x: `vf.Client`): {e}; "
                          "pip install 'verifiers==0.3.1'") from e

    class RlgenClient(base):  # type: ignore[misc, valid-type]
        """verifiers' model client, token in and token out through rlgen's episode runner."""

        def __init__(self, rollout: _Rollout) -> None:
            super().__init__(None)
            self.rollout = rollout

        def setup_client(self, config: Any) -> None:
            return None

        async def to_native_tool(self, tool: Any) -> Any:
            return tool

        async def to_native_prompt(self, messages: Any) -> tuple[Any, dict[str, Any]]:
            return messages, {}

        async def get_native_response(self, prompt: Any, model: str, sampling_args: Any, tools: Any = None,
                                      **kwargs: Any) -> Any:
            raise NotImplementedError("rlgen's client answers get_response itself")

        async def raise_from_native_response(self, response: Any) -> None:
            return None

        async def from_native_response(self, response: Any) -> Any:
            return response

        async def close(self) -> None:
            return None

        async def get_response(self, prompt: Any, model: str, sampling_args: Any, tools: Any = None,
                               **kwargs: Any) -> Any:
            try:
                out = await self.rollout.respond([_plain(m) for m in prompt], [_plain(t) for t in tools or ()] or None,
                                                 _budget(self.rollout.call, sampling_args), state=kwargs.get("state"))
            except _Stop as stop:
                raise (vf.OverlongPromptError if stop.overlong else vf.ModelError)(stop.error or stop.status) from None
            return _response(vf, out, model)

    return RlgenClient


def _budget(call: EpisodeCall, sampling_args: Any) -> int:
    """The turn's max_new_tokens: rlgen's, or verifiers' `max_tokens` when smaller."""
    args = sampling_args if isinstance(sampling_args, Mapping) else {}
    asked = args.get("max_tokens") or args.get("max_completion_tokens")
    return min(call.max_new_tokens, int(asked)) if isinstance(asked, int) and asked > 0 else call.max_new_tokens


def _response(vf: Any, out: _Sampled, model: str) -> Any:
    """A `vf.Response` of one sampled turn, as verifiers' own clients build it."""
    n_p, n_c = len(out.prompt_ids), len(out.completion_ids)
    tokens = vf.ResponseTokens(prompt_ids=out.prompt_ids, prompt_mask=[0] * n_p, completion_ids=out.completion_ids,
                               completion_mask=[1] * n_c, completion_logprobs=out.completion_logprobs)
    message = vf.ResponseMessage(
        content=out.content, reasoning_content=out.reasoning,
        tool_calls=[vf.ToolCall(id=i, name=n, arguments=a) for i, n, a in out.calls] or None,
        finish_reason=out.finish_reason, is_truncated=out.finish_reason == "length", tokens=tokens)
    usage = vf.Usage(prompt_tokens=n_p, reasoning_tokens=0, completion_tokens=n_c, total_tokens=n_p + n_c)
    return vf.Response(id=out.rid or "rlgen", created=int(time.time()), model=model, usage=usage, message=message)


@dataclass(frozen=True)
class _Options:
    model: str
    sampling_args: Mapping[str, Any] | None
    parser: str
    timeout: float | None
    step_timeout: float | None


def _rollout_input(chat: Sequence[Mapping[str, Any]], data: Any, prompt_index: int) -> dict[str, Any]:
    """verifiers' `RolloutInput`: the prompt's data (a dict's keys; anything else is its `answer`),
    the chat as `prompt`, the prompt's index as `example_id`."""
    row = dict(data) if isinstance(data, Mapping) else {} if data is None else {"answer": data}
    return {**row, "prompt": [dict(m) for m in chat], "example_id": prompt_index}


async def _one(vf_env: Any, loop: LoopCall, record: EpisodeRecord, opts: _Options) -> Any:
    """One rollout, contained: its final state (None when it raised or timed out), its record filled."""
    rollout = _Rollout(loop.call, record, opts.parser)
    inp = _rollout_input(loop.prompts[record.prompt_index], record.data, record.prompt_index)
    state, failure, cancelled = None, None, True
    task: asyncio.Future[Any] | None = None
    try:
        client = _client_class()(rollout)
        task = asyncio.ensure_future(vf_env.rollout(inp, client, opts.model, dict(opts.sampling_args or {})))
        rollout.clock = clock = _StepClock(task, opts.step_timeout)
        try:
            done, _ = await asyncio.wait({task}, timeout=opts.timeout)
        finally:
            clock.pause()
        if clock.expired:
            await asyncio.gather(task, return_exceptions=True)
            failure = _Stop("env_timeout", f"TimeoutError: an environment step (setup_state, env_response with its "
                                           f"tools, or a stop condition) did not finish {within(opts.step_timeout)} "
                                           "(env_timeout=, or from_verifiers(step_timeout=))")
        elif not done:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await loop.call.sender.abort_given_up()  # its request in flight, if any: nobody reads it now
            failure = _Stop("env_timeout", f"TimeoutError: the rollout did not finish {within(opts.timeout)} "
                                           "(from_verifiers(timeout=))")
        else:
            state = task.result()
        cancelled = False
    except asyncio.CancelledError:
        if task is not None:
            task.cancel()
        raise
    except Exception as e:  # out of rollout: the environment's failure (a bug in env_response, setup_state...)
        failure, cancelled = _Stop("env_error", f"{type(e).__name__}: {e}", "".join(tb.format_exception(e))), False
    finally:
        rollout.finish(state, failure, cancelled=cancelled)
    return state


async def _score(vf_env: Any, states: list[Any]) -> None:
    """The rubric over one prompt's states, as verifiers' `generate` scores a group, then its
    cleanup; a failure is kept on each state (the reward function raises it: that row's "error")."""
    if not states:
        return
    rubric = vf_env.rubric
    try:
        if getattr(vf_env, "score_rollouts", True):
            await rubric.score_group(states)
        else:
            await rubric.dummy_score_group(states)
        for state in states:
            await rubric.cleanup(state)
    except Exception as e:
        for state in states:
            state[_SCORING_ERROR] = f"{type(rubric).__name__} could not score the rollouts: {type(e).__name__}: {e}"


async def _run_call(vf_env: Any, opts: _Options, loop: LoopCall) -> None:
    """`Environment.loop`: every rollout at once; each prompt's group scored when its rollouts end."""
    groups: dict[int, list[EpisodeRecord]] = defaultdict(list)
    for record in loop.records:
        groups[record.prompt_index].append(record)

    async def group(records: list[EpisodeRecord]) -> None:
        states = await asyncio.gather(*(_one(vf_env, loop, r, opts) for r in records))
        await _score(vf_env, [s for s in states if s is not None])
        for r in records:
            if loop.on_episode is not None:
                loop.on_episode(r)

    await asyncio.gather(*(group(g) for g in groups.values()))


def _reward(name: str) -> Callable[..., Any]:
    """The rubric's reward of one episode (`environments`: its final state), with its metrics as
    extra keys (columns `reward_<name>_<metric>`); None for an episode that has no score."""
    def reward(environments: Any = None) -> Any:
        state = environments
        if not isinstance(state, Mapping):
            return None
        if state.get(_SCORING_ERROR):
            raise RuntimeError(state[_SCORING_ERROR])
        value = state.get("reward")
        if value is None:
            return None
        metrics = state.get("metrics") or {}
        return {"score": float(value), **{str(k): float(v) for k, v in metrics.items() if v is not None}}

    reward.__qualname__ = f"{name}: the rubric's reward"
    return reward


def _no_episode_env() -> Any:
    raise TypeError("a verifiers environment runs its own loop (Environment.loop): it makes no per-episode env")


def from_verifiers(vf_env: Any, *, model: str = "rlgen", sampling_args: Mapping[str, Any] | None = None,
                   parser: str = "server", timeout: float | None = None, step_timeout: Timeout = ENV_TIMEOUT,
                   name: str | None = None) -> Environment:
    """A verifiers v0 environment as an environment of `Engine.episodes` (see the module docstring).

    Args:
        vf_env: a verifiers v0 `Environment` instance (`vf.ToolEnv(...)`, a `vf.MultiTurnEnv`
            subclass, what `vf.load_environment(...)` returns). Prompts and data come from
            `Engine.episodes` (for the environment's own dataset: `ds = vf_env.get_dataset()`,
            `prompts=ds["prompt"]`, `data={"answer": ds["answer"]}`).
        model: the model name verifiers records in each state.
        sampling_args: what verifiers passes the client (default: the environment's own); rlgen
            samples with the call's options, taking only a smaller `max_tokens` from these.
        parser: how a turn's tool calls are read when the environment has tools: "server" /
            "server:<name>" (SGLang's `--tool-call-parser` names through `/parse_function_call`;
            hermes by default, which the CPU backend knows) or "hermes" (rlgen's own reading).
        timeout: seconds per rollout ("env_timeout" after; the rollout is cancelled, its request in
            flight aborted on the server); None: no limit (verifiers' own `timeout_seconds`
            still applies).
        step_timeout: seconds per environment step: each stretch of the rollout outside the model
            (`setup_state`, `env_response` with its tools, the stop conditions; "env_timeout" after,
            the rollout cancelled). Default: the call's `env_timeout` (30 s unless the call gives
            another); given here, it wins over `env_timeout`.
        name: the reward's name (default: the environment's class name).

    Raises:
        TypeError: `vf_env` is not a verifiers v0 environment instance; ValueError: a bad option.
    """
    if not looks_like_verifiers(vf_env) or not callable(getattr(vf_env, "rollout", None)):
        what = "a class: pass an instance" if isinstance(vf_env, type) else f"a {type(vf_env).__name__}"
        raise TypeError(f"from_verifiers takes a verifiers v0 Environment instance (vf.ToolEnv(...), "
                        f"vf.load_environment(...)), got {what}; verifiers v1 environments are not supported")
    if parser != "hermes" and parser not in ("server",) and not parser.startswith("server:"):
        raise ValueError(f"unknown tool-call parser {parser!r}: 'server' or 'server:<name>' (SGLang's "
                         "--tool-call-parser names), or 'hermes'")
    timeout = check_seconds("from_verifiers(timeout=)", timeout)
    seconds, given = own_timeout("from_verifiers(step_timeout=)", step_timeout)
    opts = _Options(model, sampling_args if sampling_args is not None else getattr(vf_env, "sampling_args", None),
                    parser, timeout, seconds)
    reward_name = name or type(vf_env).__name__

    def build(seconds: float | None) -> Environment:
        return Environment(_no_episode_env, "framework", _schemas(getattr(vf_env, "tool_defs", None)), seconds,
                           reward_funcs={reward_name: _reward(reward_name)},
                           loop=functools.partial(_run_call, vf_env, dataclasses.replace(opts, step_timeout=seconds)))

    env = build(seconds)
    env.retime = None if given else build
    return env
