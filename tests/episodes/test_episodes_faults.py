"""Bad input and faults in Engine.episodes on a real CPU server: each fault ends only its own
episode, with its own status and what went wrong; the other episodes go on; nothing crashes.

Covered elsewhere (not repeated here), in test_episodes_runner.py: an int returned
(`test_context_limit_and_bad_returns`), a sync function env raising and "max_turns"
(`test_env_error_ends_only_its_episodes_and_max_turns`), Ctrl-C
(`test_ctrl_c_keeps_finished_episodes_aborts_the_request_in_flight_on_the_server_and_cancels_the_rest`);
the statuses of one step or one tool call without a server in test_episodes_env.py and
test_episodes_tools.py.
"""

from __future__ import annotations

import asyncio
import os
import sys
import threading
import time
from typing import Any

import pytest

import rlgen
from rlgen import episodes
from rlgen.episodes import EnvReply, as_environment

BACKEND = os.environ.get("RLGEN_TEST_BACKEND", "cpu")
FAST = {"max_new_tokens": 2, "temperature": 0.0}


@pytest.fixture(scope="module")
def engine(model_path: str):
    eng = rlgen.Engine(model_path, backend=BACKEND, progress=False)
    yield eng
    eng.close()


def statuses(res: episodes.EpisodesResult) -> dict[Any, str]:
    return {r.data: r.status for r in res.records}


# ---- the environment returns the wrong thing, raises, or hangs ----------------------------------------


class ByData:
    """A reset/step environment whose fault is named by the episode's data."""

    def reset(self, data: str) -> Any:
        self.data = data
        return 42 if data == "reset returns an int" else None

    def step(self, messages: list[dict[str, Any]]) -> Any:
        return {"dict without role or content": {"answer": 4},
                "message without content": {"role": "user"},
                "list of str": ["a", "b"]}.get(self.data, "done")


@pytest.mark.timeout(120)
def test_an_environment_returning_the_wrong_type_ends_with_bad_env_return_saying_what_to_return(
        engine: rlgen.Engine) -> None:
    data = ["reset returns an int", "dict without role or content", "message without content", "list of str", "ok"]
    res = engine.episodes(["Hi."] * len(data), env=ByData, data=data, max_turns=1, **FAST)
    assert statuses(res) == {**dict.fromkeys(data[:-1], "bad_env_return"), "ok": "done"}
    by = {r.data: r for r in res.records}
    assert by["reset returns an int"].assistant_turns == []  # nothing was sent for it
    assert "ByData.reset returned int 42" in (by["reset returns an int"].error or "")
    for d in data[:-1]:
        error = by[d].error or ""
        # what came back, and the forms an environment may return
        assert "expected" in error and '{"role": "user" | "tool" | "system", "content": str}' in error, (d, error)
    assert "{'answer': 4}" in (by["dict without role or content"].error or "")
    assert "at item 0" in (by["list of str"].error or "")
    checked = res.check_drift()  # nothing sampled, nothing to compare: no drift cause, left out of the summary
    assert checked.df.drift.tolist()[0] is None and checked.df.drift.notna()[1:].all()
    assert int(checked.drift_summary().loc["all", "episodes"]) == len(data) - 1


class Raises:
    def reset(self, data: str) -> None:
        self.data = data
        if data == "reset raises":
            raise KeyError("no such task")

    def step(self, messages: list[dict[str, Any]]) -> str:
        if self.data == "step calls sys.exit":
            sys.exit(3)  # e.g. a command-line tool's main() called by the environment
        return "done"


class RaisesAsync:
    async def reset(self, data: str) -> None:
        self.data = data

    async def step(self, messages: list[dict[str, Any]]) -> str:
        await asyncio.sleep(0)
        if self.data == "async step raises":
            raise ValueError("bad answer format")
        if self.data == "async step calls sys.exit":
            raise SystemExit("stop")
        if self.data == "async step raises CancelledError":
            raise asyncio.CancelledError()  # e.g. awaiting a task that someone else cancelled
        return "done"


@pytest.mark.timeout(120)
def test_an_environment_that_raises_ends_with_env_error_keeping_the_exception_and_traceback(
        engine: rlgen.Engine) -> None:
    # SystemExit out of a step went through asyncio to the loop running every episode.
    data = ["reset raises", "step calls sys.exit", "ok"]
    res = engine.episodes(["Hi."] * 3, env=Raises, data=data, max_turns=1, **FAST)
    assert statuses(res) == {"reset raises": "env_error", "step calls sys.exit": "env_error", "ok": "done"}
    by = {r.data: r for r in res.records}
    assert by["reset raises"].error == "KeyError: 'no such task'" and by["reset raises"].assistant_turns == []
    assert "Traceback" in (by["reset raises"].traceback or "") and "no such task" in (by["reset raises"].traceback or "")
    assert by["step calls sys.exit"].error == "SystemExit: 3" and "sys.exit(3)" in (by["step calls sys.exit"].traceback or "")
    data = ["async step raises", "async step calls sys.exit", "async step raises CancelledError", "ok"]
    res = engine.episodes(["Hi."] * 4, env=RaisesAsync, data=data, max_turns=1, **FAST)
    assert statuses(res) == {**dict.fromkeys(data[:3], "env_error"), "ok": "done"}
    by = {r.data: r for r in res.records}
    assert by["async step raises"].error == "ValueError: bad answer format"
    assert "bad answer format" in (by["async step raises"].traceback or "")
    assert by["async step calls sys.exit"].error == "SystemExit: stop"
    assert (by["async step raises CancelledError"].error or "").startswith("CancelledError")
    # the engine's loop lived through it
    assert statuses(engine.episodes(["Hi."], env=lambda m, d: "done", data=["after"], **FAST)) == {"after": "done"}


def thread_pool_size() -> int:
    """The default size of a ThreadPoolExecutor (asyncio's default executor)."""
    cpus = os.process_cpu_count() if hasattr(os, "process_cpu_count") else os.cpu_count()
    return min(32, (cpus or 1) + 4)


@pytest.mark.timeout(120)
def test_a_hung_environment_ends_with_env_timeout_and_neither_the_call_nor_later_steps_wait_for_it(
        engine: rlgen.Engine) -> None:
    release = threading.Event()

    def sync_env(messages: list[dict[str, Any]], data: str) -> str:
        if data.startswith("hangs"):
            release.wait(60)
        return "done"

    async def async_env(messages: list[dict[str, Any]], data: str) -> str:
        if data == "hangs":
            await asyncio.sleep(60)
        if data == "ignores cancellation":
            end = time.monotonic() + 20
            while time.monotonic() < end and not release.is_set():
                try:
                    await asyncio.sleep(0.05)
                except asyncio.CancelledError:
                    pass
        return "done"

    try:
        # more hung threads than asyncio's default executor has: a step waiting behind them would time out
        hung = [f"hangs {i}" for i in range(thread_pool_size() + 1)]
        t0 = time.monotonic()
        res = engine.episodes(["Hi."] * (len(hung) + 1), env=sync_env, data=[*hung, "ok"], max_turns=1,
                              env_timeout=1.0, **FAST)
        assert statuses(res) == {**dict.fromkeys(hung, "env_timeout"), "ok": "done"}
        assert time.monotonic() - t0 < 15
        error = res.records[0].error or ""
        assert "did not finish within 1 s" in error and "env_timeout" in error
        assert 0.9 < res.records[0].env_seconds < 3
        # the hung threads still run; a later call's steps do not queue behind them
        res = engine.episodes(["Hi."] * 2, env=sync_env, data=["ok", "also ok"], max_turns=1, env_timeout=1.0, **FAST)
        assert statuses(res) == {"ok": "done", "also ok": "done"}

        t0 = time.monotonic()
        data = ["hangs", "ignores cancellation", "ok"]
        res = engine.episodes(["Hi."] * 3, env=async_env, data=data, max_turns=1, env_timeout=1.0, **FAST)
        assert statuses(res) == {"hangs": "env_timeout", "ignores cancellation": "env_timeout", "ok": "done"}
        assert time.monotonic() - t0 < 12
    finally:
        release.set()


def test_a_hung_sync_step_or_constructor_is_not_waited_for_when_its_event_loop_ends() -> None:
    # asyncio.run() ends by joining its default executor's threads: a hung step held it until it returned.
    def hangs(messages: list[dict[str, Any]], data: Any) -> str:
        time.sleep(4)
        return "done"

    made = 0

    def factory() -> Any:
        nonlocal made
        made += 1
        time.sleep(4)
        return ByData()

    async def step(env: Any) -> EnvReply:
        ep = await as_environment(env, timeout=0.3).new()
        if isinstance(ep, EnvReply):
            return ep
        await ep.reset(None)
        return await ep.step([{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}])

    for env in (hangs, factory):
        t0 = time.monotonic()
        reply = asyncio.run(step(env))
        assert reply.status == "env_timeout" and "0.3 s" in (reply.error or ""), reply
        assert time.monotonic() - t0 < 2, env
    assert made == 1


# ---- tools and tool calls -----------------------------------------------------------------------------


def add(a: int, b: int) -> int:
    """Add two numbers.

    Args:
        a: the first.
        b: the second.
    """
    return a + b


def tags(word: str) -> Any:
    """The tags of a word.

    Args:
        word: the word.
    """
    return {"set": {word}, "deep": _nested(5000)}[word]


def quit_tool(code: int) -> int:
    """Quit.

    Args:
        code: the exit code.
    """
    raise SystemExit(code)


def _nested(depth: int) -> list[Any]:
    out: list[Any] = []
    for _ in range(depth):
        out = [out]
    return out


def call(name: str, arguments: str) -> str:
    return f'<tool_call>{{"name": "{name}", "arguments": {arguments}}}</tool_call>'


# What each episode's assistant turns say, by its prompt: the small model seldom writes a tool call,
# so the tool environment reads the script's turn in place of the sampled one (which stays in the ids).
SCRIPTS = {
    "bad json": ["<tool_call>{not json</tool_call>"],
    "unknown tool": [call("mul", '{"a": 2, "b": 3}')],
    "missing argument": [call("add", '{"a": 2}')],
    "unknown argument": [call("add", '{"a": 2, "b": 3, "c": 4}')],
    "arguments not an object": [call("add", "[2, 3]")],
    "a set": [call("tags", '{"word": "set"}')],
    "too deep for json": [call("tags", '{"word": "deep"}')],
    "tool exits": [call("quit_tool", '{"code": 1}')],
    "ok": [call("add", '{"a": 2, "b": 3}'), "It is 5."],
}


class Scripted(episodes.ToolEnv):
    async def step(self, messages: list[dict[str, Any]]) -> EnvReply:
        turn = sum(m["role"] == "assistant" for m in messages) - 1
        script = SCRIPTS[messages[0]["content"]][turn]
        return await super().step([*messages[:-1], {"role": "assistant", "content": script}])


@pytest.mark.timeout(120)
def test_malformed_tool_calls_and_unserialisable_results_end_with_their_own_status(engine: rlgen.Engine) -> None:
    res = engine.episodes(list(SCRIPTS), env=Scripted([add, tags, quit_tool], timeout=5), max_turns=2, **FAST)
    got = {r.messages[0]["content"]: r for r in res.records}
    assert {p: r.status for p, r in got.items()} == {
        "bad json": "bad_tool_call", "unknown tool": "bad_tool_call", "missing argument": "bad_arguments",
        "unknown argument": "bad_arguments", "arguments not an object": "bad_tool_call",
        "a set": "not_serialisable", "too deep for json": "not_serialisable", "tool exits": "tool_error",
        "ok": "done"}
    assert "malformed tool call: bad JSON" in (got["bad json"].error or "")
    assert "no tool is named 'mul'" in (got["unknown tool"].error or "")
    assert "missing a required argument: 'b'" in (got["missing argument"].error or "")
    assert "unexpected keyword argument 'c'" in (got["unknown argument"].error or "")
    assert "not an object" in (got["arguments not an object"].error or "")
    assert "tool 'tags'" in (got["a set"].error or "") and "set is not JSON serializable" in (got["a set"].error or "")
    assert "RecursionError" in (got["too deep for json"].error or "")
    assert got["tool exits"].error == "tool 'quit_tool': SystemExit: 1"
    for prompt, r in got.items():
        assert len(r.assistant_turns) == len(SCRIPTS[prompt]), prompt  # ended at the fault, not before
        assert (r.error is None) == (prompt == "ok"), prompt
    assert got["ok"].messages[2] == {"role": "tool", "name": "add", "content": "5"}
    calls = res.turns.dropna(subset=["calls"])
    by_prompt = {list(SCRIPTS)[p]: c for p, c in zip(calls.prompt_index, calls.calls) if c}
    assert by_prompt["ok"] == [{"name": "add", "arguments": {"a": 2, "b": 3}, "status": "ok", "error": None,
                                "result": "5"}]
    assert by_prompt["a set"][0]["status"] == "not_serialisable"
    df = res.df.set_index(res.df.prompt_index.map(lambda i: list(SCRIPTS)[i]))
    assert df.loc["ok", "tool_calls"] == 1 and df.loc["ok", "tool_calls_failed"] == 0
    assert df.loc["a set", "tool_calls_failed"] == 1 and df.loc["unknown tool", "tool_calls_failed"] == 1


@pytest.mark.timeout(120)
def test_with_on_tool_error_reply_an_unserialisable_result_is_told_to_the_model_and_the_episode_goes_on(
        engine: rlgen.Engine) -> None:
    scripts = {"a set": [call("tags", '{"word": "set"}'), "Sorry."]}

    class Replying(episodes.ToolEnv):
        async def step(self, messages: list[dict[str, Any]]) -> EnvReply:
            turn = sum(m["role"] == "assistant" for m in messages) - 1
            return await super().step([*messages[:-1], {"role": "assistant", "content": scripts["a set"][turn]}])

    res = engine.episodes(["a set"], env=Replying([tags], on_tool_error="reply"), max_turns=2, **FAST)
    (r,) = res.records
    assert r.status == "done" and len(r.assistant_turns) == 2
    assert r.messages[2]["role"] == "tool" and "set is not JSON serializable" in r.messages[2]["content"]
    assert res.df.loc[0, "tool_calls_failed"] == 1


@pytest.mark.timeout(120)
def test_the_servers_own_parser_reads_the_same_calls_as_the_built_in_one(engine: rlgen.Engine) -> None:
    prompts = ["ok", "bad json", "unknown tool"]
    built_in = engine.episodes(prompts, env=Scripted([add, tags, quit_tool], timeout=5), max_turns=2, **FAST)
    server = engine.episodes(prompts, env=Scripted([add, tags, quit_tool], timeout=5, parser="server"), max_turns=2,
                             **FAST)
    assert server.df.status.tolist() == built_in.df.status.tolist() == ["done", "bad_tool_call", "bad_tool_call"]
    assert server.records[0].messages[2] == {"role": "tool", "name": "add", "content": "5"}
    assert "parser found a tool call it could not read" in (server.records[1].error or "")
    alone = episodes.tool_env([add], parser="server:hermes")
    reply = asyncio.run(alone.step([{"role": "assistant", "content": call("add", '{"a": 1, "b": 2}')}]))
    assert reply.status == "env_error" and "no server to ask" in (reply.error or "")
    with pytest.raises(ValueError, match="server:<name>"):
        episodes.tool_env([add], parser="servers")
