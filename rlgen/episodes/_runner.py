"""The episode runner: n multi-turn episodes per prompt, concurrently, token in and token out.

Owns: `run_episodes`, which drives each episode turn by turn: the first request's ids from the
prompt's chat (`first_prompt_ids`), one `/generate` request per assistant turn sent as `input_ids`
(the previous ids plus the new messages' template delta, so history is never re-tokenized and the
server's prefix cache serves it), the sampled ids appended as sampled (loss mask 1, the server's
logprobs), a closing EOS (mask 0) after a turn that did not end with one, the environment asked
(contained, `_env`), its messages' delta appended (mask 0); the stops ("done", "max_turns",
"context_limit", the environment's failure statuses, "template_error", "request_error"), the bound
on requests in flight, and Ctrl-C: finished episodes are kept, the rids in flight are aborted on the
server, unfinished episodes get "cancelled". Each assistant turn's dict records `latency_s` (its
request) and `rlgen_s`, the runner's own time for it (the synchronous work outside the server and
the environment: the request's ids (the first prompt, or the template delta of the messages before
it), its payload, reading the answer into the record, and after the environment's step, its
bookkeeping when the episode ends there), for the overhead benchmark.

Knows nothing about launching servers, the Engine, rollouts or how results are shown: it takes a
client (`client._http.Client`: `generate(payload)`, `abort(rids)`), a tokenizer with a chat
template, prompts (chats) and an environment, and fills `EpisodeRecord`s.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from typing import Any

from ..client._answer import read_answer, seeded_sampling
from ..client._generate import gather_or_abort, new_rid
from ..client._http import Client
from ..core._errors import RequestError
from ._coalesce import TurnBatcher
from ._env import EnvReply, EpisodeEnv, as_environment
from ._result import EpisodeRecord
from ._template import DeltaRenderer, closing_ids, eos_id, first_prompt_ids

__all__ = ["DEFAULT_MAX_IN_FLIGHT", "episode_data", "run_episodes"]

# Requests in flight at once when the caller sets none (the environment's steps are not counted).
DEFAULT_MAX_IN_FLIGHT = 64


def episode_data(data: Any, n_prompts: int) -> list[Any]:
    """One data item per prompt: None, a list with one item per prompt, or a dict of columns
    (`{"answer": [...]}`, one value per prompt) made into one dict per prompt."""
    if data is None:
        return [None] * n_prompts
    if isinstance(data, Mapping):
        for key, column in data.items():
            if isinstance(column, (str, bytes)) or not isinstance(column, Sequence) or len(column) != n_prompts:
                raise ValueError(f"data[{key!r}] must be a list with one value per prompt ({n_prompts})")
        return [{k: v[i] for k, v in data.items()} for i in range(n_prompts)]
    if isinstance(data, (str, bytes)) or not isinstance(data, Sequence):
        raise TypeError(f"data must be None, a list with one item per prompt, or a dict of such lists; "
                        f"got {type(data).__name__}")
    if len(data) != n_prompts:
        raise ValueError(f"data has {len(data)} items for {n_prompts} prompts: give one per prompt")
    return list(data)


def _fail(record: EpisodeRecord, reply: EnvReply) -> None:
    record.status = reply.status or "env_error"
    record.error, record.traceback = reply.error, reply.traceback


async def run_episodes(client: Client, tokenizer: Any, prompts: Sequence[Sequence[Mapping[str, Any]]], *,
                       env: Any, n: int = 1, max_turns: int = 4, max_new_tokens: int = 128,
                       sampling: Mapping[str, Any] | None = None, context_length: int | None = None,
                       data: Any = None, env_timeout: float | None = 30.0,
                       max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
                       records: list[EpisodeRecord] | None = None,
                       on_episode: Any = None, batch_turns: bool = True) -> list[EpisodeRecord]:
    """Run `n` episodes per prompt (all concurrently, at most `max_in_flight` requests at once).

    Args:
        client: posts `/generate` and aborts by rid.
        tokenizer: a Hugging Face tokenizer with a chat template (token-faithful deltas, `_template`).
        prompts: chats (lists of message dicts).
        env: what `as_environment` takes (a function, a class with reset/step, a factory, tool_env(...)).
        max_turns: the most assistant turns per episode ("max_turns" when the environment still
            answers after the last one).
        max_new_tokens: per turn.
        sampling: SGLang sampling_params (temperature, top_p, stop, ...), without max_new_tokens.
        context_length: the model's context; a turn whose ids plus max_new_tokens would not fit is
            not sent, and the episode ends "context_limit". None: no check.
        data: per prompt (see `episode_data`), given to the environment.
        env_timeout: seconds per environment step.
        records: a list to fill in place (prompt-major, n per prompt), so that a caller keeps what
            finished when this is cancelled.
        on_episode: called with each record as it finishes (e.g. a progress line's advance).
        batch_turns: send the turns that are ready together as one batched `/generate` (`_coalesce`:
            SGLang serves a batch much faster than as many single requests); False: one request per
            turn, each answered as soon as its sample finishes.

    Returns the records, prompt-major. On cancellation, the rids in flight are aborted on the server,
    unfinished records get status "cancelled", and CancelledError propagates.
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be an int >= 1, got {n!r}")
    if isinstance(max_turns, bool) or not isinstance(max_turns, int) or max_turns < 1:
        raise ValueError(f"max_turns must be an int >= 1, got {max_turns!r}")
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be an int >= 1, got {max_new_tokens!r}")
    if isinstance(max_in_flight, bool) or not isinstance(max_in_flight, int) or max_in_flight < 1:
        raise ValueError(f"max_in_flight must be an int >= 1, got {max_in_flight!r}")
    environment = as_environment(env, timeout=env_timeout)
    items = episode_data(data, len(prompts))
    eos = eos_id(tokenizer)
    params = {**(sampling or {}), "max_new_tokens": max_new_tokens}
    limiter = asyncio.Semaphore(max_in_flight)
    batcher = TurnBatcher(client, max_batch=max_in_flight) if batch_turns else None
    in_flight: dict[str, None] = {}
    renderer: list[DeltaRenderer] = []  # made at the first delta (a template that refuses: that episode's status)

    def delta_ids(messages: list[dict[str, Any]]) -> list[int]:
        if not renderer:
            renderer.append(DeltaRenderer(tokenizer, tools=environment.tools))
        return renderer[0](messages)

    out = records if records is not None else []
    out[:] = [EpisodeRecord(p, s, data=items[p]) for p in range(len(prompts)) for s in range(n)]

    async def generate(ids: list[int], budget: int, sample_index: int) -> tuple[dict[str, Any], float, float]:
        """(the answer, its latency, the runner's own seconds building the payload)."""
        t = time.perf_counter()
        # n episodes of a seeded prompt: episode j draws with seed + j, as generate()'s samples do.
        turn_params = seeded_sampling({**params, "max_new_tokens": budget}, sample_index)
        own = time.perf_counter() - t
        async with limiter:
            t = time.perf_counter()
            rid = new_rid()
            in_flight[rid] = None
            payload = {"input_ids": ids, "sampling_params": turn_params, "return_logprob": True, "rid": rid}
            t0 = time.perf_counter()
            own += t0 - t
            cancelled = False
            try:
                answer = await (batcher.generate(ids, turn_params, rid) if batcher is not None
                                else client.generate(payload))
            except asyncio.CancelledError:
                cancelled = True  # still running on the server: left for the abort below
                raise
            finally:
                if not cancelled:
                    in_flight.pop(rid, None)
            latency = time.perf_counter() - t0
            if isinstance(answer, list):
                answer = answer[0] if len(answer) == 1 else answer
            if not isinstance(answer, dict):
                raise RequestError(f"/generate answered {type(answer).__name__}, not one sample")
            return answer, latency, own

    async def one(record: EpisodeRecord, prompt: Sequence[Mapping[str, Any]]) -> None:
        made = await environment.new()
        if isinstance(made, EnvReply):
            return _fail(record, made)
        session: EpisodeEnv = made
        bind = getattr(session, "bind_client", None)
        if callable(bind):  # a tool environment that parses with the server's own parser
            bind(client)
        reply = await session.reset(record.data)
        record.env_seconds += reply.seconds
        if reply.status is not None:
            return _fail(record, reply)
        record.messages = [dict(m) for m in prompt] + reply.messages
        record.n_prompt_messages = len(record.messages)
        tools = environment.tools
        # The runner's own time per assistant turn (`rlgen_s`): the synchronous work outside the server
        # and the environment, from the ids of its request to handing its answer to the environment.
        t = time.perf_counter()
        try:
            first = first_prompt_ids(tokenizer, record.messages, tools=tools)
        except Exception as e:  # a chat the template refuses (raise_exception, a TemplateError)
            record.status, record.error = "template_error", f"{type(e).__name__}: {e}"
            return None
        record.prompt_len = len(first)
        record.extend(first, role="prompt", turn=0)
        own = time.perf_counter() - t  # the ids of the first request
        for turn in range(max_turns):
            if context_length is not None and len(record.ids) + max_new_tokens > context_length:
                record.status = "context_limit"
                record.error = (f"turn {turn}: {len(record.ids)} ids + max_new_tokens {max_new_tokens} would not fit "
                                f"the model's context of {context_length} tokens")
                return None
            try:
                answer, latency, payload_s = await generate(record.ids, max_new_tokens, record.sample_index)
            except RequestError as e:
                record.status, record.error = "request_error", f"turn {turn}: {e}"
                return None
            t = time.perf_counter()
            read = read_answer(answer)
            sampled = [int(i) for i in read.output_ids or []]
            lps = read.token_logprobs() if read.output_ids is not None else []
            if read.finish == "abort":
                record.status, record.error = "request_error", f"turn {turn}: the server aborted the request: {read.meta.get('finish_reason')}"
                return None
            record.extend(sampled, role="assistant", turn=turn, mask=1, logprobs=lps)
            text_ids = sampled[:-1] if sampled and sampled[-1] == eos else sampled
            text = tokenizer.decode(text_ids)
            record.messages.append({"role": "assistant", "content": text})
            assistant: dict[str, Any] = {
                "turn": turn, "role": "assistant", "text": text, "tokens": len(sampled),
                "logprob_mean": sum(lps) / len(lps) if lps else None, "tool_calls": None, "tool_calls_failed": None,
                "finish_reason": read.finish if read.finish != "unknown" else None, "cached_tokens": read.cached_tokens,
                "prompt_tokens": int(read.prompt_tokens or len(record.ids) - len(sampled)),
                "latency_s": latency, "rid": read.rid, "weight_version": read.weight_version,
                "matched_stop": read.matched_stop,
            }
            record.turns.append(assistant)
            record.extend(closing_ids(tokenizer, sampled), role="env", turn=turn)
            messages = [dict(m) for m in record.messages]
            assistant["rlgen_s"] = own + payload_s + time.perf_counter() - t
            reply = await session.step(messages)
            t = time.perf_counter()
            record.env_seconds += reply.seconds
            record.turns.append({
                "turn": turn, "role": "env", "text": "\n".join(m["content"] for m in reply.messages) or None,
                "tokens": 0, "logprob_mean": None, "tool_calls": reply.tool_calls,
                "tool_calls_failed": reply.tool_calls_failed, "finish_reason": None, "cached_tokens": None,
                "prompt_tokens": None, "latency_s": reply.seconds, "status": reply.status, "done": reply.done,
                "calls": reply.calls, "roles": [m.get("role") for m in reply.messages],
            })
            if reply.status is not None:
                assistant["rlgen_s"] += time.perf_counter() - t
                return _fail(record, reply)
            if reply.done or turn == max_turns - 1:
                record.status = "done" if reply.done else "max_turns"
                assistant["rlgen_s"] += time.perf_counter() - t
                return None
            try:
                delta = delta_ids(reply.messages)
            except Exception as e:  # TemplateError, or a template that refuses the messages
                record.status, record.error = "template_error", f"{type(e).__name__}: {e}"
                assistant["rlgen_s"] += time.perf_counter() - t
                return None
            record.messages.extend(reply.messages)
            record.extend(delta, role="env", turn=turn)
            record.turns[-1]["tokens"] = len(delta)
            own = time.perf_counter() - t  # the next request's ids: the next turn's
        return None  # pragma: no cover - the loop returns

    async def guarded(record: EpisodeRecord, prompt: Sequence[Mapping[str, Any]]) -> None:
        try:
            await one(record, prompt)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # a bug or an unexpected answer: this episode's status, not the call's crash
            import traceback as tb

            record.status, record.error = "error", f"{type(e).__name__}: {e}"
            record.traceback = "".join(tb.format_exception(e))
        if on_episode is not None:
            on_episode(record)

    tasks = [asyncio.ensure_future(guarded(r, prompts[r.prompt_index])) for r in out]
    try:
        await gather_or_abort(client, tasks, in_flight)
    except BaseException:
        for r in out:
            if r.status == "running":
                r.status, r.error = "cancelled", "cancelled before it finished (Ctrl-C); its request was aborted"
        raise
    finally:
        if batcher is not None:  # batches whose waiters were cancelled (their rids are aborted above)
            await batcher.close()
    return out
