"""rlgen._sampling: one schema, validated before anything is sent, mapped to SGLang's names."""

from __future__ import annotations

import pytest

from rlgen._sampling import Sampling, check_unknown_options


def test_defaults_map_to_sglang_names_with_an_explicit_temperature() -> None:
    assert Sampling().to_sglang() == {"max_new_tokens": 128, "temperature": 1.0, "top_p": 1.0, "top_k": -1, "min_p": 0.0}


def test_seed_is_sent_as_sampling_seed_and_stops_as_lists() -> None:
    params = Sampling(seed=7, stop="\n", stop_token_ids=[2], ignore_eos=True, min_new_tokens=3).to_sglang()
    assert params["sampling_seed"] == 7
    assert params["stop"] == ["\n"] and params["stop_token_ids"] == [2]
    assert params["ignore_eos"] is True and params["min_new_tokens"] == 3


@pytest.mark.parametrize("kwargs, match", [
    ({"temperature": -0.1}, "temperature must be >= 0"),
    ({"top_p": 0.0}, r"top_p must be in \(0, 1\]"),
    ({"top_p": 1.5}, r"top_p must be in \(0, 1\]"),
    ({"top_k": 0}, "top_k must be -1"),
    ({"min_p": 2.0}, r"min_p must be in \[0, 1\]"),
    ({"max_new_tokens": -1}, "max_new_tokens must be >= 0"),
    ({"max_new_tokens": 2, "min_new_tokens": 5}, "must not exceed max_new_tokens"),
    ({"repetition_penalty": 0.0}, "repetition_penalty"),
    ({"temperature": float("nan")}, "must be finite"),
])
def test_out_of_range_values_raise_value_error_naming_the_option(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        Sampling(**kwargs)


@pytest.mark.parametrize("kwargs", [{"max_new_tokens": 1.5}, {"temperature": "hot"}, {"stop": [1]}, {"seed": True}])
def test_wrong_types_raise_type_error(kwargs: dict) -> None:
    with pytest.raises(TypeError):
        Sampling(**kwargs)


def test_an_unknown_option_suggests_the_closest_name() -> None:
    with pytest.raises(TypeError, match="unknown generate\\(\\) option 'temprature'; did you mean 'temperature'"):
        check_unknown_options({"temprature": 0.5}, known=["temperature", "top_p"])


def test_an_sglang_only_option_points_to_sampling_params() -> None:
    with pytest.raises(TypeError, match="sampling_params="):
        check_unknown_options({"frequency_penalty": 0.5}, known=["temperature"])
