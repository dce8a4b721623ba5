"""`env_timeout` through `Engine.episodes` on the CPU backend, for every kind of environment (issue 44,
items 1 and 3): None (the options schema's "no limit") runs every environment to its end, and a
small value reaches the framework adapters built from `env=` (TRL, SkyRL-gym, verl, verifiers), so a
hanging tool or step ends quickly with its timeout status instead of running for the adapter's own
default (30 s)."""

from __future__ import annotations

import os
from typing import Any

import pytest
from skyrl_gym.envs.base_text_env import BaseTextEnv, BaseTextEnvStepOutput

import rlgen
from rlgen.envs import from_skyrl, from_trl

BACKEND = os.environ.get("RLGEN_TEST_BACKEND", "cpu")
FAST = {"max_new_tokens": 4, "temperature": 0.0, "max_turns": 2}


@pytest.fixture(scope="module")
def engine(model_path: str):  # type: ignore[no-untyped-def]
    eng = rlgen.Engine(model_path, backend=BACKEND, progress=False)
    yield eng
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
