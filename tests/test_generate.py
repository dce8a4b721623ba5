"""rlgen._generate: what the generate core sends, and what it aborts when it is cancelled.

Uses a stand-in client (no server): the end-to-end paths are in test_engine.py.
"""

from __future__ import annotations

import asyncio

import pytest

from rlgen._generate import GenerateJob, run_generate


class HangingClient:
    """Accepts /generate and never answers; records aborts."""

    def __init__(self) -> None:
        self.sent: list[dict] = []
        self.aborted: list[str] | None = None

    async def generate(self, payload: dict) -> list:
        self.sent.append(payload)
        await asyncio.sleep(3600)
        return []

    async def abort(self, rids: list[str] | None = None) -> None:
        self.aborted = rids


def test_cancelling_aborts_every_rid_still_in_flight_on_the_server() -> None:
    client = HangingClient()
    job = GenerateJob(prompt_ids=[[1, 2], [3], [4, 5]], sampling={"max_new_tokens": 4}, chunk_size=2)

    async def main() -> None:
        task = asyncio.ensure_future(run_generate(client, job))  # type: ignore[arg-type]
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    sent = [rid for payload in client.sent for rid in payload["rid"]]
    assert len(sent) == 3 and client.aborted == sent
    assert job.results == [None, None, None]  # nothing finished, nothing invented


def test_n_samples_with_a_seed_get_one_seed_each() -> None:
    client = HangingClient()
    job = GenerateJob(prompt_ids=[[1, 2]], sampling={"max_new_tokens": 4, "sampling_seed": 7}, n=3)

    async def main() -> None:
        task = asyncio.ensure_future(run_generate(client, job))  # type: ignore[arg-type]
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    (payload,) = client.sent
    assert payload["input_ids"] == [[1, 2]] * 3
    assert [p["sampling_seed"] for p in payload["sampling_params"]] == [7, 8, 9]
