"""TRL environment classes run unchanged through Engine.episodes (rlgen.envs.from_trl).

The environment is TRL's own documented example (`IncrementEnv`, trl 1.16.0's
docs/source/grpo_trainer.md "Environments"), written as its users write it; TRL itself (pinned in
the dev extra) supplies what rlgen is compared with: the tool schema TRL hands the chat template
(transformers' `get_json_schema` of the bound method) and the tokens TRL appends after a tool call
(`GRPOTrainer._get_tool_suffix_ids`, TRL's own code, run on a stand-in trainer).
"""

from __future__ import annotations

import asyncio
import os
import random
from types import SimpleNamespace
from typing import Any

import pytest

import rlgen
from rlgen.envs import adapt, from_trl
from rlgen.episodes import Environment

BACKEND = os.environ.get("RLGEN_TEST_BACKEND", "cpu")


class IncrementEnv:  # TRL's documented example, unchanged
    def reset(self, **kwargs) -> str | None:
        self.counter = 0
        self.target = random.randint(1, 6)
        return f"Increment the counter by {self.target}."

    def get_reward(self) -> float:
        return float(self.counter == self.target)

    def increment(self, step: int) -> int:
        """Increment the internal counter.

        Args:
            step: Value to add to the counter.

        Returns:
            The new counter value.
        """
        self.counter += step
        return self.counter


class StartEnv:
    """A TRL environment whose row gives the start: `start` may come as a str (the planted bug)."""

    def reset(self, **kwargs: Any) -> str | None:
        self.counter = kwargs["start"]
        self.target = kwargs["target"]
        return f"The counter is {self.counter}. Increment it to {self.target}."

    def get_reward(self) -> float:
        return float(self.counter == self.target)

    def increment(self, step: int) -> int:
        """Increment the internal counter.

        Args:
            step: Value to add to the counter.
        """
        self.counter += step  # the bug: a str start from the row raises TypeError here
        return self.counter


SYSTEM = ('You can call the tool increment. To use it, write <tool_call>{"name": "increment", '
          '"arguments": {"step": ...}}</tool_call> and wait for the result.')
DEMO = [{"role": "user", "content": "Increment the counter by 2."},
        {"role": "assistant", "content": '<tool_call>{"name": "increment", "arguments": {"step": 2}}</tool_call>'},
        {"role": "tool", "name": "increment", "content": "2"},
        {"role": "assistant", "content": "Done."}]
CHAT = [{"role": "system", "content": SYSTEM}, *DEMO, {"role": "user", "content": ""}]
SAMPLING = {"n": 2, "max_turns": 3, "max_new_tokens": 40, "temperature": 0.7, "stop": ["</tool_call>"],
            "sampling_seed": 0}
CALL = '<tool_call>{"name": "increment", "arguments": {"step": 3}}</tool_call>'


@pytest.fixture(scope="module")
def engine(model_path: str):
    eng = rlgen.Engine(model_path, backend=BACKEND, progress=False)
    yield eng
    eng.close()


def _episode(env: Environment, data: Any = None, prompt: list[dict[str, Any]] | None = None) -> Any:
    async def go() -> Any:
        ep = await env.new()
        reply = await ep.reset(data, prompt=prompt if prompt is not None else [{"role": "user", "content": "Go. "}])
        return ep, reply

    return asyncio.run(go())


def _step(ep: Any, text: str) -> Any:
    return asyncio.run(ep.step([{"role": "user", "content": "x"}, {"role": "assistant", "content": text}]))


# ---- the adapter, step by step, without a server ---------------------------------------------------------


def test_reset_appends_its_text_to_the_last_user_message_and_gets_the_row_with_its_prompt() -> None:
    seen: dict[str, Any] = {}

    class Seeing(IncrementEnv):
        def reset(self, **kwargs: Any) -> str | None:
            seen.update(kwargs)
            return super().reset(**kwargs)

    ep, reply = _episode(from_trl(Seeing), data={"level": 2})
    assert reply.status is None
    assert reply.prompt == [{"role": "user", "content": f"Go. Increment the counter by {ep.obj.target}."}]
    assert seen == {"level": 2, "prompt": [{"role": "user", "content": "Go. "}]}


def test_a_tool_call_runs_the_episode_instance_method_and_answers_with_str_as_trl_does() -> None:
    ep, _ = _episode(from_trl(IncrementEnv))
    reply = _step(ep, CALL)
    assert reply.messages == [{"role": "tool", "name": "increment", "content": "3"}]
    assert ep.obj.counter == 3 and not reply.done
    assert _step(ep, "Done.").done  # a turn without a call ends the episode


def test_a_tool_answer_is_the_str_of_what_it_returned_not_its_json() -> None:
    class Reporting(IncrementEnv):
        def report(self, verbose: bool) -> dict:
            """Report the counter.

            Args:
                verbose: Whether to say more.
            """
            return {"counter": self.counter, "done": verbose}

    ep, _ = _episode(from_trl(Reporting))
    reply = _step(ep, '<tool_call>{"name": "report", "arguments": {"verbose": true}}</tool_call>')
    assert reply.messages[0]["content"] == "{'counter': 0, 'done': True}"


def test_the_tool_schemas_are_what_trl_hands_the_chat_template() -> None:
    from transformers.utils import get_json_schema

    env = from_trl(IncrementEnv)
    assert env.tools == [get_json_schema(IncrementEnv().increment)]


def test_get_reward_is_a_reward_named_after_the_class_and_reward_functions_get_environments() -> None:
    def counted(environments: list[Any], **kwargs: Any) -> list[float]:
        return [float(e.counter) for e in environments]

    env = from_trl(IncrementEnv, reward_funcs=[counted])
    assert list(env.reward_funcs or {}) == ["IncrementEnv", "counted"]
    a, b = IncrementEnv(), IncrementEnv()
    a.counter, a.target, b.counter, b.target = 2, 2, 1, 5
    assert env.reward_funcs["IncrementEnv"](environments=[a, b], prompts=[]) == [1.0, 0.0]


def test_a_failing_tool_ends_the_episode_with_its_traceback_or_answers_as_trl_with_reply() -> None:
    ep, _ = _episode(from_trl(StartEnv), data={"start": "1", "target": 4})
    reply = _step(ep, CALL)
    assert reply.status == "tool_error" and "TypeError" in reply.error
    assert "self.counter += step" in reply.traceback
    assert "rlgen" not in reply.traceback.split("\n")[1], "the traceback starts at rlgen's runner, not the tool"
    ep, _ = _episode(from_trl(StartEnv, on_tool_error="reply"), data={"start": "1", "target": 4})
    reply = _step(ep, CALL)
    assert reply.status is None and reply.tool_calls_failed == 1
    assert reply.messages == [{"role": "tool", "name": "increment",
                               "content": str({"error": 'can only concatenate str (not "int") to str'})}]


def test_on_tool_error_reply_answers_as_trl_and_keeps_the_traceback_in_the_call_record() -> None:
    ep, _ = _episode(from_trl(StartEnv, on_tool_error="reply"), data={"start": "1", "target": 4})
    reply = _step(ep, CALL)
    assert reply.status is None and reply.traceback is None
    (call,) = reply.calls
    assert call["status"] == "tool_error" and "self.counter += step" in call["traceback"]


def test_a_reset_that_raises_is_the_episodes_env_error_with_its_traceback() -> None:
    _, reply = _episode(from_trl(StartEnv), data={"target": 4})  # no start
    assert reply.status == "env_error" and "KeyError" in reply.error and "kwargs[\"start\"]" in reply.traceback


def test_a_call_inside_think_is_not_run_and_a_malformed_call_is_kept_with_its_parser() -> None:
    ep, _ = _episode(from_trl(IncrementEnv))
    reply = _step(ep, f"<think>maybe {CALL}</think>The counter is fine.")
    assert reply.done and ep.obj.counter == 0 and reply.info == {"calls_in_think": 1}
    reply = _step(ep, '<tool_call>{"name": "increment", "arguments": {"step": 3}</tool_call>')
    assert reply.status == "bad_tool_call" and ep.obj.counter == 0
    assert reply.calls[0]["parser"] == "hermes" and "bad JSON" in reply.calls[0]["error"]


def test_a_dict_of_factories_routes_each_row_on_its_environment_value() -> None:
    class Other(IncrementEnv):
        def double(self) -> int:
            """Double the counter."""
            self.counter *= 2
            return self.counter

    env = from_trl({"inc": IncrementEnv, "other": Other})
    assert [t["function"]["name"] for t in env.tools or []] == ["increment", "double"]
    ep, reply = _episode(env, data={"environment": "other"})
    assert type(ep.obj) is Other and [t["function"]["name"] for t in ep.tool_schemas] == ["double", "increment"]
    _, reply = _episode(env, data={"environment": "missing"})
    assert reply.status == "env_error" and "'missing'" in reply.error


class Explicit:
    """A TRL class whose reset names its row's columns, with no **kwargs: a key it does not take
    (the routing key `environment`) would be a TypeError."""

    def reset(self, prompt: list, start: int, target: int) -> str:
        self.seen = {"prompt": prompt, "start": start, "target": target}
        self.counter, self.target = start, target
        return f" Count from {start} to {target}."

    def increment(self, step: int) -> int:
        """Increment the counter.

        Args:
            step: Value to add to the counter.
        """
        self.counter += step
        return self.counter


@pytest.mark.parametrize("factory", [Explicit, {"counting": Explicit, "other": IncrementEnv}], ids=["class", "dict"])
def test_a_reset_with_explicit_keyword_arguments_gets_the_row_without_its_environment_key(factory: Any) -> None:
    env = adapt(factory)
    assert isinstance(env, Environment)  # recognised as TRL's: reset takes the prompt by keyword
    ep, reply = _episode(env, data={"environment": "counting", "start": 1, "target": 3})
    assert reply.status is None, reply.error
    assert ep.obj.seen == {"prompt": [{"role": "user", "content": "Go. "}], "start": 1, "target": 3}
    assert reply.prompt == [{"role": "user", "content": "Go.  Count from 1 to 3."}]
    assert _step(ep, CALL).messages == [{"role": "tool", "name": "increment", "content": "4"}]


def test_adapt_takes_a_trl_class_as_it_is_and_leaves_rlgen_environments_alone() -> None:
    assert isinstance(adapt(IncrementEnv), Environment)

    class Own:
        def reset(self, data: Any) -> None: ...

        def step(self, messages: list[Any]) -> str:
            return "done"

    assert adapt(Own) is Own


def test_a_reset_that_cannot_take_the_rows_prompt_is_refused_saying_how_trl_calls_it() -> None:
    class Positional:
        def reset(self, data: Any) -> None: ...

        def get_reward(self) -> float:
            return 0.0

    assert adapt(Positional) is Positional  # not taken for a TRL class: as_environment refuses it, no step
    with pytest.raises(TypeError, match=r"Positional.reset cannot take the row's prompt.*reset\(self, \*\*kwargs\)"):
        from_trl(Positional)


def test_a_tool_without_a_docstring_argument_is_refused_before_anything_runs() -> None:
    class Sloppy(IncrementEnv):
        def decrement(self, step: int) -> int:
            return step

    with pytest.raises(TypeError, match=r"Sloppy.decrement is not a tool TRL can offer.*no docstring"):
        from_trl(Sloppy)


# ---- on a real server ----------------------------------------------------------------------------------------


def _trl_suffix_ids(tok: Any, tool_messages: list[dict[str, Any]]) -> list[int]:
    """The ids TRL appends after a tool call: its own `_get_tool_suffix_ids` on a stand-in trainer."""
    from trl.trainer.grpo_trainer import GRPOTrainer

    stand_in = SimpleNamespace(processing_class=tok, chat_template=None, chat_template_kwargs={}, _is_vlm=False,
                               _tokenizer=tok)
    return list(GRPOTrainer._get_tool_suffix_ids(stand_in, tool_messages))


@pytest.mark.timeout(300)
def test_trls_increment_env_runs_unchanged_token_for_token_as_trl_would_train_it(engine: rlgen.Engine,
                                                                                  tok: Any) -> None:
    res = engine.episodes([CHAT] * 4, env=IncrementEnv, **SAMPLING)
    df = res.df
    assert set(df.status) <= {"done", "max_turns", "bad_tool_call", "bad_arguments"}, df.status.tolist()
    assert (df.tool_calls > 0).sum() >= 4 and {"reward_IncrementEnv", "reward", "advantage"} <= set(df.columns)
    compared = 0
    for i, record in enumerate(res.records):
        env = res.meta_info[i]["_env"]
        assert df.reward_IncrementEnv[i] == float(env.counter == env.target)
        # token-faithful: after each sampled turn, the trajectory holds the tokens TRL's own code
        # appends for that turn's tool answers (after the turn's EOS, which a stop string leaves out)
        answers: list[list[dict[str, Any]]] = []
        for message in record.messages[record.n_prompt_messages:]:
            if message["role"] == "assistant":
                answers.append([])
            else:
                answers[-1].append(message)
        for k, tool_messages in enumerate(answers):
            if not tool_messages:
                continue
            env_ids = [t for t, r, j in zip(record.ids, record.roles, record.turn_ids) if r == "env" and j == k]
            env_ids = env_ids[1:] if env_ids[:1] == [tok.eos_token_id] else env_ids
            assert env_ids == _trl_suffix_ids(tok, tool_messages)
            compared += 1
    assert compared >= 4
    # where a trainer would re-render the messages, the drift inspector says where the ids part
    drifts = res.check_drift().df.drift
    assert set(drifts.dropna()) <= {"same", "retokenized", "boundary"} and drifts.notna().all(), drifts.tolist()


@pytest.mark.timeout(120)
def test_a_failed_reset_leaves_nothing_to_score_and_a_failing_get_reward_is_its_rows_status(
        engine: rlgen.Engine) -> None:
    class Picky(StartEnv):
        def get_reward(self) -> float:
            if self.target == 2:
                raise ValueError("picky")
            return super().get_reward()

    rows = [{"start": 0, "target": 2}, {"start": 0, "target": 3}, {"target": 1}]
    res = engine.episodes([CHAT] * 3, env=Picky, data=rows, max_new_tokens=2)
    assert res.df.status.tolist()[2] == "env_error" and res.df.status.tolist()[0] != "env_error"
    assert res.df.reward_Picky_status.tolist() == ["error", "ok", "none"]
    assert "picky" in res.df.reward_Picky_error[0] and res.df.reward_Picky[1] == 0.0
    failed = engine.episodes([CHAT] * 2, env=StartEnv, data=[{"target": 1}, {"target": 2}], max_new_tokens=2)
    assert failed.df.status.tolist() == ["env_error", "env_error"]
    assert failed.df.reward_StartEnv_status.tolist() == ["none", "none"]
