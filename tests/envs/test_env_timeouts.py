"""`env_timeout` through `Engine.episodes` on the CPU backend, for every kind of environment (issue 44,
items 1 and 3): None (the options schema's "no limit") runs every environment to its end, and a
small value reaches the framework adapters (TRL, SkyRL-gym, verl, verifiers), whether `env=` is the
framework's own object or an adapter made without its own `timeout=`, so a hanging tool or step ends
quickly with its timeout status instead of running for the adapter's default (30 s; no limit for
verifiers); an adapter's own `timeout=` wins over it. Where a test needs the model to call a tool,
the server's answers are scripted (the Engine's client answers every turn with one call)."""

from __future__ import annotations

import asyncio
import functools
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from skyrl_gym.envs.base_text_env import BaseTextEnv, BaseTextEnvStepOutput

import rlgen
from rlgen.envs import from_skyrl, from_trl, from_verifiers, from_verl

BACKEND = os.environ.get("RLGEN_TEST_BACKEND", "cpu")
FAST = {"max_new_tokens": 4, "temperature": 0.0, "max_turns": 2}
CALL = '<tool_call>{"name": "wait", "arguments": {"seconds": 40}}</tool_call>'
RELEASE = threading.Event()  # set at the module's end: the hung threads return then
QUICK = 8.0  # seconds: far under the adapters' 30 s default, far over env_timeout=1 plus the call's own work
VERL_DIR = Path(__file__).resolve().parents[1] / "data" / "verl-0.9.1-tools"


@pytest.fixture(scope="module")
def engine(model_path: str):  # type: ignore[no-untyped-def]
    eng = rlgen.Engine(model_path, backend=BACKEND, progress=False)
    yield eng
    RELEASE.set()
    eng.close()


def again(messages: list[dict[str, Any]], data: Any) -> str:
    return "Again."


class Again:
    def reset(self, data: Any) -> None:
        return None

    def step(self, messages: list[dict[str, Any]]) -> str:
        return "Again."


class Counter:
    """A TRL environment_factory class, as TRL's docs write one."""

    def reset(self, **kwargs: Any) -> str:
        self.counter = 0
        return " Count."

    def get_reward(self) -> float:
        return float(self.counter)

    def increment(self, step: int) -> int:
        """Increment the counter.

        Args:
            step: Value to add to the counter.
        """
        self.counter += step
        return self.counter


class Observing(BaseTextEnv):
    """A SkyRL-gym text environment: one observation per step, done at its second."""

    def __init__(self, env_config: Any = None, extras: Any = None) -> None:
        super().__init__()

    def step(self, action: str) -> BaseTextEnvStepOutput:
        self.turns += 1
        return BaseTextEnvStepOutput(observations=[{"role": "user", "content": "Again."}], reward=0.5,
                                     done=self.turns >= 2, metadata={})


@pytest.mark.timeout(180)
@pytest.mark.parametrize("env", [again, Again, Counter, Observing, from_trl(Counter, timeout=None),
                                 from_skyrl(Observing, timeout=None)],
                         ids=["function", "class", "trl", "skyrl", "from_trl", "from_skyrl"])
def test_env_timeout_none_means_no_limit_and_runs_every_kind_of_environment_to_its_end(
        engine: rlgen.Engine, env: Any) -> None:
    res = engine.episodes(["Count to three."], env=env, n=2, env_timeout=None, **FAST)
    assert set(res.df.status) <= {"done", "max_turns"}, res.df[["status", "error"]].to_dict("records")
    assert res.df.error.isna().all()


# ---- item 3: a small env_timeout reaches every framework's adapter --------------------------------------


def hang(seconds: float) -> None:
    RELEASE.wait(seconds)


class Hanging:
    """A TRL environment_factory class whose tool hangs."""

    def reset(self, **kwargs: Any) -> None:
        return None

    def wait(self, seconds: int) -> str:
        """Wait a while.

        Args:
            seconds: How long to wait.
        """
        hang(seconds)
        return "waited"


class HangingStep(BaseTextEnv):
    """A SkyRL-gym text environment whose step hangs."""

    def __init__(self, env_config: Any = None, extras: Any = None) -> None:
        super().__init__()

    def step(self, action: str) -> BaseTextEnvStepOutput:
        hang(40)
        return BaseTextEnvStepOutput(observations=[], reward=0.0, done=True, metadata={})


@functools.cache
def _verl_tools() -> list[Any]:
    """A verl `@function_tool` that hangs (verl 0.9.1's own decorator, from the pinned copy; verl's
    registry takes a name once)."""
    sys.path.insert(0, str(VERL_DIR))
    try:
        from verl.tools.function_tool import function_tool
    finally:
        sys.path.remove(str(VERL_DIR))

    def wait(seconds: int) -> str:
        """Wait a while.

        Args:
            seconds: How long to wait.
        """
        hang(seconds)
        return "waited"

    return [function_tool(wait)]


def _verifiers_env() -> Any:
    """A verifiers v0 MultiTurnEnv whose env_response hangs (an `async def`: cancellable)."""
    import verifiers as vf
    from datasets import Dataset

    class Stalling(vf.MultiTurnEnv):
        async def env_response(self, messages: Any, state: Any, **kwargs: Any) -> Any:
            await asyncio.sleep(40)
            return [{"role": "user", "content": "Go on."}]

    dataset = Dataset.from_list([{"prompt": [{"role": "user", "content": "Hi."}], "answer": "x"}])
    return Stalling(dataset=dataset, rubric=vf.Rubric(funcs=[]), max_turns=3)


@pytest.fixture
def calls_a_tool(engine: rlgen.Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    """The server answers every turn with one call to the tool `wait` (then EOS)."""
    tok = engine.tokenizer

    async def generate(payload: dict[str, Any]) -> dict[str, Any]:
        ids = [*tok.encode(CALL, add_special_tokens=False), tok.eos_token_id]
        return {"text": CALL, "output_ids": ids, "meta_info": {
            "id": payload["rid"], "finish_reason": {"type": "stop"}, "prompt_tokens": len(payload["input_ids"]),
            "output_token_logprobs": [[-0.5, i, None] for i in ids]}}

    monkeypatch.setattr(engine._client, "generate", generate)


def _timed(engine: rlgen.Engine, env: Any, **options: Any) -> tuple[Any, float]:
    t0 = time.perf_counter()
    res = engine.episodes(["Wait."], env=env, batch_turns=False, progress=False, **{**FAST, **options})
    return res.df.iloc[0], time.perf_counter() - t0


@pytest.mark.timeout(180)
@pytest.mark.usefixtures("calls_a_tool")
@pytest.mark.parametrize("framework", ["trl", "skyrl", "verl", "verifiers"])
@pytest.mark.parametrize("built", [False, True], ids=["as_it_is", "through_its_adapter"])
def test_a_small_env_timeout_ends_a_hanging_tool_or_step_of_every_framework_quickly(
        engine: rlgen.Engine, framework: str, built: bool) -> None:
    raw = {"trl": lambda: Hanging, "skyrl": lambda: HangingStep, "verl": _verl_tools,
           "verifiers": _verifiers_env}[framework]()
    adapter = {"trl": from_trl, "skyrl": from_skyrl, "verl": from_verl, "verifiers": from_verifiers}[framework]
    env = adapter(raw) if built else raw
    row, took = _timed(engine, env, env_timeout=1)
    expected = "tool_timeout" if framework in ("trl", "verl") else "env_timeout"
    assert row.status == expected and "within 1 s" in row.error, (row.status, row.error)
    assert took < QUICK, f"{framework}: the episode took {took:.1f} s; env_timeout=1 did not reach the adapter"


@pytest.mark.timeout(180)
@pytest.mark.usefixtures("calls_a_tool")
def test_an_adapters_own_timeout_wins_over_env_timeout(engine: rlgen.Engine) -> None:
    row, took = _timed(engine, from_trl(Hanging, timeout=1), env_timeout=60)
    assert row.status == "tool_timeout" and "within 1 s" in row.error and took < QUICK


@pytest.mark.timeout(180)
@pytest.mark.usefixtures("calls_a_tool")
def test_a_small_env_timeout_reaches_the_tools_of_a_tool_list_and_of_tool_env(engine: rlgen.Engine) -> None:
    def wait(seconds: int) -> str:
        """Wait a while.

        Args:
            seconds: How long to wait.
        """
        hang(seconds)
        return "waited"

    for env in ([wait], rlgen.episodes.tool_env([wait])):
        row, took = _timed(engine, env, env_timeout=1)
        assert row.status == "tool_timeout" and took < QUICK, (row.status, row.error, took)
    row, took = _timed(engine, rlgen.episodes.tool_env([wait], timeout=1), env_timeout=60)
    assert row.status == "tool_timeout" and took < QUICK  # tool_env's own timeout= wins
