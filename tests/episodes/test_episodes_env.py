"""rlgen.episodes environments, no server: what a user passes as env= normalised, returns validated,
failures as per-episode statuses, and the built-in tool_env on a fake assistant turn."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from rlgen.episodes import EnvReply, as_environment, tool_env
from rlgen.episodes._env import normalise_return


def run(coro: Any) -> Any:
    return asyncio.run(coro)


async def _step(env: Any, messages: list[dict[str, Any]], data: Any = None, timeout: float = 5.0) -> EnvReply:
    ep = await as_environment(env, timeout=timeout).new()
    assert not isinstance(ep, EnvReply), ep
    first = await ep.reset(data)
    assert first.status is None, first
    return await ep.step(messages)


CHAT = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]


def test_returns_normalised() -> None:
    assert normalise_return("again").messages == [{"role": "user", "content": "again"}]
    assert normalise_return(None).done and normalise_return("done").done
    assert normalise_return({"role": "tool", "content": "4", "name": "add"}).messages == [
        {"role": "tool", "content": "4", "name": "add"}]
    two = normalise_return([{"role": "system", "content": "s"}, {"role": "user", "content": "u"}])
    assert [m["role"] for m in two.messages] == ["system", "user"] and not two.ends


@pytest.mark.parametrize("value, words", [
    (42, "int 42"),
    ({"role": "assistant", "content": "x"}, "role 'assistant'"),
    ({"role": "user", "content": 3}, "content is int"),
    ([], "empty list"),
    (["x"], "at item 0"),
])
def test_bad_returns_say_what_came_back(value: Any, words: str) -> None:
    reply = normalise_return(value)
    assert reply.status == "bad_env_return" and reply.ends
    assert words in (reply.error or ""), reply.error


def test_function_env_sync_async_with_and_without_data() -> None:
    seen: list[Any] = []

    def two(messages: list[dict[str, Any]], data: Any) -> str:
        seen.append(data)
        return f"{len(messages)} {data}"

    async def one(messages: list[dict[str, Any]]) -> str:
        return "done"

    assert run(_step(two, CHAT, data={"a": 1})).messages == [{"role": "user", "content": "2 {'a': 1}"}]
    assert seen == [{"a": 1}]
    assert run(_step(one, CHAT)).done


def test_function_env_failures_are_statuses() -> None:
    def boom(messages: Any, data: Any) -> str:
        raise RuntimeError("kaput")

    reply = run(_step(boom, CHAT))
    assert reply.status == "env_error" and "RuntimeError: kaput" in (reply.error or "")
    assert "kaput" in (reply.traceback or "") and "Traceback" in (reply.traceback or "")

    async def hangs(messages: Any, data: Any) -> str:
        await asyncio.sleep(30)
        return "done"

    t0 = time.perf_counter()
    reply = run(_step(hangs, CHAT, timeout=0.2))
    assert reply.status == "env_timeout" and time.perf_counter() - t0 < 5

    def sync_hangs(messages: Any, data: Any) -> str:
        time.sleep(0.6)
        return "done"

    assert run(_step(sync_hangs, CHAT, timeout=0.1)).status == "env_timeout"
    assert run(_step(lambda m, d: 3.5, CHAT)).status == "bad_env_return"


class Counter:
    """A reset/step environment: says "again" twice, then done."""

    def __init__(self) -> None:
        self.k = 0

    def reset(self, data: Any) -> Any:
        self.k = 0
        return {"role": "system", "content": f"task {data}"} if data is not None else None

    def step(self, messages: list[dict[str, Any]]) -> Any:
        self.k += 1
        return "again" if self.k <= 2 else "done"


def test_class_env_one_instance_per_episode() -> None:
    environment = as_environment(Counter)

    async def go() -> list[Any]:
        a, b = await environment.new(), await environment.new()
        assert not isinstance(a, EnvReply) and not isinstance(b, EnvReply)
        assert (await a.reset(7)).messages == [{"role": "system", "content": "task 7"}]
        assert (await b.reset(None)).messages == []
        return [(await a.step(CHAT)).done, (await a.step(CHAT)).done, (await a.step(CHAT)).done,
                (await b.step(CHAT)).done]

    assert run(go()) == [False, False, True, False]  # b counts on its own


def test_factory_and_refusals() -> None:
    assert as_environment(lambda: Counter()).kind == "factory"
    with pytest.raises(TypeError, match="pass the class"):
        as_environment(Counter())
    with pytest.raises(TypeError, match="env must be"):
        as_environment(42)

    class NoStep:
        pass

    with pytest.raises(TypeError, match="no step"):
        as_environment(NoStep)

    def bad_factory() -> int:
        return 3

    made = run(as_environment(bad_factory).new())
    assert isinstance(made, EnvReply) and made.status == "bad_env_return"

    class Raises:
        def __init__(self) -> None:
            raise ValueError("no")

        def step(self, messages: Any) -> None:
            return None

    made = run(as_environment(Raises).new())
    assert isinstance(made, EnvReply) and made.status == "env_error" and "ValueError: no" in (made.error or "")


def add(a: int, b: int) -> int:
    """Add two numbers.

    Args:
        a: the first.
        b: the second.
    """
    return a + b


def fails(x: int) -> int:
    """Fail.

    Args:
        x: anything.
    """
    raise RuntimeError("tool broke")


def turn(text: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": "q"}, {"role": "assistant", "content": text}]


def test_tool_env_runs_calls() -> None:
    env = tool_env([add, fails])
    assert as_environment(env).tools == env.schemas and len(env.schemas) == 2
    reply = run(_step(env, turn('Sure. <tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>')))
    assert reply.messages == [{"role": "tool", "name": "add", "content": "5"}]
    assert reply.tool_calls == 1 and reply.tool_calls_failed == 0 and not reply.ends
    assert run(_step(env, turn("The answer is 5."))).done  # no call: done


def test_tool_env_failures() -> None:
    env = tool_env([add, fails])
    bad = run(_step(env, turn('<tool_call>{"name": "add", "arguments": {"a": 2</tool_call>')))
    assert bad.status == "bad_tool_call" and "malformed tool call" in (bad.error or "")
    unknown = run(_step(env, turn('<tool_call>{"name": "mul", "arguments": {}}</tool_call>')))
    assert unknown.status == "bad_tool_call" and "'mul'" in (unknown.error or "")
    broke = run(_step(env, turn('<tool_call>{"name": "fails", "arguments": {"x": 1}}</tool_call>')))
    assert broke.status == "tool_error" and "tool broke" in (broke.error or "") and broke.tool_calls_failed == 1
    args = run(_step(env, turn('<tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call>')))
    assert args.status == "bad_arguments"
    replying = tool_env([add, fails], on_tool_error="reply")
    goes_on = run(_step(replying, turn('<tool_call>{"name": "fails", "arguments": {"x": 1}}</tool_call>')))
    assert goes_on.status is None and goes_on.tool_calls_failed == 1
    assert goes_on.messages[0]["role"] == "tool" and "tool broke" in goes_on.messages[0]["content"]
    # a plain list of functions is a tool environment too
    assert as_environment([add]).kind == "tools"


def test_on_tool_error_reply_keeps_the_failing_calls_traceback_in_its_call_record() -> None:
    replying = tool_env([add, fails], on_tool_error="reply")
    text = '<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>' \
           '<tool_call>{"name": "fails", "arguments": {"x": 1}}</tool_call>'
    reply = run(_step(replying, turn(text)))
    assert reply.status is None and reply.traceback is None  # the episode goes on: not its failure
    ok, failed = reply.calls
    assert "traceback" not in ok  # only a failed call carries one
    assert failed["status"] == "tool_error" and 'raise RuntimeError("tool broke")' in failed["traceback"]
    assert failed["traceback"].startswith("Traceback") and "rlgen" not in failed["traceback"].split("\n")[1]
