"""SkyRL-gym text environments run unchanged through Engine.episodes (rlgen.envs.from_skyrl).

The environment is SkyRL-gym's own multi-turn GSM8K environment (`GSM8kMultiTurnEnv`, skyrl-gym
0.4.0, pinned in the dev extra), imported from the package and never changed; each prompt's `data=`
is a SkyRL dataset row without its prompt (`reward_spec`, `extra_info`).
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

import pytest
from skyrl_gym.envs.gsm8k.multi_turn_env import GSM8kMultiTurnEnv

import rlgen
from rlgen.envs import adapt, from_skyrl
from rlgen.episodes import Environment

BACKEND = os.environ.get("RLGEN_TEST_BACKEND", "cpu")
QUESTION = [{"role": "user", "content": "Natalia sold 48 clips in April and half as many in May. How many in all? "
                                         "End with '#### ANSWER'."}]


def row(truth: str = "72", **extra_info: Any) -> dict[str, Any]:
    return {"reward_spec": {"method": "rule", "ground_truth": truth}, "extra_info": extra_info}


def _run(coro: Any) -> Any:
    return asyncio.run(coro)


def _episode(data: Any, cls: type = GSM8kMultiTurnEnv) -> Any:
    async def go() -> Any:
        ep = await from_skyrl(cls).new()
        return ep, await ep.reset(data, prompt=QUESTION)

    return _run(go())


def _said(text: str) -> list[dict[str, Any]]:
    return [*QUESTION, {"role": "assistant", "content": text}]


def test_init_gives_the_prompt_and_a_step_gives_observations_reward_and_done() -> None:
    ep, reply = _episode(row("72", max_turns=3))
    assert reply.status is None and reply.prompt == QUESTION
    wrong = _run(ep.step(_said("48 + 24 = 70. #### 70")))
    assert not wrong.done and wrong.reward == pytest.approx(0.2 / 3) and wrong.messages[0]["role"] == "user"
    right = _run(ep.step(_said("#### 72")))
    assert right.done and right.reward == 1.0 and right.messages == []
    assert _run(ep.close()).status is None


def test_a_constructor_that_asserts_is_the_episodes_env_error_with_its_traceback() -> None:
    _, reply = _episode({"reward_spec": {}, "extra_info": {}})
    assert reply.status == "env_error" and "AssertionError" in reply.error
    assert "reward_spec.ground_truth is required" in reply.error and "multi_turn_env.py" in reply.traceback


def test_a_step_that_returns_something_else_is_a_bad_env_return_saying_what_is_expected() -> None:
    class Broken(GSM8kMultiTurnEnv):
        def step(self, action: str) -> Any:
            return "ok"

    ep, _ = _episode(row(), cls=Broken)
    reply = _run(ep.step(_said("#### 72")))
    assert reply.status == "bad_env_return" and "BaseTextEnvStepOutput" in reply.error


class SaysGoodbye(GSM8kMultiTurnEnv):
    """Ends at its first step with a final observation (SkyRL's generator stops on `done` alone)."""

    def step(self, action: str) -> Any:
        return {"observations": [{"role": "user", "content": "Goodbye."}], "reward": 1.0, "done": True,
                "metadata": {"said": "goodbye"}}


def test_done_with_a_final_observation_ends_the_episode() -> None:
    ep, _ = _episode(row(), cls=SaysGoodbye)
    reply = _run(ep.step(_said("#### 72")))
    assert reply.done and reply.ends and reply.status is None and reply.reward == 1.0
    assert reply.messages == [] and reply.info == {"said": "goodbye"}


def test_adapt_recognises_a_base_text_env_subclass() -> None:
    assert isinstance(adapt(GSM8kMultiTurnEnv), Environment)
    assert list(adapt(GSM8kMultiTurnEnv).reward_funcs or {}) == ["GSM8kMultiTurnEnv"]


@pytest.fixture(scope="module")
def engine(model_path: str):
    eng = rlgen.Engine(model_path, backend=BACKEND, progress=False)
    yield eng
    eng.close()


@pytest.mark.timeout(300)
def test_skyrls_gsm8k_multi_turn_env_runs_unchanged_with_per_step_and_summed_rewards(engine: rlgen.Engine) -> None:
    rows = [row("72", max_turns=3), row("5", max_turns=2), {"reward_spec": {}, "extra_info": {}}]
    res = engine.episodes([QUESTION] * 3, env=GSM8kMultiTurnEnv, data=rows, n=2, max_turns=3, max_new_tokens=24,
                          temperature=0.7, sampling_seed=0)
    df = res.df
    assert list(df.status[:4]) and set(df.status[:4]) <= {"done", "max_turns"}, df.status.tolist()
    assert set(df.status[4:]) == {"env_error"} and df.error[4].startswith("AssertionError")
    for i in range(4):  # the environment decides when it is done: at its own max_turns at the latest
        steps = df.step_rewards[i]
        assert len(steps) == df.turns[i] <= rows[i // 2]["extra_info"]["max_turns"]
        assert df.reward_GSM8kMultiTurnEnv[i] == pytest.approx(sum(steps))
        env_turns = res.turns[(res.turns.row_id == i) & (res.turns.role == "env")]
        assert env_turns.reward.tolist() == pytest.approx(steps)
    assert df.reward_GSM8kMultiTurnEnv_status[4:].tolist() == ["none", "none"]
    # token-faithful: every sampled token is in the trajectory as sampled, the observations are mask 0
    for record in res.records[:4]:
        sampled = [t for t, m in zip(record.ids, record.loss_mask) if m]
        assert sum(t["tokens"] for t in record.assistant_turns) == len(sampled)
        assert all(r == "env" for r, m in zip(record.roles[record.prompt_len:], record.loss_mask[record.prompt_len:])
                   if not m)


@pytest.mark.timeout(120)
def test_an_env_done_with_a_final_observation_ends_its_episodes_done_after_one_turn(engine: rlgen.Engine) -> None:
    res = engine.episodes([QUESTION], env=SaysGoodbye, data=[row()], n=2, max_turns=3, max_new_tokens=4)
    assert res.df.status.tolist() == ["done", "done"] and res.df.turns.tolist() == [1, 1]
    assert res.df.reward_SaysGoodbye.tolist() == [1.0, 1.0]
