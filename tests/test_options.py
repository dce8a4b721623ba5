"""rlgen.core._options: one schema for generate()'s options, checked before anything is sent."""

from __future__ import annotations

import inspect

import pytest

import rlgen
from rlgen.core._options import (
    EpisodeOptions,
    GenerateOptions,
    RewardOptions,
    SamplingOptions,
    StreamOptions,
    check_seconds,
    defaults,
    resolve,
    to_sglang,
)


def test_defaults_map_to_sglang_names_with_an_explicit_temperature() -> None:
    params = to_sglang(resolve(GenerateOptions, {}))
    assert params == {"max_new_tokens": 128, "temperature": 1.0, "top_p": 1.0, "top_k": -1, "min_p": 0.0}


def test_seed_is_sent_as_sampling_seed_and_stops_as_lists() -> None:
    opts = resolve(SamplingOptions, {"seed": 7, "stop": "\n", "stop_token_ids": [2], "ignore_eos": True,
                                     "min_new_tokens": 3})
    params = to_sglang(opts)
    assert params["sampling_seed"] == 7
    assert params["stop"] == ["\n"] and params["stop_token_ids"] == [2]
    assert params["ignore_eos"] is True and params["min_new_tokens"] == 3


def test_sampling_params_are_sent_as_given_and_may_not_repeat_an_option() -> None:
    assert to_sglang(resolve(StreamOptions, {"sampling_params": {"frequency_penalty": 0.5}}))["frequency_penalty"] == 0.5
    with pytest.raises(ValueError, match=r"\['temperature'\] given both as options and in sampling_params"):
        resolve(StreamOptions, {"sampling_params": {"temperature": 0.5}})


@pytest.mark.parametrize("kwargs, match", [
    ({"temperature": -0.1}, r"temperature must be >= 0 \(0 = greedy\), got -0.1"),
    ({"top_p": 0.0}, r"top_p must be in \(0, 1\]"),
    ({"top_p": 1.5}, r"top_p must be in \(0, 1\]"),
    ({"top_k": 0}, "top_k must be -1"),
    ({"min_p": 2.0}, r"min_p must be in \[0, 1\]"),
    ({"max_new_tokens": -1}, "max_new_tokens must be an int >= 0"),
    ({"max_new_tokens": 2, "min_new_tokens": 5}, "must not exceed max_new_tokens"),
    ({"repetition_penalty": 0.0}, "repetition_penalty"),
    ({"temperature": float("nan")}, "must be finite"),
    ({"n": 0}, "n must be an int >= 1"),
    ({"max_in_flight": 0}, "max_in_flight must be an int >= 1 or None"),
])
def test_out_of_range_values_raise_value_error_naming_the_option(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        resolve(GenerateOptions, kwargs)


@pytest.mark.parametrize("kwargs", [
    {"max_new_tokens": 1.5}, {"temperature": "hot"}, {"stop": [1]}, {"seed": True}, {"logprobs": 1},
    {"sampling_params": "temperature=0"},
])
def test_wrong_types_raise_type_error(kwargs: dict) -> None:
    with pytest.raises(TypeError):
        resolve(GenerateOptions, kwargs)


def test_an_unknown_option_suggests_the_closest_name() -> None:
    with pytest.raises(TypeError, match="unknown option 'temprature'; did you mean 'temperature'"):
        resolve(GenerateOptions, {"temprature": 0.5})


def test_an_sglang_only_option_points_to_sampling_params() -> None:
    with pytest.raises(TypeError, match="sampling_params="):
        resolve(GenerateOptions, {"frequency_penalty": 0.5})


def test_stream_does_not_take_the_batch_options_of_generate() -> None:
    with pytest.raises(TypeError, match="unknown option 'n'"):
        resolve(StreamOptions, {"n": 2})


@pytest.mark.parametrize("method, schema", [
    (rlgen.Rollouts.add_rewards, RewardOptions),
    (rlgen.Engine.generate, GenerateOptions),
    (rlgen.Engine.agenerate, GenerateOptions),
    (rlgen.Engine.stream, StreamOptions),
])
def test_each_entry_point_shows_every_option_of_its_schema_with_its_default(method, schema) -> None:
    params = inspect.signature(method).parameters
    shown = {name: p.default for name, p in params.items() if p.kind is inspect.Parameter.KEYWORD_ONLY}
    assert shown == defaults(schema)
    assert all(params[name].annotation is not inspect.Parameter.empty for name in shown)
    for name in shown:  # help() documents each one
        assert f"\n    {name}=" in (method.__doc__ or "")


def test_the_options_are_declared_once_and_shared_by_the_three_schemas() -> None:
    sampling, stream, generate = (set(defaults(s)) for s in (SamplingOptions, StreamOptions, GenerateOptions))
    assert sampling < stream < generate
    assert "max_new_tokens" in sampling and "n" in generate - stream


def test_episodes_shows_every_option_of_its_schema_after_env() -> None:
    params = inspect.signature(rlgen.Engine.episodes).parameters
    keyword = [name for name, p in params.items() if p.kind is inspect.Parameter.KEYWORD_ONLY]
    assert keyword[0] == "env" and params["env"].default is inspect.Parameter.empty
    assert {name: params[name].default for name in keyword[1:]} == defaults(EpisodeOptions)
    for name in keyword[1:]:
        assert f"\n    {name}=" in (rlgen.Engine.episodes.__doc__ or "")


def test_the_episode_options_share_the_sampling_declarations_rather_than_copy_them() -> None:
    from typing import get_type_hints

    sampling, episode, stream = (get_type_hints(s, include_extras=True) for s in
                                 (SamplingOptions, EpisodeOptions, StreamOptions))
    assert set(sampling) < set(episode) and "adapter" not in episode and "chunk_size" not in episode
    def declared(hint: object) -> tuple:
        option = hint.__metadata__[0]  # type: ignore[attr-defined]
        return option.default, option.doc, option.sglang, option.always_sent

    for name in (*sampling, "sampling_params"):  # inherited (or one alias): the same declaration
        assert declared(episode[name]) == declared(sampling.get(name) or stream[name])


def test_sampling_seed_is_seed_under_sglangs_name_and_the_two_may_not_disagree() -> None:
    assert to_sglang(resolve(EpisodeOptions, {"sampling_seed": 4}))["sampling_seed"] == 4
    assert resolve(EpisodeOptions, {"sampling_seed": 4, "seed": 4})["seed"] == 4
    with pytest.raises(ValueError, match="seed=1 and sampling_seed=2 name one seed"):
        resolve(EpisodeOptions, {"seed": 1, "sampling_seed": 2})
    with pytest.raises(TypeError, match="unknown option 'sampling_seed'"):
        resolve(GenerateOptions, {"sampling_seed": 4})  # generate's name stays seed=


@pytest.mark.parametrize("value", [0, -1, float("nan"), float("inf"), "5", True])
def test_a_timeout_is_a_positive_number_of_seconds_or_none(value: object) -> None:
    assert check_seconds("t", None) is None and check_seconds("t", 2) == 2.0
    with pytest.raises(ValueError, match="t must be a positive number of seconds or None"):
        check_seconds("t", value)
