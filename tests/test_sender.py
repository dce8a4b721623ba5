"""rlgen.client._sender: the one sender: rids in flight, batched single sequences, streamed answers."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from rlgen.client._sender import Sender, generate_body, new_rid
from rlgen.core._errors import RequestError


def entry(rid: str, out: list[int], *, done: bool = True, total: int | None = None) -> dict[str, Any]:
    return {"text": "", "output_ids": out, "meta_info": {
        "id": rid, "finish_reason": {"type": "length"} if done else None,
        "completion_tokens": len(out) if total is None else total,
        "output_token_logprobs": [[-1.0, t, None] for t in out]}}


class Streaming:
    """Streams each batch: per item a first chunk, then, in `order`, a last chunk after `delays[i]`."""

    one_prompt_per_request = False

    def __init__(self, delays: dict[int, float] | None = None, *, incremental: bool = False,
                 drop: int | None = None) -> None:
        self.delays, self.incremental, self.drop = delays or {}, incremental, drop
        self.bodies: list[dict[str, Any]] = []

    async def generate_stream(self, body: dict[str, Any]) -> Any:
        self.bodies.append(body)
        n = len(body["input_ids"])
        for i in range(n):
            yield {"index": i, **entry(body["rid"][i], [7], done=False, total=1)}
        for i in sorted(range(n), key=lambda i: self.delays.get(i, 0.0)):
            if i == self.drop:
                continue
            await asyncio.sleep(self.delays.get(i, 0.0))
            out = [7, 8, 9, i]
            yield {"index": i, **entry(body["rid"][i], out[1:] if self.incremental else out, total=4)}

    async def generate(self, body: dict[str, Any]) -> Any:
        self.bodies.append(body)
        ids = body["input_ids"]
        return [entry(r, [1]) for r in body["rid"]] if isinstance(ids[0], list) else entry(body["rid"], [1])


def run(coroutine: Any) -> Any:
    return asyncio.run(coroutine)


def test_a_request_body_takes_one_prompt_or_a_batch_and_asks_for_logprobs_only_when_wanted() -> None:
    one = generate_body([1, 2], {"max_new_tokens": 3}, "r")
    assert one == {"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 3}, "rid": "r",
                   "return_logprob": True, "top_logprobs_num": 0}
    batch = generate_body([[1], [2]], {}, ["a", "b"], logprobs=False, per_prompt={"logprob_start_len": [0, 0]})
    assert "return_logprob" not in batch and batch["logprob_start_len"] == [0, 0] and batch["rid"] == ["a", "b"]
    assert len({new_rid() for _ in range(100)}) == 100


@pytest.mark.parametrize("incremental", [False, True])
def test_sequences_ready_together_leave_as_one_streamed_batch_and_each_gets_its_own_whole_answer(
        incremental: bool) -> None:
    async def main() -> list[Any]:
        client = Streaming(incremental=incremental)
        sender = Sender(client, members=3)  # type: ignore[arg-type]
        params = sender.stream_params({"max_new_tokens": 4})
        got = await asyncio.gather(*(sender.sample([i], params) for i in range(3)))
        assert sender.batches == [3] and not sender.in_flight
        (body,) = client.bodies
        assert body["input_ids"] == [[0], [1], [2]] and body["sampling_params"] is params
        assert params["stream_interval"] == 5  # above the budget: a first chunk and a last one per item
        return [answer for answer, _ in got]

    answers = run(main())
    assert [a["output_ids"] for a in answers] == [[7, 8, 9, 0], [7, 8, 9, 1], [7, 8, 9, 2]]
    assert [len(a["meta_info"]["output_token_logprobs"]) for a in answers] == [4, 4, 4]


def test_a_sequence_whose_sample_ends_first_is_answered_before_the_rest_of_its_batch() -> None:
    async def main() -> list[str]:
        sender = Sender(Streaming({0: 0.5, 1: 0.0}), members=2)  # type: ignore[arg-type]
        order: list[str] = []

        async def one(i: int) -> None:
            await sender.sample([i], {})
            order.append(f"answered {i}")

        await asyncio.gather(one(0), one(1))
        return order

    assert run(main()) == ["answered 1", "answered 0"]


def test_a_batch_leaves_when_every_member_has_joined_or_left_not_after_its_linger() -> None:
    async def main() -> float:
        loop = asyncio.get_running_loop()
        sender = Sender(Streaming(), members=3, linger_s=10.0, max_wait_s=10.0)  # type: ignore[arg-type]
        t0 = loop.time()
        first = asyncio.ensure_future(sender.sample([1], {}))
        second = asyncio.ensure_future(sender.sample([2], {}))
        await asyncio.sleep(0.05)
        sender.leave()  # the third member ended: the batch holds every member still running
        await asyncio.gather(first, second)
        return loop.time() - t0

    assert run(main()) < 1.0


def test_a_batch_lingers_for_late_joiners_when_the_members_are_not_known() -> None:
    async def main() -> list[int]:
        sender = Sender(Streaming(), linger_s=0.05)  # type: ignore[arg-type]

        async def late(i: int) -> Any:
            await asyncio.sleep(0.01 * i)
            return await sender.sample([i], {})

        await asyncio.gather(*(late(i) for i in range(3)))
        return sender.batches

    assert run(main()) == [3]


def test_a_stream_that_ends_before_an_item_finished_fails_that_item_only_and_its_rid_leaves_in_flight() -> None:
    async def main() -> list[Any]:
        sender = Sender(Streaming(drop=1), members=2)  # type: ignore[arg-type]
        got = await asyncio.gather(*(sender.sample([i], {}) for i in range(2)), return_exceptions=True)
        assert not sender.in_flight
        return got

    first, second = run(main())
    assert first[0]["output_ids"] == [7, 8, 9, 0]
    assert isinstance(second, RequestError) and "ended before 1 of its items finished" in str(second)


def test_a_failing_request_fails_every_sequence_of_its_batch() -> None:
    class Failing(Streaming):
        async def generate_stream(self, body: dict[str, Any]) -> Any:
            raise RequestError("server said no")
            yield  # pragma: no cover

    async def main() -> list[Any]:
        sender = Sender(Failing(), members=2)  # type: ignore[arg-type]
        return await asyncio.gather(*(sender.sample([i], {}) for i in range(2)), return_exceptions=True)

    assert [str(e) for e in run(main())] == ["server said no"] * 2


def test_a_cancelled_sequence_keeps_its_rid_for_the_abort_and_sends_nothing_when_its_batch_leaves() -> None:
    async def main() -> tuple[list[str], dict[str, None], list[dict[str, Any]]]:
        client = Streaming()
        sender = Sender(client, linger_s=0.05)  # type: ignore[arg-type]
        waiter = asyncio.ensure_future(sender.sample([1], {}))
        await asyncio.sleep(0)
        waiter.cancel()
        await asyncio.gather(waiter, return_exceptions=True)
        await asyncio.sleep(0.1)
        return sender.given_up, sender.in_flight, client.bodies

    given_up, in_flight, bodies = run(main())
    assert len(given_up) == 1 and list(in_flight) == given_up and bodies == []


def test_without_batching_or_behind_a_router_each_sequence_is_its_own_plain_request() -> None:
    async def main(client: Streaming, batch: bool) -> list[dict[str, Any]]:
        sender = Sender(client, batch=batch)  # type: ignore[arg-type]
        assert sender.stream_params({"max_new_tokens": 4}) == {"max_new_tokens": 4}
        await asyncio.gather(*(sender.sample([i], {}) for i in range(2)))
        return client.bodies

    assert [b["input_ids"] for b in run(main(Streaming(), False))] == [[0], [1]]
    router = Streaming()
    router.one_prompt_per_request = True
    assert [b["input_ids"] for b in run(main(router, True))] == [[0], [1]]
    assert all(isinstance(b["rid"], str) for b in router.bodies)


def test_send_keeps_a_cancelled_requests_rids_in_flight_and_drops_an_answered_ones() -> None:
    class Slow(Streaming):
        async def generate(self, body: dict[str, Any]) -> Any:
            await asyncio.sleep(10)

    async def main() -> tuple[dict[str, None], dict[str, None]]:
        fast = Sender(Streaming(), batch=False)  # type: ignore[arg-type]
        await fast.send(generate_body([[1], [2]], {}, ["a", "b"]), ["a", "b"])
        slow = Sender(Slow(), batch=False)  # type: ignore[arg-type]
        task = asyncio.ensure_future(slow.send(generate_body([1], {}, "c"), ["c"]))
        await asyncio.sleep(0.01)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        return fast.in_flight, slow.in_flight

    fast, slow = run(main())
    assert fast == {} and list(slow) == ["c"]
