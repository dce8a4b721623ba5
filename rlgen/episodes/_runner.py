"""The episode runner: n multi-turn episodes per prompt, concurrently, and the checks of a call's inputs.

Owns: `run_episodes`, which checks what concerns the whole call before anything is sent (the
counts, the environment (`as_environment`), the data (`episode_data`: one item per prompt, no name
of rlgen's own columns), the chat template compiles (`check_template`)), then runs one `Episode`
(`_episode`) per prompt and sample as a task, all at once, with at most `max_in_flight` requests in
flight (the one sender, `client._sender.Sender`: each turn leaves when it is ready, batched with the
turns ready with it, and is answered the moment its own sample ends), and handles Ctrl-C: finished episodes are kept, the rids in flight are
aborted on the server, unfinished episodes get "cancelled". An unexpected failure in one episode is
its status "error" (with the traceback), not the call's. Also owns the prompts' form
(`episode_prompts`: chats, or strings made into one user message each, roles checked as
`generate()` checks them).

Knows nothing about launching servers, the Engine, rollouts or how results are shown: it takes a
client (`client._http.Client`: `generate(payload)`, `abort(rids)`), a tokenizer with a chat
template, prompts (chats) and an environment, and fills `EpisodeRecord`s.
"""

from __future__ import annotations

import asyncio
import difflib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..client._http import Client
from ..client._prompts import CHAT_ROLES
from ..client._sender import Sender, gather_or_abort
from ._env import as_environment
from ._episode import Episode, EpisodeCall, Tracer, TurnPauses
from ._result import EpisodeRecord, data_columns
from ._template import check_template

__all__ = ["DEFAULT_MAX_IN_FLIGHT", "LoopCall", "episode_data", "episode_prompts", "run_episodes"]

# Requests in flight at once when the caller sets none (the environment's steps are not counted).
DEFAULT_MAX_IN_FLIGHT = 64


@dataclass
class LoopCall:
    """What an environment that owns its loop (`Environment.loop`) gets for a call: it fills
    `records` (prompt-major, n per prompt, made by the runner) as `Episode` would (ids, loss mask,
    logprobs, turns, messages, status), sends each turn through `call.sender` (seeding, the bound
    on requests in flight, batching, rids for an abort) and calls `on_episode(record)` as each
    episode ends. An exception it lets out of one episode should be that episode's status "error".
    """

    call: EpisodeCall
    prompts: Sequence[Sequence[Mapping[str, Any]]]
    records: list[EpisodeRecord]
    on_episode: Callable[[EpisodeRecord], None] | None


def _errored(record: EpisodeRecord, error: Exception) -> None:
    """A bug's exception as the episode's status "error", with its traceback."""
    import traceback as tb

    record.status, record.error = "error", f"{type(error).__name__}: {error}"
    record.traceback = "".join(tb.format_exception(error))


def episode_prompts(prompts: Any) -> list[list[dict[str, Any]]]:
    """Prompts as chats: one chat (a list of message dicts), a string, or a list of chats / strings
    (a string becomes one user message). A message needs a str 'role' and 'content', and a role
    a chat template renders (`client._prompts.CHAT_ROLES`, as `generate()`: "did you mean")."""
    def chat(p: Any, where: str) -> list[dict[str, Any]]:
        if isinstance(p, str):
            if not p.strip():
                raise ValueError(f"{where} is an empty string: write the user's first message there (a str), "
                                 "or give a chat")
            return [{"role": "user", "content": p}]
        if isinstance(p, Sequence) and p and all(isinstance(m, Mapping) for m in p):
            for m in p:
                if not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
                    raise ValueError(f"{where}: every message needs a str 'role' and 'content', got {dict(m)!r}")
                if m["role"] not in CHAT_ROLES:
                    guess = difflib.get_close_matches(m["role"].lower(), CHAT_ROLES, n=1, cutoff=0.5)
                    hint = f"did you mean {guess[0]!r}? " if guess else ""
                    raise ValueError(f"{where}: unknown chat role {m['role']!r}; {hint}roles are "
                                     f"{', '.join(map(repr, CHAT_ROLES))}")
            return [dict(m) for m in p]
        raise TypeError(f"{where} must be a chat (a list of {{'role', 'content'}} dicts) or a str, "
                        f"got {type(p).__name__}")

    if isinstance(prompts, str) or (isinstance(prompts, Sequence) and prompts and isinstance(prompts[0], Mapping)):
        return [chat(prompts, "prompts")]
    if not isinstance(prompts, Sequence) or not prompts:
        raise TypeError("prompts must be a chat, a str, or a non-empty list of chats / strs")
    return [chat(p, f"prompts[{i}]") for i, p in enumerate(prompts)]


def episode_data(data: Any, n_prompts: int) -> list[Any]:
    """One data item per prompt: None, a list with one item per prompt, or a dict of columns
    (`{"answer": [...]}`, one value per prompt) made into one dict per prompt.

    Raises:
        TypeError / ValueError: another form, a length other than the prompts', or a dict key that
            names one of rlgen's own columns (`reward`, `status`, ...: `core._columns`).
    """
    if data is None:
        return [None] * n_prompts
    if isinstance(data, Mapping):
        for key, column in data.items():
            if isinstance(column, (str, bytes)) or not isinstance(column, Sequence) or len(column) != n_prompts:
                raise ValueError(f"data[{key!r}] must be a list with one value per prompt ({n_prompts})")
        items = [{k: v[i] for k, v in data.items()} for i in range(n_prompts)]
        data_columns(items)
        return items
    if isinstance(data, (str, bytes)) or not isinstance(data, Sequence):
        raise TypeError(f"data must be None, a list with one item per prompt, or a dict of such lists; "
                        f"got {type(data).__name__}")
    if len(data) != n_prompts:
        raise ValueError(f"data has {len(data)} items for {n_prompts} prompts: give one per prompt")
    items = list(data)
    data_columns(items)  # a name of rlgen's own columns: refused now, not once every episode has run
    return items


async def run_episodes(client: Client, tokenizer: Any, prompts: Sequence[Sequence[Mapping[str, Any]]], *,
                       env: Any, n: int = 1, max_turns: int = 4, max_new_tokens: int = 128,
                       sampling: Mapping[str, Any] | None = None, context_length: int | None = None,
                       data: Any = None, env_timeout: float | None = 30.0,
                       max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
                       records: list[EpisodeRecord] | None = None,
                       on_episode: Any = None, batch_turns: bool = True,
                       tracer: Tracer | None = None, pauses: TurnPauses | None = None,
                       version_of: Callable[[Any], int] | None = None) -> list[EpisodeRecord]:
    """Run `n` episodes per prompt (all concurrently, at most `max_in_flight` requests at once).

    Args:
        client: posts `/generate` and aborts by rid.
        tokenizer: a Hugging Face tokenizer with a chat template (token-faithful deltas, `_template`).
        prompts: chats (lists of message dicts).
        env: what `as_environment` takes (a function, a class with reset/step, a factory, tool_env(...)),
            or an `Environment` it made (re-timed to `env_timeout` where it can be; one that
            cannot keep its own).
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
        batch_turns: send the turns that are ready together as one batched `/generate`, streamed
            so that each turn is answered as soon as its own sample ends (`client._sender`: SGLang
            serves a batch much faster than as many single requests); False: one request per turn.
        tracer: called at each step's edges (`_episode.Tracer`), for benchmarks; None: nothing is timed.
        pauses: a background call's pauses (`_episode.TurnPauses`): each turn's requests wait at
            their gate, and a turn a pause's abort ended goes on as the same sequence; None: a
            turn the server aborted ends its episode "request_error".
        version_of: the weight version index an answer's `weight_version` names (the Engine's),
            each sampled token's `versions` label in a turn not continued across a pause (a
            continued turn's tokens carry their own); None: -1, not known.

    Raises (before anything is sent):
        TypeError / ValueError: a count below 1, an env, data or env_timeout `as_environment` /
            `episode_data` refuse, a chat template that does not compile (`TemplateError`).

    Returns the records, prompt-major. On cancellation, the rids in flight are aborted on the server,
    unfinished records get status "cancelled", and CancelledError propagates.
    """
    for name, value in (("n", n), ("max_turns", max_turns), ("max_new_tokens", max_new_tokens),
                        ("max_in_flight", max_in_flight)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    environment = as_environment(env, timeout=env_timeout)
    items = episode_data(data, len(prompts))
    check_template(tokenizer, tools=environment.tools)
    sender = Sender(client, max_in_flight=max_in_flight, batch=batch_turns,
                    members=len(prompts) * n if environment.loop is None else None)
    call = EpisodeCall(tokenizer, environment, sender, max_turns=max_turns, max_new_tokens=max_new_tokens,
                       context_length=context_length, sampling=sampling, tracer=tracer, pauses=pauses,
                       version_of=version_of)
    out = records if records is not None else []
    out[:] = [EpisodeRecord(p, s, data=items[p]) for p in range(len(prompts)) for s in range(n)]
    await _run_all(call, prompts, out, on_episode)
    return out


async def _run_all(call: EpisodeCall, prompts: Sequence[Sequence[Mapping[str, Any]]], out: list[EpisodeRecord],
                   on_episode: Callable[[EpisodeRecord], None] | None) -> None:
    """Every record's episode as a task of its own (or the environment's own loop over them all);
    on Ctrl-C or a failure, the rids in flight aborted and the unfinished records "cancelled"."""
    sender, environment = call.sender, call.environment

    async def guarded(record: EpisodeRecord) -> None:
        try:
            await Episode(call, record, prompts[record.prompt_index]).run()
        except asyncio.CancelledError:
            raise
        except Exception as e:  # a bug or an unexpected answer: this episode's status, not the call's crash
            _errored(record, e)
        finally:
            sender.leave()  # no more turns from this one: a batch waiting for it need not
        if on_episode is not None:
            on_episode(record)

    async def whole(loop: Callable[[Any], Any]) -> None:
        try:
            await loop(LoopCall(call, prompts, out, on_episode))
        except asyncio.CancelledError:
            raise
        except Exception as e:  # a bug in the loop: every unfinished episode's status, not the call's crash
            for record in out:
                if record.status == "running":
                    _errored(record, e)

    if environment.loop is not None:  # the environment owns its loop: it fills the records
        tasks = [asyncio.ensure_future(whole(environment.loop))]
    else:
        tasks = [asyncio.ensure_future(guarded(r)) for r in out]
    try:
        await gather_or_abort(sender.client, tasks, sender.in_flight)
    except BaseException:
        for r in out:
            if r.status == "running":
                r.status, r.error = "cancelled", "cancelled before it finished (Ctrl-C); its request was aborted"
        raise
    finally:
        await sender.close()  # batches whose waiters were cancelled (their rids are aborted above)
