"""Engine.episodes / run_episodes on a real CPU server: token-in/token-out ids that match the
re-render of the final messages, masks and logprobs, per-episode statuses, prefix-cache hits."""

from __future__ import annotations

import os
from typing import Any

import pytest

import rlgen
from rlgen import episodes
from rlgen.core import _loop

BACKEND = os.environ.get("RLGEN_TEST_BACKEND", "cpu")
PROMPTS = ["What is 2+2?", [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a colour."}]]
EOS = 2


@pytest.fixture(scope="module")
def engine(model_path: str):
    eng = rlgen.Engine(model_path, backend=BACKEND, progress=False)
    yield eng
    eng.close()


def again_once(messages: list[dict[str, Any]], data: Any) -> str:
    return "Try again." if sum(m["role"] == "assistant" for m in messages) < 2 else "done"


def _runs(roles: list[str]) -> list[tuple[int, int, str]]:
    out, start = [], 0
    for i in range(1, len(roles) + 1):
        if i == len(roles) or roles[i] != roles[start]:
            out.append((start, i, roles[start]))
            start = i
    return out


@pytest.mark.timeout(120)
def test_two_prompts_two_episodes_token_faithful(engine: rlgen.Engine) -> None:
    tok = engine.tokenizer
    res = engine.episodes(PROMPTS, env=again_once, n=2, max_new_tokens=8, temperature=1.0)
    assert len(res) == 4 and [(r.prompt_index, r.sample_index) for r in res.records] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    for r in res.records:
        assert r.status == "done", r
        chat = [{"role": "user", "content": PROMPTS[0]}] if r.prompt_index == 0 else PROMPTS[1]
        assert r.messages[: len(chat)] == chat and r.messages[len(chat):][1] == {"role": "user", "content": "Try again."}
        assert len(r.assistant_turns) == 2
        # ids: the first prompt, then per turn sampled + closing + delta, built by hand from the pieces
        assert r.ids[: r.prompt_len] == episodes.first_prompt_ids(tok, chat)
        n = len(r.ids)
        assert len(r.loss_mask) == len(r.logprobs) == len(r.turn_ids) == len(r.roles) == n
        spans = [(a, b) for a, b, role in _runs(r.roles) if role == "assistant"]
        assert len(spans) == 2
        (a0, b0), (a1, b1) = spans
        sampled0 = r.ids[a0:b0]
        expect = (r.ids[: r.prompt_len] + sampled0 + episodes.closing_ids(tok, sampled0)
                  + episodes.message_delta_ids(tok, [{"role": "user", "content": "Try again."}]))
        assert r.ids[:a1] == expect
        sampled1 = r.ids[a1:b1]
        assert r.ids[b1:] == episodes.closing_ids(tok, sampled1)  # the last turn: only its closing EOS
        # the mask is 1 exactly on sampled tokens; logprobs are 0 elsewhere
        assert sum(r.loss_mask) == sum(t["tokens"] for t in r.assistant_turns) == r.sampled_tokens
        assert all((m == 1) == (role == "assistant") for m, role in zip(r.loss_mask, r.roles))
        assert all(lp == 0.0 for m, lp in zip(r.loss_mask, r.logprobs) if m == 0)
        assert all(lp <= 0.0 for lp in r.logprobs) and any(lp < 0.0 for lp in r.logprobs)
        # a turn without a sampled EOS gets one appended, mask 0
        for _a, b in spans:
            if r.ids[b - 1] != EOS:
                assert r.ids[b] == EOS and r.loss_mask[b] == 0
        assert r.turn_ids[a0] == 0 and r.turn_ids[a1] == 1
        # the trainer's re-render of the messages: the same ids, or a difference inside an assistant turn
        d = episodes.drift(tok, r.messages, r.ids, roles=r.roles)
        assert d.cause in ("same", "retokenized", "boundary"), d
        if not d.same:
            assert d.role == "assistant", d
        # the second request reused the first one's prefix from the server's cache
        second = r.assistant_turns[1]
        assert second["cached_tokens"] > 0 and second["prompt_tokens"] == a1
    df = res.df
    assert list(df["status"]) == ["done"] * 4 and list(df["turns"]) == [2] * 4
    assert (df["cached_share"] > 0).all() and (df["sampled_tokens"] == [r.sampled_tokens for r in res.records]).all()
    turns = res.turns
    assert len(turns) == 16 and set(turns["role"]) == {"assistant", "env"}
    t = res.tensors()
    width = max(len(r.ids) for r in res.records)
    assert t["input_ids"].shape == (4, width) and int(t["attention_mask"].sum()) == sum(len(r.ids) for r in res.records)
    assert int(t["loss_mask"].sum()) == int(df["sampled_tokens"].sum())
    assert engine.last_episodes is res


@pytest.mark.timeout(120)
def test_env_error_ends_only_its_episodes_and_max_turns(engine: rlgen.Engine) -> None:
    def env(messages: list[dict[str, Any]], data: Any) -> str:
        if data == "boom":
            raise RuntimeError("the environment broke")
        return "Go on."

    res = engine.episodes(["Count.", "Spell."], env=env, n=2, max_turns=2, max_new_tokens=4, data=["ok", "boom"])
    statuses = [(r.prompt_index, r.status) for r in res.records]
    assert statuses == [(0, "max_turns"), (0, "max_turns"), (1, "env_error"), (1, "env_error")]
    for r in res.records[:2]:
        assert len(r.assistant_turns) == 2 and r.error is None
    for r in res.records[2:]:
        assert len(r.assistant_turns) == 1 and "RuntimeError: the environment broke" in (r.error or "")
        assert "Traceback" in (r.traceback or "")
    assert list(res.df["status"]) == ["max_turns", "max_turns", "env_error", "env_error"]


@pytest.mark.timeout(120)
def test_context_limit_and_bad_returns(engine: rlgen.Engine) -> None:
    tok = engine.tokenizer
    chat = [{"role": "user", "content": "Hi."}]
    first = len(episodes.first_prompt_ids(tok, chat))

    async def go(env: Any, context_length: int) -> list[episodes.EpisodeRecord]:
        return await episodes.run_episodes(engine._client, tok, [chat], env=env, n=1, max_turns=4, max_new_tokens=4,
                                           sampling={"temperature": 0.0}, context_length=context_length)

    # room for the first turn only: the second request would not fit
    (r,) = _loop.run_sync(go(lambda m, d: "More.", first + 6))
    assert r.status == "context_limit" and len(r.assistant_turns) == 1 and "context" in (r.error or "")
    # not even the first request fits
    (r,) = _loop.run_sync(go(lambda m, d: "More.", first + 3))
    assert r.status == "context_limit" and r.assistant_turns == [] and r.ids[: r.prompt_len] == r.ids
    # an environment returning the wrong type: its own status, saying what came back
    (r,) = _loop.run_sync(go(lambda m, d: 42, 4096))
    assert r.status == "bad_env_return" and "int 42" in (r.error or "")


@pytest.mark.timeout(120)
def test_ctrl_c_keeps_finished_episodes_aborts_the_request_in_flight_on_the_server_and_cancels_the_rest(
        engine: rlgen.Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    import asyncio
    import signal
    import threading
    import time

    def on_server() -> int:  # the server's own count (SGLang's /v1/loads; the CPU backend serves it too)
        loads = _loop.run_sync(engine._client.get("/v1/loads", timeout=10))["loads"]
        return sum(load["num_running_reqs"] + load["num_waiting_reqs"] for load in loads)

    asked = {d: threading.Event() for d in ("fast", "in a request", "in the environment")}

    async def env(messages: list[dict[str, Any]], data: str) -> str:
        asked[data].set()
        if data == "in the environment":
            await asyncio.sleep(60)
        return "done" if data == "fast" else "Go on."

    aborted: list[str] = []
    abort = engine._client.abort

    async def spy(rids: list[str]) -> None:
        aborted.extend(rids)
        await abort(rids)

    monkeypatch.setattr(engine._client, "abort", spy)
    main = threading.main_thread().ident
    gone_after: list[float] = []

    def interrupt_then_watch() -> None:
        for event in asked.values():  # every first turn answered: what runs now is the second request
            event.wait(60)
        deadline = time.monotonic() + 30
        while on_server() < 1 and time.monotonic() < deadline:
            time.sleep(0.02)
        sent = time.monotonic()
        signal.pthread_kill(main, signal.SIGINT)  # type: ignore[arg-type]
        while time.monotonic() - sent < 10:
            if on_server() == 0:
                gone_after.append(time.monotonic() - sent)
                return
            time.sleep(0.02)

    watcher = threading.Thread(target=interrupt_then_watch, daemon=True)
    watcher.start()
    with pytest.raises(KeyboardInterrupt):
        engine.episodes(["Hi."] * 3, env=env, data=list(asked), max_turns=8, max_new_tokens=32, ignore_eos=True)
    watcher.join(15)
    res = engine.last_episodes
    assert res is not None and [r.status for r in res.records] == ["done", "cancelled", "cancelled"]
    fast, in_request, in_env = res.records
    assert len(fast.assistant_turns) == 1 and fast.error is None and len(fast.ids) > fast.prompt_len
    for r in (in_request, in_env):  # what they had done is kept
        assert len(r.assistant_turns) == 1 and "cancelled" in (r.error or "")
    # exactly the one request in flight was aborted by its rid (not one of the finished turns')
    assert len(aborted) == 1 and aborted[0] not in {t["rid"] for r in res.records for t in r.assistant_turns}
    # and it left the server at once: not at its 32nd token, nor when the server would have noticed
    # the closed connection (every 4 s, as SGLang)
    assert gone_after and gone_after[0] < 1.5, gone_after
    assert list(res.df["status"]) == ["done", "cancelled", "cancelled"]


@pytest.mark.timeout(120)
def test_a_tracer_sees_each_turns_request_answer_and_environment_step_in_the_order_they_run(
        engine: rlgen.Engine) -> None:
    from rlgen.episodes import run_episodes

    seen: list[tuple[str, int, int]] = []

    def tracer(event: str, record: Any, turn: int) -> None:
        seen.append((event, record.sample_index, turn))

    records = _loop.run_sync(run_episodes(engine._client, engine.tokenizer, [[{"role": "user", "content": "Hi."}]],
                                          env=again_once, n=2, max_new_tokens=4, tracer=tracer))
    assert [r.status for r in records] == ["done", "done"]
    for j in (0, 1):
        assert [(e, t) for e, s, t in seen if s == j] == [
            ("request", 0), ("answer", 0), ("env", 0), ("reply", 0),
            ("request", 1), ("answer", 1), ("env", 1), ("reply", 1)]


def add(a: int, b: int) -> int:
    """Add two numbers.

    Args:
        a: the first.
        b: the second.
    """
    return a + b


@pytest.mark.timeout(120)
def test_tool_env_end_to_end(engine: rlgen.Engine) -> None:
    env = episodes.tool_env([add])
    res = engine.episodes("Add 2 and 3.", env=env, n=1, max_new_tokens=8)
    (r,) = res.records
    chat = [{"role": "user", "content": "Add 2 and 3."}]
    assert r.ids[: r.prompt_len] == episodes.first_prompt_ids(engine.tokenizer, chat, tools=env.schemas)
    # the small model rarely writes a call: no call ends the episode ("done"), a broken one is its own status
    assert r.status in ("done", "bad_tool_call", "max_turns"), r
    assert res.df.loc[0, "tool_calls"] >= 0


@pytest.mark.timeout(120)
def test_a_seed_gives_each_of_the_n_episodes_its_own_draw_and_repeats_exactly(engine: rlgen.Engine) -> None:
    # One sampling_seed for all n episodes of a prompt drew n identical episodes.
    def once(messages: list[dict[str, Any]], data: Any) -> str:
        return "done"

    def sampled() -> list[tuple[int, ...]]:
        res = engine.episodes(["Say something."], env=once, n=4, max_turns=1, max_new_tokens=12, sampling_seed=7)
        return [tuple(r.ids) for r in res.records]

    first = sampled()
    assert len(set(first)) > 1  # the 4 episodes differ
    assert sampled() == first  # and the same seed draws them again (the CPU backend honours seeds)


@pytest.mark.timeout(180)
def test_turns_that_are_ready_together_go_as_one_batched_request_and_give_the_same_episodes(
        engine: rlgen.Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    sizes: list[int] = []
    params: list[Any] = []
    post, stream = engine._client.generate, engine._client.generate_stream

    def note(payload: dict[str, Any]) -> None:
        ids = payload["input_ids"]
        sizes.append(len(ids) if ids and isinstance(ids[0], list) else 1)
        params.append(payload["sampling_params"])

    async def spy(payload: dict[str, Any]) -> Any:
        note(payload)
        return await post(payload)

    async def spy_stream(payload: dict[str, Any]) -> Any:
        note(payload)
        async for chunk in stream(payload):
            yield chunk

    monkeypatch.setattr(engine._client, "generate", spy)
    monkeypatch.setattr(engine._client, "generate_stream", spy_stream)
    kw = dict(env=again_once, n=3, max_turns=3, max_new_tokens=4, temperature=0, ignore_eos=True)
    batched = engine.episodes(["What is 2+2?", "Name a colour."], **kw)
    assert sizes[0] == 6 and sum(sizes) == 12 and batched.df.status.eq("done").all()  # 6 episodes x 2 turns
    # the turns share their sampling parameters: sent once per batch, as one dict
    assert all(isinstance(p, dict) and p["max_new_tokens"] == 4 and p["ignore_eos"] for p in params)
    params.clear()
    sizes.clear()
    seeded = engine.episodes(["What is 2+2?"], env=again_once, n=3, max_turns=2, max_new_tokens=4, sampling_seed=11)
    # a seeded call's episodes draw with seed + j: one dict per episode (the first turns in one batch; each
    # episode's next turn leaves as soon as its own answer is in, so later batches may hold fewer)
    seeds = [[p["sampling_seed"] for p in (batch if isinstance(batch, list) else [batch] * size)]
             for batch, size in zip(params, sizes)]
    assert seeds[0] == [11, 12, 13] and sorted(s for batch in seeds for s in batch) == [11, 11, 12, 12, 13, 13]
    assert seeded.df.status.eq("done").all()
    params.clear()
    sizes.clear()
    single = engine.episodes(["What is 2+2?", "Name a colour."], batch_turns=False, **kw)
    assert sizes == [1] * 12
    assert [r.ids for r in single.records] == [r.ids for r in batched.records]   # greedy: the same episodes
    assert [r.loss_mask for r in single.records] == [r.loss_mask for r in batched.records]


@pytest.mark.timeout(120)
def test_a_turn_batch_leaves_once_every_episode_still_running_has_joined_it_not_after_a_linger(
        engine: rlgen.Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    import time

    from rlgen.client._sender import Sender

    # A batch would otherwise wait 10 s for more turns: only the episodes' own count can send it sooner.
    monkeypatch.setitem(Sender.__init__.__kwdefaults__, "linger_s", 10.0)
    monkeypatch.setitem(Sender.__init__.__kwdefaults__, "max_wait_s", 10.0)

    def stop_after(messages: list[dict[str, Any]], data: Any) -> str:
        return "done" if sum(m["role"] == "assistant" for m in messages) >= data["stop_at"] else "Go on."

    t0 = time.perf_counter()
    res = engine.episodes(["What is 2+2?", "Name a colour."], env=stop_after, n=2, max_turns=3, max_new_tokens=2,
                          temperature=0, ignore_eos=True, data={"stop_at": [1, 3]})
    seconds = time.perf_counter() - t0
    assert res.df.status.eq("done").all() and res.df.turns.tolist() == [1, 1, 3, 3]
    assert seconds < 8.0, f"{seconds:.1f} s: a batch waited for episodes that had ended"


@pytest.mark.timeout(120)
def test_the_cyclic_gc_is_paused_while_episodes_run_and_resumed_after(engine: rlgen.Engine) -> None:
    import gc

    seen: list[bool] = []

    def env(messages: list[dict[str, Any]], data: Any) -> str:
        seen.append(gc.isenabled())
        return "done"

    assert gc.isenabled()
    res = engine.episodes(["Say something."], env=env, n=2, max_turns=1, max_new_tokens=4)
    assert seen == [False, False] and gc.isenabled() and res.df.status.eq("done").all()


@pytest.mark.timeout(120)
def test_no_episode_waits_for_a_turn_of_its_batch_that_is_still_being_sampled(engine: rlgen.Engine) -> None:
    import asyncio
    import time

    from rlgen.episodes import run_episodes

    t0 = time.perf_counter()
    sent: list[tuple[str, float]] = []  # (the episode's prompt, when its request left)

    class Server:
        """Streams each batch's items as they end: a prompt that says "slow" ends 1 s after the others."""

        async def generate_stream(self, payload: dict[str, Any]) -> Any:
            order = sorted(range(len(payload["input_ids"])), key=lambda i: engine.tokenizer.decode(
                payload["input_ids"][i]).count("slow"))
            for i in order:
                ids = payload["input_ids"][i]
                sent.append((engine.tokenizer.decode(ids), time.perf_counter() - t0))
            for i in order:
                if "slow" in engine.tokenizer.decode(payload["input_ids"][i]):
                    await asyncio.sleep(1.0)
                yield {"index": i, "text": "", "output_ids": [300, EOS], "meta_info": {
                    "id": payload["rid"][i], "finish_reason": {"type": "stop", "matched": EOS},
                    "prompt_tokens": len(payload["input_ids"][i]), "completion_tokens": 2, "cached_tokens": 0,
                    "output_token_logprobs": [[-0.5, t, None] for t in (300, EOS)]}}

        async def abort(self, rids: list[str]) -> None:
            return None

    def go_on(messages: list[dict[str, Any]], data: Any) -> str:
        return "done" if sum(m["role"] == "assistant" for m in messages) >= 3 else "Go on."

    records = asyncio.run(run_episodes(Server(), engine.tokenizer, [[{"role": "user", "content": "Be slow."}],
                                                                     [{"role": "user", "content": "Be quick."}]],
                                       env=go_on, n=1, max_turns=3, max_new_tokens=3))
    assert [r.status for r in records] == ["done", "done"]
    quick = [at for text, at in sent if "quick" in text]
    assert len(quick) == 3 and quick[-1] < 0.5, f"the quick episode's turns left at {quick}: it waited for the slow one"


@pytest.mark.parametrize("prompts", ["", "   ", ["What is 2+2?", ""]])
def test_an_empty_prompt_string_is_refused_before_anything_runs_saying_what_to_give(prompts: Any) -> None:
    from rlgen.episodes._runner import episode_prompts

    with pytest.raises(ValueError, match="empty string: write the user's first message there"):
        episode_prompts(prompts)
