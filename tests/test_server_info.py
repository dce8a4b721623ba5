"""rlgen.server._info: the facts the client reads from what a server says about itself."""

from __future__ import annotations

import pytest

from rlgen.server._info import context_length, honours_seed, memory_usage, running_capacity


@pytest.mark.parametrize(("info", "capacity"), [
    ({"internal_states": [{"effective_max_running_requests_per_dp": 4096}]}, 4096),
    ({"internal_states": [{"effective_max_running_requests_per_dp": 512}] * 2}, 1024),  # --dp-size 2
    ({"internal_states": [{"num_running_reqs": 0}]}, None),  # an older server
    ({}, None),  # a router
])
def test_the_servers_running_capacity_is_read_from_its_info(info: dict, capacity: int | None) -> None:
    assert running_capacity(info) == capacity


def test_the_context_length_prefers_the_servers_setting_then_the_checkouts_config(tmp_path) -> None:
    (tmp_path / "config.json").write_text('{"max_position_embeddings": 2048}')
    assert context_length({"context_length": 512}, None, str(tmp_path)) == 512
    assert context_length({"max_req_input_len": 1000}, None, str(tmp_path)) == 2048
    assert context_length({"max_req_input_len": 1000}, None, "") == 1000


def test_seeds_are_honoured_on_the_cpu_backend_and_in_sglangs_deterministic_mode() -> None:
    assert honours_seed({"rlgen_backend": "cpu"})
    assert honours_seed({"enable_deterministic_inference": True})
    assert not honours_seed({})


def test_sglangs_own_memory_account_is_read_per_data_parallel_rank() -> None:
    rank = {"weight": 0.26, "kvcache": 27.5, "graph": {"decode": 0.4}, "token_capacity": 1281000}
    assert memory_usage({"internal_states": [{"memory_usage": rank}, {"memory_usage": rank}]}) == [rank, rank]
    assert memory_usage({"internal_states": [{"memory_usage": rank}, {"num_running_reqs": 0}]}) is None  # partial
    assert memory_usage({"internal_states": [{"num_running_reqs": 0}]}) is None  # the CPU backend
    assert memory_usage({}) is None
