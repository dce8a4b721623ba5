"""Engine.episodes' inputs checked before anything runs, as generate()'s are (issue 34, part C): the
options through the one schema (`core._options.EpisodeOptions`), data names, timeouts, chat roles,
the chat template, environments and reward functions that are async generators, rows no longer
than what was sent, a parquet file read back as the class that wrote it, and the messages of a
contained KeyboardInterrupt and of an invented tool argument. One real CPU server for the module;
a spy on the client counts what was sent."""

from __future__ import annotations

import asyncio
import math
import os
import time
from pathlib import Path
from typing import Any

import pytest

import rlgen
from rlgen.core._options import EpisodeOptions, resolve, to_sglang
from rlgen.episodes import EnvReply, EpisodeRecord, Episodes, as_environment, call_tool, episodes_from_records, tool_env

BACKEND = os.environ.get("RLGEN_TEST_BACKEND", "cpu")
FAST = {"max_new_tokens": 4, "temperature": 0.0}


@pytest.fixture(scope="module")
def engine(model_path: str):
    eng = rlgen.Engine(model_path, backend=BACKEND, progress=False)
    yield eng
    eng.close()


@pytest.fixture
def sent(engine: rlgen.Engine, monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The payloads posted to /generate during the test."""
    posted: list[Any] = []
    post = engine._client.generate

    async def spy(payload: dict[str, Any]) -> Any:
        posted.append(payload)
        return await post(payload)

    monkeypatch.setattr(engine._client, "generate", spy)
    return posted


def once(messages: list[dict[str, Any]], data: Any) -> str:
    return "done"


def refused(engine: rlgen.Engine, sent: list[Any], error: type[Exception], match: str, prompts: Any = "Hi.",
            **kwargs: Any) -> None:
    """`engine.episodes(prompts, **kwargs)` raises `error` before anything is sent, and leaves
    `last_episodes` as it was."""
    before = engine.last_episodes
    kwargs.setdefault("env", once)
    with pytest.raises(error, match=match):
        engine.episodes(prompts, **kwargs)
    assert sent == [] and engine.last_episodes is before


# ---- 1. sampling options: refused as generate() refuses them; seed= as generate's ----------------------


@pytest.mark.timeout(120)
@pytest.mark.parametrize("options, error, match", [
    ({"temprature": 0.5}, TypeError, "unknown option 'temprature'; did you mean 'temperature'"),
    ({"frequency_penalty": 0.5}, TypeError, r"sampling_params=\{'frequency_penalty'"),
    ({"temperature": -1}, ValueError, "temperature must be >= 0"),
    ({"temperature": math.nan}, ValueError, "temperature must be finite"),
    ({"top_p": 0}, ValueError, r"top_p must be in \(0, 1\]"),
    ({"top_k": 0}, ValueError, "top_k must be -1"),
    ({"stop": 5}, TypeError, "stop must be a str or a list of them"),
    ({"ignore_eos": "yes"}, TypeError, "ignore_eos must be True or False"),
    ({"sampling_seed": 1.5}, TypeError, "sampling_seed must be an int"),
    ({"seed": 1, "sampling_seed": 2}, ValueError, "name one seed"),
    ({"n": 0}, ValueError, "n must be an int >= 1"),
    ({"max_turns": 0}, ValueError, "max_turns must be an int >= 1"),
])
def test_a_bad_sampling_option_is_refused_before_anything_is_sent_as_generate_refuses_it(
        engine: rlgen.Engine, sent: list[Any], options: dict[str, Any], error: type[Exception], match: str) -> None:
    refused(engine, sent, error, match, **options)


@pytest.mark.timeout(120)
def test_generates_own_seed_name_seeds_the_episodes_as_sampling_seed_does(engine: rlgen.Engine) -> None:
    def draw(**seed: int) -> list[tuple[int, ...]]:
        res = engine.episodes(["Say something."], env=once, n=3, max_turns=1, max_new_tokens=8, **seed)
        assert res.df.status.eq("done").all(), res.df[["status", "error"]]
        return [tuple(r.ids) for r in res.records]

    by_seed = draw(seed=7)
    assert by_seed == draw(sampling_seed=7) and len(set(by_seed)) > 1   # episode j draws with seed + j
    assert engine.last_episodes is not None and engine.last_episodes.record["seed"] == 7


def test_the_episode_options_are_generates_sampling_options_plus_their_own_with_the_same_defaults() -> None:
    opts = resolve(EpisodeOptions, {})
    assert {k: opts[k] for k in ("n", "max_turns", "max_new_tokens", "temperature", "data", "env_timeout",
                                 "chat_template", "progress", "max_in_flight", "batch_turns")} == {
        "n": 1, "max_turns": 4, "max_new_tokens": 128, "temperature": 1.0, "data": None, "env_timeout": 30.0,
        "chat_template": None, "progress": None, "max_in_flight": 256, "batch_turns": True}
    assert to_sglang(resolve(EpisodeOptions, {"seed": 3, "top_p": 0.9}))["sampling_seed"] == 3
    import inspect

    params = inspect.signature(rlgen.Engine.episodes).parameters
    assert list(params)[:3] == ["self", "prompts", "env"] and params["env"].kind is inspect.Parameter.KEYWORD_ONLY
    assert params["top_k"].default == -1 and params["max_turns"].default == 4
    assert "max_turns=4: the most assistant turns" in (rlgen.Engine.episodes.__doc__ or "")


# ---- 2. a data column named like one of rlgen's own ----------------------------------------------------


@pytest.mark.timeout(120)
@pytest.mark.parametrize("data", [{"reward": ["4"]}, [{"status": "x"}], {"turns": [1]}])
def test_a_data_name_of_rlgens_own_columns_is_refused_before_any_episode_runs(
        engine: rlgen.Engine, sent: list[Any], data: Any) -> None:
    refused(engine, sent, ValueError, "would replace rlgen's own columns", data=data)


# ---- 3. timeouts: what add_rewards refuses ---------------------------------------------------------------


@pytest.mark.timeout(120)
@pytest.mark.parametrize("timeout", [0, -1.0, math.nan, "5"])
def test_a_timeout_that_is_not_a_positive_number_of_seconds_is_refused(
        engine: rlgen.Engine, sent: list[Any], timeout: Any) -> None:
    match = "must be a positive number of seconds or None"
    refused(engine, sent, ValueError, f"env_timeout {match}", env_timeout=timeout)
    with pytest.raises(ValueError, match=rf"tool_env\(timeout=\) {match}"):
        tool_env([add], timeout=timeout)
    with pytest.raises(ValueError, match=match):
        as_environment(once, timeout=timeout)


# ---- 4. chat roles; 5. the chat template; 7. flags ------------------------------------------------------


@pytest.mark.timeout(120)
def test_an_unknown_chat_role_is_refused_with_the_closest_one(engine: rlgen.Engine, sent: list[Any]) -> None:
    refused(engine, sent, ValueError, r"unknown chat role 'wizard'", prompts=[{"role": "wizard", "content": "Hi."}])
    refused(engine, sent, ValueError, r"unknown chat role 'usr'; did you mean 'user'",
            prompts=[[{"role": "usr", "content": "Hi."}], "Hello."])


@pytest.mark.timeout(120)
def test_a_chat_template_that_does_not_compile_is_refused_before_anything_is_sent(
        engine: rlgen.Engine, sent: list[Any]) -> None:
    refused(engine, sent, ValueError, "does not compile", chat_template="{% for m in messages %}{{ m.content }}")
    refused(engine, sent, TypeError, "chat_template must be a Jinja chat template", chat_template="  ")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("options", [{"batch_turns": "no"}, {"progress": "yes"}, {"batch_turns": 0}])
def test_flags_take_true_or_false_only_batch_turns_as_progress(
        engine: rlgen.Engine, sent: list[Any], options: dict[str, Any]) -> None:
    refused(engine, sent, TypeError, "must be True or False", **options)


# ---- 6. async generator functions --------------------------------------------------------------------------


async def agen_env(messages: list[dict[str, Any]], data: Any) -> Any:
    yield "Go on."


class AgenStep:
    async def step(self, messages: list[dict[str, Any]]) -> Any:
        yield "Go on."


async def agen_reward(completion: str) -> Any:
    yield 1.0


@pytest.mark.timeout(120)
def test_async_generator_functions_are_refused_as_environments(engine: rlgen.Engine, sent: list[Any]) -> None:
    refused(engine, sent, TypeError, "env function agen_env is an async generator function", env=agen_env)
    refused(engine, sent, TypeError, "AgenStep.step is an async generator function", env=AgenStep)


def test_async_generator_functions_are_refused_as_reward_functions() -> None:
    res = episodes_from_records([_record()], pad_token_id=0)
    with pytest.raises(TypeError, match="reward function agen_reward is an async generator function"):
        res.add_rewards(agen_reward, mode="inline")
    with pytest.raises(TypeError, match="async generator"):
        res.add_rewards(agen_reward, style="row", mode="thread")


# ---- 8. a context_limit episode keeps only what was sent -----------------------------------------------


@pytest.mark.timeout(180)
def test_a_context_limit_episode_keeps_only_what_was_sent_not_the_reply_that_would_not_fit(
        engine: rlgen.Engine) -> None:
    limit = engine.context_length
    assert limit is not None

    def flood(messages: list[dict[str, Any]], data: Any) -> str:
        return "word " * 12_000

    short = engine.episodes(["Hi.", "Hello."], env=once, **FAST)
    res = engine.episodes(["Hi.", "Hello."], env=flood, **FAST)
    # what was sent and sampled: the prompt, the first answer and its EOS, as in an episode that ended there
    assert [r.ids for r in res.records] == [r.ids for r in short.records]
    for r in res.records:
        assert r.status == "context_limit" and "was not sent" in (r.error or "") and str(limit) in (r.error or "")
        assert [m["role"] for m in r.messages] == ["user", "assistant"]     # the reply is not in the messages
        said = [t for t in r.turns if t["role"] == "env"]
        assert len(said) == 1 and said[0]["tokens"] == 0 and said[0]["text"].startswith("word word")
    assert res.tensors()["input_ids"].shape == short.tensors()["input_ids"].shape


# ---- 9. parquet: the class that wrote the file ---------------------------------------------------------


def _record() -> EpisodeRecord:
    turns = [{"turn": 0, "role": "assistant", "text": "4", "tokens": 2, "latency_s": 0.1, "rlgen_s": 0.0}]
    return EpisodeRecord(0, 0, messages=[{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}],
                         ids=[5, 6, 7, 2], prompt_len=2, loss_mask=[0, 0, 1, 1], logprobs=[0.0, 0.0, -0.5, -0.1],
                         turn_ids=[0, 0, 0, 0], roles=["prompt", "prompt", "assistant", "assistant"], status="done",
                         turns=turns, n_prompt_messages=1)


def test_an_episodes_file_reads_back_as_episodes_through_rollouts_from_parquet(tmp_path: Path) -> None:
    from rlgen.rollouts import rollouts_from_responses

    episodes_from_records([_record()], pad_token_id=0).to_parquet(tmp_path / "ep.parquet")
    back = rlgen.Rollouts.from_parquet(tmp_path / "ep.parquet")
    assert type(back) is Episodes and back.turns.role.tolist() == ["assistant"]
    assert back.episode(0).ids == [5, 6, 7, 2] and type(Episodes.from_parquet(tmp_path / "ep.parquet")) is Episodes
    plain = rollouts_from_responses([{"text": "x", "output_ids": [3], "meta_info": {"finish_reason": "stop"}}],
                                    prompt_ids=[[1, 2]], prompt_texts=[None], n=1, pad_token_id=0)
    plain.to_parquet(tmp_path / "plain.parquet")
    assert type(rlgen.Rollouts.from_parquet(tmp_path / "plain.parquet")) is rlgen.Rollouts
    with pytest.raises(TypeError, match=r"holds a Rollouts, not Episodes: read it with Rollouts.from_parquet"):
        Episodes.from_parquet(tmp_path / "plain.parquet")


# ---- 10. the messages of a contained KeyboardInterrupt and of an invented tool argument ----------------


def test_an_environment_raising_keyboard_interrupt_says_so_in_its_error() -> None:
    def interrupts(messages: list[dict[str, Any]]) -> str:
        raise KeyboardInterrupt

    async def step() -> EnvReply:
        ep = await as_environment(interrupts, timeout=5).new()
        assert not isinstance(ep, EnvReply)
        return await ep.step([{"role": "assistant", "content": "hi"}])

    reply = asyncio.run(step())
    assert reply.status == "env_error" and reply.error is not None
    assert reply.error.startswith("KeyboardInterrupt: raised inside the call"), reply.error


def add(a: int, b: int) -> int:
    """Add two numbers.

    Args:
        a: the first.
        b: the second.
    """
    return a + b


def test_an_invented_argument_name_is_named_in_bad_arguments() -> None:
    result = call_tool(add, {"a": 1, "c": 2})
    assert result.status == "bad_arguments" and "'c'" in (result.error or ""), result.error
    assert "unexpected keyword argument 'c'" in (result.error or "") and "'a', 'b'" in (result.error or "")


# ---- 11. tool_env's timeout reaches the tool call ----------------------------------------------------------


def sleepy() -> str:
    """Sleep two seconds."""
    time.sleep(2)
    return "rested"


def test_tool_env_timeout_is_the_tool_calls_timeout() -> None:
    env = tool_env([sleepy], timeout=0.3)
    turn = [{"role": "assistant", "content": '<tool_call>{"name": "sleepy", "arguments": {}}</tool_call>'}]
    t0 = time.perf_counter()
    reply = asyncio.run(env.step(turn))
    assert reply.status == "tool_timeout" and "0.3 s" in (reply.error or ""), reply
    assert time.perf_counter() - t0 < 1.5


# ---- 12. a class with reset and no step: not taken for a TRL class (issue 44, item 5) -----------------------


class StepMisspelled:
    def reset(self, data: Any) -> None:
        return None

    def stpe(self, messages: list[dict[str, Any]]) -> str:
        return "done"


class StepForgotten:
    def reset(self, data: Any) -> None:
        return None


class ResetOnly:
    def reset(self) -> None:
        return None

    def setp(self, messages: list[dict[str, Any]]) -> str:
        return "done"


@pytest.mark.timeout(120)
@pytest.mark.parametrize("env", [StepMisspelled, StepForgotten, ResetOnly])
def test_a_class_with_reset_but_no_step_is_refused_saying_it_needs_step_not_run_as_a_trl_class(
        engine: rlgen.Engine, sent: list[Any], env: type) -> None:
    refused(engine, sent, TypeError, rf"env class {env.__name__} has no step\(messages\) method.*TRL", env=env)


# ---- 13. no tools, a tool without a docstring, a template without EOS (issue 44, item 7) --------------------


def undocumented(a: int, b: int) -> int:
    return a + b


NO_EOS_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}\n{% endfor %}"
                   "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("env", [[], {}, ()], ids=["list", "dict", "tuple"])
def test_an_empty_tool_list_is_refused_before_anything_is_sent(
        engine: rlgen.Engine, sent: list[Any], env: Any) -> None:
    refused(engine, sent, ValueError, r"no tools: pass at least one tool function", env=env)
    with pytest.raises(ValueError, match=r"tool_env has no tools"):
        tool_env(env)


@pytest.mark.timeout(120)
def test_a_tool_without_a_docstring_is_refused_saying_to_add_one(engine: rlgen.Engine, sent: list[Any]) -> None:
    match = r"tool 'undocumented' has no docstring.*add a docstring"
    refused(engine, sent, TypeError, match, env=[undocumented])
    refused(engine, sent, TypeError, match, env={"undocumented": undocumented})
    with pytest.raises(TypeError, match=match):
        tool_env([add, undocumented])


@pytest.mark.timeout(120)
def test_a_chat_template_without_eos_after_an_assistant_message_is_refused_saying_what_to_do(
        engine: rlgen.Engine, sent: list[Any]) -> None:
    refused(engine, sent, ValueError, r"puts no EOS token .* after an assistant message.*eos_token",
            chat_template=NO_EOS_TEMPLATE)
