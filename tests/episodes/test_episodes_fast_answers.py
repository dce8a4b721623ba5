"""Episodes whose answers come at once: every token labelled, every environment turn kept.

A server that answers within a turn or two of the event loop (a cached prefix, a 1-token turn, a
small model, many episodes) is where bookkeeping that runs behind the next request can fall out of
step with it. These tests drive the real runner (`run_episodes`: `Episode`, the sender, the
batching) with many episodes against a client that answers within one turn of the loop, and
count, on every episode, that each per-token list is as long as its ids, that the loss mask is 1
exactly on the sampled ids, and that every environment reply is in the turns and in the ids.
"""

from __future__ import annotations

import asyncio
import random
from typing import Any

import pytest

from rlgen.episodes import first_prompt_ids, message_delta_ids, run_episodes

EOS = 2


class FastClient:
    """Answers `/generate` (one entry or a batch) after 0 or 1 turn of the event loop, each sample
    1-3 random ids, a third of them ending with EOS; records each sample's ids by rid. Streamed
    requests are answered per item, in a shuffled order, as SGLang's batched streams are."""

    one_prompt_per_request = False

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.sampled: dict[str, list[int]] = {}

    async def _turns(self) -> None:
        for _ in range(self.rng.randrange(2)):
            await asyncio.sleep(0)

    def _one(self, ids: list[int], rid: str) -> dict[str, Any]:
        out = [self.rng.randrange(100, 30000) for _ in range(self.rng.randrange(1, 4))]
        if self.rng.random() < 1 / 3:
            out[-1] = EOS
        self.sampled[rid] = out
        meta = {"id": rid, "finish_reason": {"type": "stop" if out[-1] == EOS else "length"},
                "prompt_tokens": len(ids), "completion_tokens": len(out), "cached_tokens": 0,
                "output_token_logprobs": [[-0.5 - 0.01 * (t % 7), t, None] for t in out]}
        return {"text": "", "output_ids": out, "meta_info": meta}

    async def generate(self, payload: dict[str, Any]) -> Any:
        await self._turns()
        ids, rid = payload["input_ids"], payload["rid"]
        if ids and isinstance(ids[0], list):
            return [self._one(i, r) for i, r in zip(ids, rid)]
        return self._one(ids, rid)

    async def generate_stream(self, payload: dict[str, Any]) -> Any:
        ids, rid = payload["input_ids"], payload["rid"]
        batch = isinstance(ids[0], list)
        items = list(enumerate(zip(ids, rid) if batch else [(ids, rid)]))
        self.rng.shuffle(items)
        for index, (i, r) in items:
            await self._turns()
            chunk = self._one(i, r)
            if batch:
                chunk["index"] = index
            yield chunk

    async def abort(self, rids: list[str]) -> None:
        return None

    async def post(self, path: str, body: Any = None, **kwargs: Any) -> Any:
        return {}


def twice_more(messages: list[dict[str, Any]]) -> str | None:
    """Answers at once; ends the episode after its third assistant turn."""
    return None if sum(m["role"] == "assistant" for m in messages) >= 3 else "Go on."


def _check_record(r: Any, tok: Any, sampled: dict[str, list[int]]) -> None:
    n = len(r.ids)
    assert r.status == "done", (r, r.error, r.traceback)
    assert len(r.loss_mask) == len(r.logprobs) == len(r.turn_ids) == len(r.roles) == n, r
    roles = [t["role"] for t in r.turns]
    assert roles == ["assistant", "env", "assistant", "env", "assistant", "env"], roles
    # rebuilt from the pieces: prompt, then per turn the sampled ids, a closing EOS, the reply's delta
    expect, mask = list(r.ids[:r.prompt_len]), [0] * r.prompt_len
    delta = message_delta_ids(tok, [{"role": "user", "content": "Go on."}])
    for k, turn in enumerate(t for t in r.turns if t["role"] == "assistant"):
        ids = sampled[turn["rid"]]
        closing = [] if ids[-1] == EOS else [EOS]
        expect += ids + closing
        mask += [1] * len(ids) + [0] * len(closing)
        if k < 2:
            expect += delta
            mask += [0] * len(delta)
    assert r.ids == expect and r.loss_mask == mask
    assert all((lp < 0) == bool(m) for lp, m in zip(r.logprobs, r.loss_mask))


@pytest.mark.parametrize("batch_turns", [True, False])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_many_episodes_answered_at_once_keep_every_label_and_every_environment_turn(
        tok: Any, batch_turns: bool, seed: int) -> None:
    client = FastClient(seed)
    prompts = [[{"role": "user", "content": f"Count to {i}."}] for i in range(64)]
    records = asyncio.run(run_episodes(client, tok, prompts, env=twice_more, n=4, max_turns=8,  # type: ignore[arg-type]
                                       max_new_tokens=4, batch_turns=batch_turns))
    assert len(records) == 256
    for r in records:
        assert r.ids[:r.prompt_len] == first_prompt_ids(tok, prompts[r.prompt_index])
        _check_record(r, tok, client.sampled)
