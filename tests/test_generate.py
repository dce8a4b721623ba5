"""rlgen.client._generate: what the generate core sends, and what it aborts when it is cancelled.

Uses a stand-in client (no server): the end-to-end paths are in test_engine.py.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from rlgen.client._generate import FALLBACK_IN_FLIGHT, GenerateJob, chunks_to_fill, run_generate


class HangingClient:
    """Accepts /generate and never answers; records aborts."""

    def __init__(self) -> None:
        self.sent: list[dict] = []
        self.aborted: list[str] | None = None

    async def generate(self, payload: dict) -> list:
        self.sent.append(payload)
        await asyncio.sleep(3600)
        return []

    async def abort(self, rids: list[str]) -> None:
        self.aborted = rids


def _start_then_cancel(client: HangingClient, job: GenerateJob) -> None:
    """Run `job` until its requests are sent, then cancel it as Ctrl-C does."""

    async def main() -> None:
        task = asyncio.ensure_future(run_generate(client, job))  # type: ignore[arg-type]
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())


def make_job(**fields: Any) -> GenerateJob:
    """A job with these fields; the rest as a plain generate() call would send them."""
    return GenerateJob(**{"n": 1, "logprobs": True, "top_logprobs": 0, "stream": False, "chunk_size": 256,
                          "max_in_flight": FALLBACK_IN_FLIGHT, **fields})


def test_cancelling_aborts_every_rid_still_in_flight_on_the_server() -> None:
    client = HangingClient()
    job = make_job(prompt_ids=[[1, 2], [3], [4, 5]], sampling={"max_new_tokens": 4}, chunk_size=2)
    _start_then_cancel(client, job)
    sent = [rid for payload in client.sent for rid in payload["rid"]]
    assert len(sent) == 3 and client.aborted == sent
    assert job.results == [None, None, None]  # nothing finished, nothing invented


def test_n_samples_go_as_n_copies_of_each_prompt_with_their_own_rids_and_are_aborted_by_them() -> None:
    # Not SGLang's `n`: for a batch with n > 1 it prefills the prompts one at a time, awaiting each.
    client = HangingClient()
    job = make_job(prompt_ids=[[1, 2], [3]], sampling={"max_new_tokens": 4}, n=2)
    _start_then_cancel(client, job)
    (payload,) = client.sent
    assert payload["input_ids"] == [[1, 2], [1, 2], [3], [3]]
    assert "n" not in payload["sampling_params"]
    assert len(set(payload["rid"])) == 4 and client.aborted == payload["rid"]


def test_n_samples_with_a_seed_get_one_seed_each() -> None:
    client = HangingClient()
    job = make_job(prompt_ids=[[1, 2]], sampling={"max_new_tokens": 4, "sampling_seed": 7}, n=3)
    _start_then_cancel(client, job)
    (payload,) = client.sent
    assert payload["input_ids"] == [[1, 2]] * 3
    assert [p["sampling_seed"] for p in payload["sampling_params"]] == [7, 8, 9]


class CountingClient:
    """Answers each /generate after a short wait; records how many were in flight at most."""

    def __init__(self) -> None:
        self.in_flight = 0
        self.most = 0

    async def generate(self, payload: dict) -> Any:
        self.in_flight += 1
        self.most = max(self.most, self.in_flight)
        await asyncio.sleep(0.01)
        self.in_flight -= 1
        return self.answer(payload)

    def answer(self, payload: dict) -> Any:
        n = payload["sampling_params"].get("n", 1)
        return [{"text": "", "output_ids": [], "meta_info": {}} for _ in payload["input_ids"] for _ in range(n)]


@pytest.mark.parametrize(("capacity", "chunk_size", "n", "chunks"), [
    (4096, 256, 1, 17),  # 4096 prompts (16 chunks) all go at once, as in one request
    (4096, 256, 4, 5),   # a chunk is 1024 samples
    (4096, 300, 1, 15),  # a partial chunk counts as a chunk
    (64, 256, 1, 2),     # one chunk fills the server; one more waits
    (None, 256, 1, FALLBACK_IN_FLIGHT),  # the server does not say (a router)
])
def test_the_default_in_flight_fills_the_servers_running_batch_plus_one_chunk(
        capacity: int | None, chunk_size: int, n: int, chunks: int) -> None:
    assert chunks_to_fill(capacity, chunk_size, n) == chunks


@pytest.mark.parametrize("max_in_flight", [1, 3, 8])
def test_max_in_flight_bounds_the_requests_sent_at_once(max_in_flight: int) -> None:
    client = CountingClient()
    job = make_job(prompt_ids=[[i] for i in range(40)], sampling={"max_new_tokens": 1}, n=2,
                      chunk_size=4, max_in_flight=max_in_flight)
    asyncio.run(run_generate(client, job))  # type: ignore[arg-type]
    assert client.most == max_in_flight  # 10 chunks: the bound is reached, never passed
    assert all(r is not None for r in job.results) and len(job.results) == 80


class RouterStandIn(HangingClient):
    """A client for a router: one prompt per request."""

    one_prompt_per_request = True


def test_behind_a_router_each_prompt_is_one_request_with_one_rid_and_scalar_fields() -> None:
    client = RouterStandIn()
    job = make_job(prompt_ids=[[1, 2], [3]], sampling={"max_new_tokens": 4}, n=2,
                   per_prompt={"logprob_start_len": [1, 0]})
    _start_then_cancel(client, job)
    first, second = sorted(client.sent, key=lambda p: len(p["input_ids"][0]), reverse=True)
    assert first["input_ids"] == [[1, 2], [1, 2]] and second["input_ids"] == [[3], [3]]
    assert isinstance(first["rid"], str) and first["sampling_params"] == {"max_new_tokens": 4}
    assert first["logprob_start_len"] == 1 and second["logprob_start_len"] == 0
    # SGLang names a batch's items <rid>_<i>: those are what an abort must name
    assert sorted(client.aborted or []) == sorted(f"{p['rid']}_{i}" for p in client.sent for i in range(2))


def test_behind_a_router_one_sample_goes_with_its_rid_and_a_seeded_prompt_as_one_request_per_sample() -> None:
    client = RouterStandIn()
    job = make_job(prompt_ids=[[1, 2]], sampling={"max_new_tokens": 4, "sampling_seed": 7}, n=3)
    _start_then_cancel(client, job)
    assert [p["input_ids"] for p in client.sent] == [[1, 2]] * 3
    assert [p["sampling_params"]["sampling_seed"] for p in client.sent] == [7, 8, 9]  # as batched: seed + j
    assert sorted(client.aborted or []) == sorted(p["rid"] for p in client.sent)


class SlowRouterStandIn(CountingClient):
    """CountingClient for a router: single-prompt requests, answered in their shape."""

    one_prompt_per_request = True

    def answer(self, payload: dict) -> Any:
        one = {"text": "", "output_ids": [], "meta_info": {"id": payload["rid"]}}
        return one if isinstance(payload["input_ids"][0], int) else [one] * len(payload["input_ids"])


def test_behind_a_router_as_many_prompts_are_in_flight_as_the_chunks_would_hold() -> None:
    client = SlowRouterStandIn()
    job = make_job(prompt_ids=[[i] for i in range(40)], sampling={"max_new_tokens": 1}, n=2,
                   chunk_size=4, max_in_flight=3)
    asyncio.run(run_generate(client, job))  # type: ignore[arg-type]
    assert client.most == 12  # 3 chunks of 4 prompts: 12 one-prompt requests
    assert all(r is not None for r in job.results) and len(job.results) == 80
