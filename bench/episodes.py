"""Multi-turn episodes: `Engine.episodes` against two hand-written loops of the same turns.

Not a test. Owns the episodes benchmark: its workloads (chat prompts, an environment that answers
every assistant turn with one fixed short user message and ends after `--turns` turns; see
"Workloads"), the timed methods (see "Methods"), the per-run analysis of the episodes' records
(requests per turn, prefix cache, rlgen's own time per turn, the wait after each environment step)
and the report. It also owns `RequestLog`, a wrapper of the Engine's HTTP client that timestamps
every /generate request of an episodes call, streamed or not (scripts/gpu/episodes_check.py uses it
too), and the two anchors, `lockstep` and `per_episode`, written without rlgen. Starts ONE server
with `rlgen.Engine(model, backend=...)` (or attaches to one: `--server URL`, e.g.
`_instant_server.py`), then, per workload, interleaved (`_common.run_interleaved`: one warm-up
each, then every repeat runs every method in a shuffled order, each after a prefix-cache flush),
then an EOS workload's timeline runs (below).

Workloads (`--workload`, comma-separated; several run one after the other on the same server):

    fixed         every turn exactly `--turn-tokens` tokens (ignore_eos), the environment answers at
                  once (`fixed_reply`); the workload of every run before 2026-12-05s
    eos           turns end at the model's EOS (at most `--max-new-tokens`, 256; nothing forces a
                  length), and each environment step first sleeps a latency drawn uniformly from
                  0-`--env-ms` (50 ms) (`StepLatency`)
    eos-longtail  the same, but a share `--tail-share` (5%) of the steps sleeps `--tail-s` (1 s)
                  instead: a slow tool

An EOS workload's latencies are drawn once, before any run, per (repeat, episode, turn), from a
fixed seed (`StepLatency.draw`): every method of a repeat meets the same latency at the same
episode and turn. Its episodes carry their index as data (`{"episode": e}`; e = chat x n + sample,
prompt-major), so rlgen's call is the chats repeated n times as prompts with n=1 (rlgen renders
each distinct chat once either way); the anchors give their episodes the same data. Every method's
environment is that one function, called after each assistant turn, the last one included (it
then answers "done"): `async def` with `asyncio.sleep`, or with `--sync-env` a plain function with
`time.sleep` (rlgen runs it on a worker thread; the anchors with `run_in_executor` on a pool of one
thread per episode, made once, outside the timing). It notes when each step ended
(`time.monotonic()`).

Methods (`--methods`; `generate` runs on the fixed workload only):

    episodes   eng.episodes(chats, env=..., n=N, max_turns=T, max_new_tokens=K, temperature=1,
               max_in_flight=<all episodes>) and its .df: the turns that are ready together sent
               as one batched /generate, streamed so each turn is answered when its own sample ends
               (the default; since fc02ac3)
    episodes-single  the same with batch_turns=False: one /generate request per turn
    episodes-split   the same, each turn's batch sent in parts of at most --split-batch turns (64),
               each part as soon as it is ready (an experiment: does sending the first part while
               the runner still reads the rest of the answer hide its time behind the server's?)
    lockstep   TRL's pattern (`lockstep`, plain aiohttp + orjson on the Engine's URL, no rlgen
               code): per turn ONE POST /generate of every episode's history as `input_ids` (one
               `sampling_params` for all, `return_logprob`), then (EOS workloads) every episode's
               environment step at once (asyncio.gather), then each history += the sampled ids (+
               EOS when the turn did not end with it) + the reply's template delta; the next turn's
               request waits for the slowest step: a barrier
    per-episode  verl's agent-loop pattern (`per_episode`, plain aiohttp + orjson): one asyncio
               task per episode, each looping: POST /generate of its own `input_ids` (one sample,
               `return_logprob`), its ids += the sampled ids (+ EOS), await its environment step,
               += the delta, next turn; no episode waits for another
    generate   eng.generate(<the same chats' first-turn ids>, n=N, max_new_tokens=T*K,
               ignore_eos=True, temperature=1, cache=False) and its .df: the same sampled tokens
               in ONE single-turn call (rlgen's default chunking)

Both anchors render each chat's first ids with the tokenizer and the fixed reply's template delta
once per run with `rlgen.episodes.message_delta_ids(tok, [reply])` (the reply is the same every
turn, so a hand-written loop renders it once; rlgen renders each episode's own), inside the timing
as the episodes are timed from the chats; both pause the cyclic GC while an answer is decoded, as
rlgen's client does. On the fixed workload they call no environment (its reply is constant and
instant); rlgen calls its `fixed_reply`. The per-episode loop's connector has no connection limit
(aiohttp's default of 100 would queue 256 episodes' requests).

The server's garbage collector is frozen once it is up, as rlgen does for every server it launches
(`rlgen.server._process`; SGLang's /freeze_gc): the record keeps the log lines that say so
(`server.gc_frozen`). Before that (2026-12-04p and earlier), generation-2 collections of 0.4-0.6 s
in SGLang's processes made the same call's time vary 15-30% between runs.

The anchors are turn-by-turn loops, not generate: a turn-by-turn loop pays SGLang's per-request
costs (admission, prefill, the answer of every sequence) once per turn, which no client can avoid;
what rlgen can be judged on is what it adds to such a loop, or saves over it.

Default sizes: 64 prompts x n=4 = 256 episodes x 4 assistant turns; fixed: x 64 tokens (65,536
sampled tokens per run, every method); EOS workloads: at most 256 tokens a turn, so the methods
sample different token counts and only tokens/s compares. `--eos`: the fixed workload's turns end
at the model's EOS (or at `--turn-tokens`), with no environment latency. --quick: 2 prompts x 2 x 4
turns x 4 tokens (8 at most on the EOS workloads; a smoke run on the CPU backend: its numbers mean
nothing).

Measured, per timed run (every repeat's raw numbers go to the JSON):

    tok_s            sampled tokens / wall time of the call (every method)
    requests per turn  the /generate requests that carried each turn's episodes (`turn_requests`;
                     the lockstep loop sends one per turn by construction)
    cached share     sum(cached_tokens) / sum(prompt_tokens) over the requests of turns 2..T
                     (the prefix cache serving each turn's history); `history_share` divides by
                     the tokens the previous request sent and sampled instead (the part a cache
                     can hold at all)
    rlgen's own time per turn, outside the server, as a share of the episode's wall time:
                     from the turns' `rlgen_s` when the runner records it; else (and always, for
                     comparison) from `RequestLog`: per episode, the time before its first request
                     (since the call began) plus, between turns, the time from an answer's arrival
                     to the next request's send, less the environment's step (`latency_s` of the
                     env turn). The episode's wall time is the call's start to its last answer.
                     Inside a request's span (and so counted as the server's) are rlgen's HTTP
                     client's request encoding and answer decoding: `transport` (the span less
                     SGLang's `e2e_latency`) is reported beside it.
    wait after env   (EOS workloads; `--timeline-runs`, 1, more runs of each method after the timed
                     ones, not judged) per episode and turn: from the end of its environment step
                     (noted by the environment, `time.monotonic()`) to the arrival of its next
                     request at the server. These runs go through `_timeline_proxy.py`, a pass-through
                     proxy in front of the same server that notes when each /generate body has
                     arrived and its rids (rlgen's from the records' turns, the anchors name theirs),
                     so every method is timed alike and without rlgen's internals; the hop is not in
                     the timed runs. Reported: p50, p99, max and the count over 100 ms (`waits`), and
                     the timeline itself (`timeline`: per episode, each step's end and each request's
                     arrival, seconds since the run's first arrival). In lockstep it is the barrier
                     (the slowest step of the turn, less one's own); an episode that waits for
                     another's slow tool shows here as ~`--tail-s`.

Targets, judged on 90% bootstrap intervals (`_common.Targets.check_interval`: PASS, FAIL, or NOISE
when the interval straddles the bound):

    fixed: episodes / lockstep, sampled tokens/s           >= 0.95x   (the headline)
    fixed: cached share of turns 2..T                      >= 90%
    fixed: rlgen's own time, % of the episode's wall time   < 5%
    eos, eos-longtail: episodes / the better of lockstep and per-episode (tok/s)  >= 1.0x
               (`versus_best`: the better anchor is the one of higher median; the interval
               resamples all three methods' runs, the better one chosen again in every draw)

Reported beside them, not judged: episodes / lockstep and / per-episode on every workload (ratio
of medians with its interval, and paired by repeat: the median of each repeat's ratio), episodes /
generate, lockstep / generate, episodes-single / lockstep, episodes / episodes-single.

    python bench/episodes.py --backend sglang --out episodes_bench.json        # the GPU machine
    python bench/episodes.py --backend sglang --workload fixed,eos,eos-longtail --methods episodes,lockstep,per-episode --out w.json
    python bench/episodes.py --backend cpu --quick --out /tmp/episodes.json    # smoke test anywhere
    python bench/episodes.py --report-only episodes_bench.json --out again.json
"""

from __future__ import annotations

import argparse
import asyncio
import math
import numbers
import random
import shlex
import statistics
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Executor, ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import _common as C

SIZES: dict[str, dict[str, int]] = {
    "full": {"prompts": 64, "n": 4, "turns": 4, "turn_tokens": 64, "max_new_tokens": 256, "warmup_prompts": 8},
    "quick": {"prompts": 2, "n": 2, "turns": 4, "turn_tokens": 4, "max_new_tokens": 8, "warmup_prompts": 1},
}
REPEATS = 11  # a run of each method takes 1-3 s on the H200 (65k tokens) at 135M
REPLY = "Continue."
TARGET_RATIO, TARGET_CACHED, TARGET_OWN_PCT = 0.95, 0.9, 5.0  # the ratio: episodes / lockstep (fixed)
TARGET_BEST = 1.0  # EOS workloads: episodes / the better of the two anchors
WORKLOADS = ("fixed", "eos", "eos-longtail")
ENV_MS, TAIL_SHARE, TAIL_S = 50.0, 0.05, 1.0  # the EOS workloads' step latencies
# "episodes": the turns that are ready together sent as one batched /generate (the default);
# "episodes-single": one request per turn (batch_turns=False), as before the batcher; "lockstep"
# and "per-episode": the hand-written loops, the anchors; "episodes-split": batches sent in parts.
METHODS = ("episodes", "episodes-single", "episodes-split", "lockstep", "per-episode", "generate")
DEFAULT_METHODS = ("episodes", "episodes-single", "lockstep", "per-episode", "generate")
ANCHORS = ("lockstep", "per-episode")
RLGEN_METHODS = ("episodes", "episodes-single", "episodes-split")


# ---------------------------------------------------------------------------------------------
# Workloads


def chats(count: int, *, seed: int = 5) -> list[list[dict[str, str]]]:
    """`count` one-message chats from _common's question templates (fixed seed)."""
    rng = random.Random(seed)
    return [[{"role": "user", "content": C._TEMPLATES[i % len(C._TEMPLATES)](rng)}] for i in range(count)]


def fixed_reply(turns: int, *, sync: bool = False) -> Callable[[list[dict[str, Any]]], Any]:
    """The environment: `REPLY` after every assistant turn, "done" after the `turns`-th. `async def`
    unless `sync` (a plain function, as users often write one: rlgen runs each step in a thread)."""
    def reply(messages: list[dict[str, Any]]) -> str:
        return "done" if sum(m["role"] == "assistant" for m in messages) >= turns else REPLY

    async def env(messages: list[dict[str, Any]]) -> str:
        return reply(messages)

    return reply if sync else env


class StepLatency:
    """The EOS workloads' environment: `REPLY` after every assistant turn and "done" after the
    `turns`-th, each step first sleeping its latency, `draw(repeat, episode, turn)`: uniform in
    0-`env_s`, or, with `tail_share`, `tail_s` for that share of the steps (seeded by the four
    numbers, so every method meets the same latencies). All of them are drawn at construction,
    for `repeats` repeats and the warm-up (repeat -1) of `episodes` episodes, so a step only looks
    its own up. `function` is the environment every method calls, `env(messages, data)` with data
    `{"episode": e}`: `async def` (asyncio.sleep), or a plain function (time.sleep) if `sync`.
    `begin(repeat)` before each run; `ended[(episode, turn)]` is when each step of the run returned
    (`time.monotonic()`: CLOCK_MONOTONIC, which the timeline proxy's process reads too)."""

    def __init__(self, turns: int, *, episodes: int, repeats: int, env_s: float = ENV_MS / 1e3,
                 tail_share: float = 0.0, tail_s: float = TAIL_S, sync: bool = False, seed: int = 0) -> None:
        self.turns, self.env_s, self.tail_share, self.tail_s, self.seed = turns, env_s, tail_share, tail_s, seed
        self.sync = sync
        self.table = {r: [[self.draw(r, e, t) for t in range(1, turns + 1)] for e in range(episodes)]
                      for r in range(-1, repeats)}
        self.repeat = -1
        self.ended: dict[tuple[int, int], float] = {}
        self.function = self._function()

    def draw(self, repeat: int, episode: int, turn: int) -> float:
        rng = random.Random(f"{self.seed}:{repeat}:{episode}:{turn}")
        if self.tail_share and rng.random() < self.tail_share:
            return self.tail_s
        return rng.uniform(0.0, self.env_s)

    def latency(self, episode: int, turn: int) -> float:
        rows = self.table.get(self.repeat)
        if rows is not None and episode < len(rows) and 1 <= turn <= len(rows[episode]):
            return rows[episode][turn - 1]
        return self.draw(self.repeat, episode, turn)

    def begin(self, repeat: int) -> None:
        self.repeat, self.ended = repeat, {}

    def _function(self) -> Callable[..., Any]:
        turns = self.turns

        def answer(messages: list[dict[str, Any]], data: Mapping[str, Any]) -> tuple[int, int, float]:
            turn = sum(m["role"] == "assistant" for m in messages)
            return data["episode"], turn, self.latency(data["episode"], turn)

        def env(messages: list[dict[str, Any]], data: Mapping[str, Any]) -> str:
            episode, turn, seconds = answer(messages, data)
            time.sleep(seconds)
            self.ended[(episode, turn)] = time.monotonic()
            return "done" if turn >= turns else REPLY

        async def aenv(messages: list[dict[str, Any]], data: Mapping[str, Any]) -> str:
            episode, turn, seconds = answer(messages, data)
            await asyncio.sleep(seconds)
            self.ended[(episode, turn)] = time.monotonic()
            return "done" if turn >= turns else REPLY

        return env if self.sync else aenv

    def summary(self) -> dict[str, Any]:
        steps = [s for rows in self.table.values() for row in rows for s in row]
        return {"env_ms": 1e3 * self.env_s, "tail_share": self.tail_share, "tail_s": self.tail_s,
                "seed": self.seed, "sync": self.sync, "steps_drawn": len(steps),
                "tail_steps": sum(s == self.tail_s for s in steps) if self.tail_share else 0,
                "mean_ms": 1e3 * statistics.fmean(steps) if steps else None}


class Scenario:
    """One workload as the methods run it: its turns, each turn's token budget and whether EOS is
    ignored, and its environment (`StepLatency`; None: the fixed workload's `fixed_reply`). (Not a
    dataclass: the tests load this module from its path, unregistered, where dataclasses fail.)"""

    def __init__(self, name: str, turns: int, max_new_tokens: int, *, ignore_eos: bool,
                 latency: StepLatency | None = None) -> None:
        self.name, self.turns, self.max_new_tokens = name, turns, max_new_tokens
        self.ignore_eos, self.latency = ignore_eos, latency

    @property
    def sampling(self) -> dict[str, Any]:
        """The anchors' sampling_params (rlgen sends its own from the same options)."""
        return {"max_new_tokens": self.max_new_tokens, "temperature": 1.0,
                **({"ignore_eos": True} if self.ignore_eos else {})}


# ---------------------------------------------------------------------------------------------
# The hand-written anchors: every episode's turn k in one batched /generate (TRL's pattern), and
# one asyncio task per episode (verl's agent loop)


def _first_ids(chats: Sequence[Sequence[Mapping[str, Any]]], tokenizer: Any) -> list[list[int]]:
    return [list(tokenizer.apply_chat_template([dict(m) for m in chat], add_generation_prompt=True, tokenize=True,
                                               return_dict=False)) for chat in chats]


async def _env_step(env: Callable[..., Any], messages: list[dict[str, Any]], data: Any,
                    pool: Executor | None) -> Any:
    """One environment step as the anchors take it: awaited if `async def`, else on `pool`."""
    if pool is None:
        return await env(messages, data)
    return await asyncio.get_running_loop().run_in_executor(pool, env, messages, data)



async def lockstep(url: str, chats: Sequence[Sequence[Mapping[str, Any]]], tokenizer: Any, *, n: int, turns: int,
                   sampling: dict[str, Any], reply: str, env: Callable[..., Any] | None = None,
                   data: Sequence[Any] | None = None, pool: Executor | None = None,
                   rid: str | None = None) -> tuple[int, list[int]]:
    """What a user writes without rlgen (~40 lines of aiohttp, TRL's pattern), timed from the chats
    as an episodes call is: each chat's ids rendered by the tokenizer (n histories a chat,
    prompt-major) and the fixed reply's template delta rendered once (the reply is the same every
    turn); then per turn ONE POST /generate of every running history as `input_ids` (one
    `sampling_params` for all, `return_logprob`); with `env`, every running episode's step at once
    (`asyncio.gather`; a sync `env` on `pool`), the episode given `data[e]` and its messages (the
    answer's text as the assistant's), ending where it says "done"; and each history += the sampled
    ids, + EOS when the turn did not end with it, + the delta. JSON by orjson, as rlgen's client;
    the cyclic GC paused while an answer is decoded, as rlgen's client does. `rid`: each item's rid
    is `f"{rid}{e}-{turn}"` (episode e, turn 0, 1, ...; none without it). Returns (sampled tokens,
    samples per request)."""

    import aiohttp

    from rlgen.episodes import message_delta_ids

    eos = tokenizer.eos_token_id
    delta = message_delta_ids(tokenizer, [{"role": "user", "content": reply}])
    first = _first_ids(chats, tokenizer)
    ids = [list(f) for f in first for _ in range(n)]
    messages = [[dict(m) for m in chat] for chat in chats for _ in range(n)] if env is not None else []
    logprobs: list[list[Any]] = [[] for _ in ids]  # kept, as a trainer needs them
    running = list(range(len(ids)))
    sampled, sizes = 0, []
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None)) as session:
        for turn in range(turns):
            payload = {"input_ids": [ids[e] for e in running], "sampling_params": sampling, "return_logprob": True}
            if rid is not None:
                payload["rid"] = [f"{rid}{e}-{turn}" for e in running]
            answers = await C.post_generate(session, url, payload)
            if not isinstance(answers, list) or len(answers) != len(running):
                raise RuntimeError(f"/generate answered {type(answers).__name__} for {len(running)} histories")
            sizes.append(len(answers))
            for e, answer in zip(running, answers):
                out = answer["output_ids"]
                sampled += len(out)
                logprobs[e].extend(answer["meta_info"]["output_token_logprobs"])
                if env is not None:
                    messages[e].append({"role": "assistant", "content": answer["text"]})
            if env is not None:
                said = await asyncio.gather(*(_env_step(env, messages[e], data[e] if data else None, pool)
                                              for e in running))
                going = []
                for e, answer, reply_e in zip(running, answers, said):
                    if reply_e is None or reply_e == "done":
                        continue
                    messages[e].append({"role": "user", "content": reply_e})
                    going.append(e)
                    out = answer["output_ids"]
                    ids[e] += out + ([] if out and out[-1] == eos else [eos]) + _delta_of(tokenizer, reply_e, reply, delta)
                running = going
                if not running:
                    break
            elif turn + 1 < turns:
                for e, answer in zip(running, answers):
                    out = answer["output_ids"]
                    ids[e] += out + ([] if out and out[-1] == eos else [eos]) + delta
    return sampled, sizes


def _delta_of(tokenizer: Any, said: str, reply: str, delta: list[int]) -> list[int]:
    """The template delta of the environment's reply: the one rendered once when it is the fixed
    reply (always, in this bench), else rendered now."""
    if said == reply:
        return delta
    from rlgen.episodes import message_delta_ids

    return message_delta_ids(tokenizer, [{"role": "user", "content": said}])


async def per_episode(url: str, chats: Sequence[Sequence[Mapping[str, Any]]], tokenizer: Any, *, n: int, turns: int,
                      sampling: dict[str, Any], reply: str, env: Callable[..., Any] | None = None,
                      data: Sequence[Any] | None = None, pool: Executor | None = None,
                      rid: str | None = None) -> tuple[int, list[int]]:
    """What a user writes without rlgen in verl's agent-loop pattern (~40 lines of aiohttp): the
    same ids and delta as `lockstep` (rendered alike, inside the timing), then one asyncio task per
    episode, each looping: POST /generate of its own history as `input_ids` (one sample,
    `return_logprob`); += the sampled ids (+ EOS when the turn did not end with it); with `env`,
    await its own step (`data[e]`, its messages; a sync `env` on `pool`), ending where it says
    "done"; += the delta; the next turn. No episode waits for another. One session whose connector
    has no connection limit (aiohttp's default, 100, would queue the episodes' requests); orjson,
    and the GC paused while an answer is decoded, as `lockstep`. `rid` as `lockstep`'s. Returns
    (sampled tokens, samples per request: 1s)."""

    import aiohttp

    from rlgen.episodes import message_delta_ids

    eos = tokenizer.eos_token_id
    delta = message_delta_ids(tokenizer, [{"role": "user", "content": reply}])
    first = _first_ids(chats, tokenizer)
    starts = [(chat, f) for chat, f in zip(chats, first) for _ in range(n)]
    sampled = [0] * len(starts)
    requests = [0] * len(starts)

    async def episode(e: int, chat: Sequence[Mapping[str, Any]], ids: list[int],
                      session: aiohttp.ClientSession) -> None:
        messages = [dict(m) for m in chat] if env is not None else []
        logprobs: list[Any] = []  # kept, as a trainer needs them
        for turn in range(turns):
            payload = {"input_ids": ids, "sampling_params": sampling, "return_logprob": True}
            if rid is not None:
                payload["rid"] = f"{rid}{e}-{turn}"
            answer = await C.post_generate(session, url, payload)
            if isinstance(answer, list) and len(answer) == 1:
                answer = answer[0]
            out = answer["output_ids"]
            sampled[e] += len(out)
            requests[e] += 1
            logprobs.extend(answer["meta_info"]["output_token_logprobs"])
            if env is not None:
                messages.append({"role": "assistant", "content": answer["text"]})
                said = await _env_step(env, messages, data[e] if data else None, pool)
                if said is None or said == "done":
                    return
                messages.append({"role": "user", "content": said})
                ids += out + ([] if out and out[-1] == eos else [eos]) + _delta_of(tokenizer, said, reply, delta)
            elif turn + 1 < turns:
                ids += out + ([] if out and out[-1] == eos else [eos]) + delta

    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=None)) as session:
        await asyncio.gather(*(episode(e, chat, list(ids), session) for e, (chat, ids) in enumerate(starts)))
    return sum(sampled), [1] * sum(requests)
# ---------------------------------------------------------------------------------------------
# Timestamps of an episodes call's requests


class RequestLog:
    """Wraps an Engine's HTTP client (`eng._client`) while `installed`: every /generate request is
    timed (send, answer) and keyed by its rid (rlgen names every sample; the records keep each
    turn's), else by hash(input_ids + output_ids), which is the episode's ids up to the end of that
    turn's sampled tokens, so that requests are matched to records afterwards whatever list objects
    the runner passed. A streamed request (`generate_stream`: rlgen's batched turns since fc02ac3)
    is answered item by item: each item's answer time is when its last chunk (the one with a finish
    reason) came. The timed call keeps only references to the payload's and the answer's id lists
    (neither changes afterwards: the runner sends a copy of its ids); `entries` hashes them when
    read, after the timing, so that the log adds no per-token work to the call it times. Also
    counts requests in flight (`peak`)."""

    def __init__(self, client: Any) -> None:
        self._client = client
        # (sent, answered, input ids, output ids or None, SGLang's e2e_latency or None, rid or None,
        # output length): `entries` once read
        self._kept: list[tuple[float, float, list[int], list[int] | None, float | None, Any, int]] = []
        self.sizes: list[int] = []  # samples per HTTP request, in order (`entries` has one per sample)
        self.in_flight = 0
        self.peak = 0
        # One dict per batched request (`batch_stamps`): where a batched turn's time went.
        self.batches: list[dict[str, Any]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)

    @staticmethod
    def _items(payload: dict[str, Any]) -> tuple[list[Any], list[Any]]:
        ids = payload.get("input_ids")
        inputs = ids if isinstance(ids, list) and ids and isinstance(ids[0], list) else [ids]
        rid = payload.get("rid")
        return inputs, rid if isinstance(rid, list) else [rid] * len(inputs)

    def _keep(self, sent: float, answered: float, item: Any, one: Any, rid: Any) -> None:
        out = one.get("output_ids") if isinstance(one, dict) else None
        meta = (one.get("meta_info") or {}) if isinstance(one, dict) else {}
        if isinstance(item, list) and (isinstance(out, list) or isinstance(rid, str)):
            e2e = meta.get("e2e_latency")
            length = len(out) if isinstance(out, list) else int(meta.get("completion_tokens") or 0)
            self._kept.append((sent, answered, item, out, float(e2e) if isinstance(e2e, (int, float)) else None,
                               rid if isinstance(rid, str) else None, length))

    async def generate(self, payload: dict[str, Any]) -> Any:
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        sent, wall_sent = time.perf_counter(), time.time()
        try:
            answer = await self._client.generate(payload)
        finally:
            self.in_flight -= 1
        answered = time.perf_counter()
        if isinstance(answer, list) and len(answer) > 1:
            self.batches.append(batch_stamps(answer, sent, answered, wall_sent, time.time()))
        answers = answer if isinstance(answer, list) else [answer]
        self.sizes.append(len(answers))
        inputs, rids = self._items(payload)
        for one, item, rid in zip(answers, inputs, rids):  # a batch's samples share its send and answer times
            self._keep(sent, answered, item, one, rid)
        return answer

    async def generate_stream(self, payload: dict[str, Any]) -> Any:
        """The client's streamed /generate, passed through chunk by chunk; each item's answer time is
        its finishing chunk's arrival (read before the chunk is handed on: the runner changes it), and
        the item is logged then: the runner may stop reading (closing its sender) once every item
        has its answer, before the stream's own end."""
        inputs, rids = self._items(payload)
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        self.sizes.append(len(inputs))
        sent, wall_sent = time.perf_counter(), time.time()
        finals: dict[int, tuple[float, dict[str, Any]]] = {}
        try:
            async for chunk in self._client.generate_stream(payload):
                if isinstance(chunk, dict):
                    index, meta = chunk.get("index", 0), chunk.get("meta_info") or {}
                    if isinstance(index, int) and meta.get("finish_reason") is not None:
                        out = chunk.get("output_ids")
                        finals[index] = answered, one = (time.perf_counter(), {
                            "meta_info": dict(meta),
                            "output_ids": out if isinstance(out, list) and len(out) == meta.get("completion_tokens")
                            else None})
                        if index < len(inputs):
                            self._keep(sent, answered, inputs[index], one, rids[index])
                yield chunk
        finally:
            self.in_flight -= 1
            if len(inputs) > 1 and finals:
                last = max(t for t, _ in finals.values())
                self.batches.append(batch_stamps([one for _, one in finals.values()], sent, last, wall_sent,
                                                 wall_sent + last - sent))

    @property
    def entries(self) -> list[tuple[float, float, Any, int, int, float | None]]:
        """Per sample: (sent, answered, key, input length, output length, SGLang's e2e_latency or
        None); the key is the sample's rid where it had one, else hash(input ids + output ids)."""
        return [(sent, answered, rid if rid is not None else hash((*item, *(out or ()))), len(item), length, e2e)
                for sent, answered, item, out, e2e, rid, length in self._kept]

    @contextmanager
    def installed(self, eng: Any) -> Iterator[RequestLog]:
        """The Engine's connection sends through this log for the block (its own client again after it)."""
        original = eng._conn.client
        eng._conn.client = self
        try:
            yield self
        finally:
            eng._conn.client = original


# SGLang's per-request timestamps (wall clock, seconds) in meta_info when the server runs with
# --enable-metrics (0.5.17: tokenizer_manager / observability.req_time_stats).
STAMPS = ("request_received_ts", "api_server_dispatch_finish_ts", "forward_entry_time", "prefill_finished_time",
          "request_finished_ts")


def batch_stamps(answer: Sequence[Any], sent: float, answered: float, wall_sent: float, wall_answered: float
                 ) -> dict[str, Any]:
    """One batched request's timing: its size, the client's send and answer times (perf_counter and
    wall clock), SGLang's e2e_latency (max over items) and, where the server gave them, each
    --enable-metrics timestamp's min and max over the batch's items."""
    metas = [a.get("meta_info") or {} for a in answer if isinstance(a, dict)]
    out: dict[str, Any] = {"n": len(answer), "sent": sent, "answered": answered, "wall_sent": wall_sent,
                           "wall_answered": wall_answered}
    e2e = [float(m["e2e_latency"]) for m in metas if isinstance(m.get("e2e_latency"), (int, float))]
    out["e2e_max"] = max(e2e) if e2e else None
    for key in STAMPS:
        vals = [float(m[key]) for m in metas if isinstance(m.get(key), (int, float)) and m[key] > 0]
        out[key] = (min(vals), max(vals)) if vals else None
    return out


PHASES = ("upload", "tokenizer", "queue", "prefill", "decode", "answer", "span", "e2e", "client")


def turn_phases(batches: Sequence[dict[str, Any]]) -> list[dict[str, float | None]]:
    """Where each batched request's time went, in milliseconds, in order (SGLang's stamps where it
    gave them, else None):

        upload     client send -> SGLang received the first item (HTTP, request JSON)
        tokenizer  first item received -> last item dispatched to the scheduler
        queue      last dispatched -> last item's first forward (waiting to be scheduled)
        prefill    last first forward -> last prefill finished
        decode     last prefill finished -> last item finished (as the tokenizer manager saw it)
        answer     last item finished -> the client holds the parsed answer (response, HTTP, JSON)
        span       client send -> parsed answer; e2e: SGLang's largest e2e_latency
        client     this answer -> the next batch's send (the runner and the environment; None for the last)
    """
    out: list[dict[str, float | None]] = []
    for i, b in enumerate(batches):
        def ms(a: float | None, z: float | None) -> float | None:
            return 1e3 * (z - a) if a is not None and z is not None else None
        rec, disp, fwd, pre, fin = (b.get(k) for k in STAMPS)
        nxt = batches[i + 1]["sent"] if i + 1 < len(batches) else None
        out.append({
            "n": b["n"], "upload": ms(b["wall_sent"], rec[0] if rec else None),
            "tokenizer": ms(rec[0] if rec else None, disp[1] if disp else None),
            "queue": ms(disp[1] if disp else None, fwd[1] if fwd else None),
            "prefill": ms(fwd[1] if fwd else None, pre[1] if pre else None),
            "decode": ms(pre[1] if pre else None, fin[1] if fin else None),
            "answer": ms(fin[1] if fin else None, b["wall_answered"]),
            "span": ms(b["sent"], b["answered"]), "e2e": 1e3 * b["e2e_max"] if b.get("e2e_max") is not None else None,
            "client": ms(b["answered"], nxt) if nxt is not None and nxt >= b["answered"] else None,
        })
    return out


def _assistant_spans(roles: Sequence[str]) -> list[tuple[int, int]]:
    spans: list[tuple[int, int]] = []
    for i, role in enumerate(roles):
        if role != "assistant":
            continue
        if spans and spans[-1][1] == i:
            spans[-1] = (spans[-1][0], i + 1)
        else:
            spans.append((i, i + 1))
    return spans


def episode_times(records: Sequence[Any], log: RequestLog | None, t0: float) -> list[dict[str, Any] | None]:
    """Per record (None where its requests cannot all be found in `log`): `sent` and `answered`
    times of each assistant turn's request since `t0`, the `env_s` of the environment step after
    each turn, `before_first_s`, `between_s` (answer to the next send, less the environment's step,
    per gap), `own_s` (their sum), `wall_s` (t0 to the last answer) and `transport_s` per turn
    (request span less SGLang's e2e_latency, where it said)."""
    if log is None:
        return [None] * len(records)
    by_key: dict[Any, list[tuple[float, float, Any, int, int, float | None]]] = {}
    for entry in log.entries:
        by_key.setdefault(entry[2], []).append(entry)
    out: list[dict[str, Any] | None] = []
    for r in records:
        spans = _assistant_spans(r.roles)
        rids = [t.get("rid") for t in r.turns if t.get("role") == "assistant"]
        found = []
        for k, (_, end) in enumerate(spans):
            rid = rids[k] if k < len(rids) else None
            candidates = by_key.get(rid) if rid in by_key else by_key.get(hash(tuple(r.ids[:end])))
            if not candidates:
                break
            found.append(candidates.pop(0))
        env_turns = [t for t in r.turns if t.get("role") == "env"]
        if not spans or len(found) != len(spans):
            out.append(None)
            continue
        sent = [e[0] - t0 for e in found]
        answered = [e[1] - t0 for e in found]
        env_s = [float(t.get("latency_s") or 0.0) for t in env_turns]
        between = [sent[k + 1] - answered[k] - (env_s[k] if k < len(env_s) else 0.0) for k in range(len(found) - 1)]
        out.append({"sent": sent, "answered": answered, "env_s": env_s, "before_first_s": sent[0], "between_s": between,
                    "own_s": sent[0] + sum(between), "wall_s": answered[-1],
                    "transport_s": [e[1] - e[0] - e[5] if e[5] is not None else None for e in found]})
    return out


# ---------------------------------------------------------------------------------------------
# Per-run analysis


def cache_shares(records: Sequence[Any]) -> dict[str, Any]:
    """The prefix cache over the requests of turns 2.. (all episodes of one run): cached / prompt
    tokens sent, cached / history tokens (the previous request's prompt and sampled tokens), and
    the cached share per turn index."""
    cached = prompt = history = 0
    per_turn: dict[int, list[int]] = {}
    for r in records:
        turns = [t for t in r.turns if t.get("role") == "assistant"]
        for k in range(1, len(turns)):
            c, p = int(turns[k].get("cached_tokens") or 0), int(turns[k].get("prompt_tokens") or 0)
            cached, prompt = cached + c, prompt + p
            history += int(turns[k - 1].get("prompt_tokens") or 0) + int(turns[k - 1].get("tokens") or 0)
            per_turn.setdefault(k + 1, [0, 0])
            per_turn[k + 1][0] += c
            per_turn[k + 1][1] += p
    return {"cached_tokens": cached, "prompt_tokens": prompt, "history_tokens": history,
            "share": cached / prompt if prompt else None, "history_share": cached / history if history else None,
            "per_turn": {str(k): c / p if p else None for k, (c, p) in sorted(per_turn.items())}}


def own_time(records: Sequence[Any], times: Sequence[dict[str, Any] | None]) -> dict[str, Any]:
    """rlgen's own time: from the turns' `rlgen_s` (source "rlgen_s") when they have it, and from
    the request timestamps (source "requests"); each as total seconds, % of the episodes' summed
    wall time, the median per episode and per turn."""
    out: dict[str, Any] = {}
    timed = [(r, t) for r, t in zip(records, times) if t is not None]
    out["episodes_timed"] = len(timed)
    if timed:
        own = [t["own_s"] for _, t in timed]
        wall = [t["wall_s"] for _, t in timed]
        gaps = [g for _, t in timed for g in t["between_s"]]
        transport = [x for _, t in timed for x in t["transport_s"] if x is not None]
        out["requests"] = {
            "own_s": sum(own), "wall_s": sum(wall), "pct": 100 * sum(own) / sum(wall) if sum(wall) > 0 else None,
            "episode_pct_median": statistics.median(100 * o / w for o, w in zip(own, wall) if w > 0) if any(wall) else None,
            "before_first_ms_median": 1e3 * statistics.median(t["before_first_s"] for _, t in timed),
            "between_turns_ms_median": 1e3 * statistics.median(gaps) if gaps else None,
            "between_turns_ms_p90": 1e3 * sorted(gaps)[int(0.9 * (len(gaps) - 1))] if gaps else None,
            "transport_ms_median": 1e3 * statistics.median(transport) if transport else None,
            "wall_s_median": statistics.median(wall),
        }
    with_field = [r for r in records if any(t.get("rlgen_s") is not None for t in r.turns)]
    if with_field:
        per_episode = [sum(float(t["rlgen_s"]) for t in r.turns if t.get("rlgen_s") is not None) for r in with_field]
        per_turn = [float(t["rlgen_s"]) for r in with_field for t in r.turns if t.get("rlgen_s") is not None]
        stamped = {id(rec): x for rec, x in zip(records, times) if x is not None}
        walls: list[float] = []
        for r, spent in zip(with_field, per_episode):
            if id(r) in stamped:
                walls.append(stamped[id(r)]["wall_s"])
            else:  # no timestamps: the episode's own spans, a lower bound of its wall time
                walls.append(sum(float(x.get("latency_s") or 0.0) for x in r.turns) + spent)
        out["rlgen_s"] = {"own_s": sum(per_episode), "wall_s": sum(walls),
                          "pct": 100 * sum(per_episode) / sum(walls) if sum(walls) > 0 else None,
                          "per_turn_ms_median": 1e3 * statistics.median(per_turn)}
    out["source"] = "rlgen_s" if with_field else ("requests" if timed else None)
    return out


def turn_requests(times: Sequence[dict[str, Any] | None]) -> list[list[int]]:
    """Per assistant turn (1, 2, ...): the sizes of the /generate requests that carried it, largest
    first (the episodes whose turn k left at the same send time went in one request)."""
    per_turn: dict[int, Counter[float]] = {}
    for t in times:
        for k, sent in enumerate(t["sent"] if t else []):
            per_turn.setdefault(k, Counter())[sent] += 1
    return [sorted(per_turn[k].values(), reverse=True) for k in sorted(per_turn)]


def analyse(records: Sequence[Any], log: RequestLog | None, t0: float, *, turns: int, turn_tokens: int
            ) -> dict[str, Any]:
    """What one episodes run shows: statuses, sampled tokens against the expected, the cache, rlgen's
    own time (with per-episode raw numbers)."""
    times = episode_times(records, log, t0)
    expected = turns * turn_tokens
    sampled = [int(r.sampled_tokens) for r in records]
    return {
        "episodes": len(records),
        "statuses": dict(Counter(r.status for r in records)),
        "turns": dict(Counter(len([t for t in r.turns if t.get("role") == "assistant"]) for r in records)),
        "sampled_tokens": sum(sampled), "short_episodes": sum(s != expected for s in sampled),
        "requests": len(log.sizes) if log is not None else None, "peak_in_flight": log.peak if log is not None else None,
        "turn_requests": turn_requests(times),
        "cache": cache_shares(records),
        "phases": turn_phases(log.batches) if log is not None else [],
        "own": own_time(records, times),
        "per_episode": {"own_s": [round(t["own_s"], 6) if t else None for t in times],
                        "wall_s": [round(t["wall_s"], 6) if t else None for t in times],
                        "between_s": [[round(g, 6) for g in t["between_s"]] if t else None for t in times]},
    }


def wrong_outcome(details: Sequence[dict[str, Any]], expected_statuses: str = "done", *, exact_tokens: bool = True
                  ) -> str | None:
    """Why the episode runs measured the wrong thing (episodes not all ending as expected, or, with
    `exact_tokens` (ignore_eos), short of the expected tokens), else None."""
    problems = []
    for i, d in enumerate(details):
        bad = {s: n for s, n in d["statuses"].items() if s != expected_statuses}
        if bad:
            problems.append(f"run {i}: statuses {bad}")
        if exact_tokens and d["short_episodes"]:
            problems.append(f"run {i}: {d['short_episodes']} episodes short of the expected tokens")
    return "; ".join(problems[:3]) if problems else None


# ---------------------------------------------------------------------------------------------
# The wait after each environment step


def _percentile(values: Sequence[float], q: float) -> float:
    """The nearest-rank q-quantile (0 < q <= 1) of non-empty `values`."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def waits(arrived: Sequence[Sequence[float | None] | None], ended: Mapping[tuple[int, int], float], *,
          source: str) -> dict[str, Any]:
    """The wait after each environment step: for episode e and assistant turn k (1-based) whose
    step ended at `ended[(e, k)]` and whose request for turn k+1 arrived at the server at
    `arrived[e][k]` (0-based: the request of turn k+1; time.monotonic()), the seconds between the
    two. Its p50, p99, max, mean, how many exceed 100 ms, per turn (the turn of the request that
    waited: 2..T) its p50 and max, and the timeline itself (`timeline`: per episode, `arrived` and
    `env_end` in seconds since the run's first arrival, 0.1 ms; None where a request was not
    seen). `source` says where the arrivals came from."""
    gaps: list[float] = []
    per_turn: dict[int, list[float]] = {}
    firsts = [t for times in arrived if times for t in times[:1] if t is not None]
    origin = min(firsts) if firsts else 0.0
    timeline: dict[str, list[list[float | None]]] = {"arrived": [], "env_end": []}
    by_episode = _ended_by_episode(ended)
    for e, times in enumerate(arrived):
        times = times or []
        ends = by_episode.get(e, {})
        timeline["arrived"].append([None if t is None else round(t - origin, 4) for t in times])
        timeline["env_end"].append([round(ends[k] - origin, 4) for k in sorted(ends)])
        for k in range(1, len(times)):
            end, t = ends.get(k), times[k]
            if end is None or t is None:
                continue
            gaps.append(t - end)
            per_turn.setdefault(k + 1, []).append(t - end)
    out: dict[str, Any] = {"source": source, "n": len(gaps), "episodes": sum(1 for t in arrived if t)}
    if gaps:
        out.update(p50_ms=1e3 * _percentile(gaps, 0.5), p99_ms=1e3 * _percentile(gaps, 0.99),
                   max_ms=1e3 * max(gaps), mean_ms=1e3 * statistics.fmean(gaps),
                   over_100ms=sum(g > 0.1 for g in gaps),
                   per_turn={str(k): {"p50_ms": 1e3 * _percentile(v, 0.5), "max_ms": 1e3 * max(v)}
                             for k, v in sorted(per_turn.items())})
    out["timeline"] = timeline
    return out


def _ended_by_episode(ended: Mapping[tuple[int, int], float]) -> dict[int, dict[int, float]]:
    out: dict[int, dict[int, float]] = {}
    for (e, k), t in ended.items():
        out.setdefault(e, {})[k] = t
    return out


def record_arrivals(records: Sequence[Any], arrived: Mapping[str, float], episodes: int
                    ) -> list[list[float | None] | None]:
    """Per episode (its data's `episode`), when each of its assistant turns' requests arrived at the
    server, by the turn's rid (`arrived`: rid -> time; None where the rid was not seen)."""
    out: list[list[float | None] | None] = [None] * episodes
    for r in records:
        e = r.data.get("episode") if isinstance(r.data, Mapping) else None  # a numpy int, read back from the rows
        if isinstance(e, numbers.Integral) and 0 <= int(e) < episodes:
            out[int(e)] = [arrived.get(t.get("rid")) for t in r.turns if t.get("role") == "assistant"]
    return out


def anchor_arrivals(prefix: str, arrived: Mapping[str, float], episodes: int, turns: int
                    ) -> list[list[float | None] | None]:
    """The same for an anchor that named its items `f"{prefix}{e}-{turn}"`."""
    out: list[list[float | None] | None] = []
    for e in range(episodes):
        times = [arrived.get(f"{prefix}{e}-{k}") for k in range(turns)]
        while times and times[-1] is None:
            times.pop()
        out.append(times or None)
    return out


# ---------------------------------------------------------------------------------------------
# Measuring


def scenario_of(name: str, args: argparse.Namespace, size: Mapping[str, int], *, episodes: int,
                repeats: int) -> Scenario:
    """The workload `name` with the sizes and the command line's latencies (drawn for `repeats`
    repeats, the timeline runs' among them)."""
    T = size["turns"]
    if name == "fixed":
        return Scenario(name, T, size["turn_tokens"], ignore_eos=not args.eos)
    latency = StepLatency(T, episodes=episodes, repeats=repeats, env_s=args.env_ms / 1e3,
                          tail_share=args.tail_share if name == "eos-longtail" else 0.0, tail_s=args.tail_s,
                          sync=args.sync_env)
    return Scenario(name, T, size["max_new_tokens"], ignore_eos=False, latency=latency)


def describe(sc: Scenario, size: Mapping[str, int], sync_env: bool) -> str:
    n_ep = size["prompts"] * size["n"]
    head = f"{size['prompts']} chat prompts x n={size['n']} = {n_ep} episodes x {sc.turns} turns "
    if sc.latency is None:
        K = sc.max_new_tokens
        text = head + (f"x {K} tokens (ignore_eos, T=1)" if sc.ignore_eos else f"x up to {K} tokens (ending at EOS, T=1)")
        text += f"; the environment answers at once; generate: the same prompts, {sc.turns * K} tokens"
    else:
        lat = sc.latency
        text = head + f"x up to {sc.max_new_tokens} tokens (ending at EOS, T=1); each environment step sleeps "
        text += (f"{1e3 * lat.tail_s:g} ms for {100 * lat.tail_share:g}% of the steps, else " if lat.tail_share else "")
        text += f"uniform 0-{1e3 * lat.env_s:g} ms (seeded per repeat, episode and turn)"
    return text + ("; the environment a plain function" if sync_env else "")


class Tools:
    """What measuring keeps across workloads: the Engine, the sync environments' thread pool for the
    anchors, and (made on first use) the timeline proxy in front of the server with an Engine
    attached through it."""

    def __init__(self, eng: Any, pool: Executor | None) -> None:
        self.eng, self.pool = eng, pool
        self.proxy: Any = None
        self.proxy_url: str | None = None
        self.proxy_eng: Any = None

    def through_proxy(self) -> Any:
        if self.proxy_eng is None:
            self.proxy, self.proxy_url = start_helper("_timeline_proxy.py", self.eng.url)
            import rlgen

            self.proxy_eng = rlgen.Engine.connect(self.proxy_url, progress=False)
        return self.proxy_eng

    def arrivals(self) -> dict[str, float]:
        """rid -> when its request arrived at the proxy, for the requests since the last call."""
        import orjson

        status, body = C.http_request(self.proxy_url or "", "/_timeline", timeout=60)
        if status != 200:
            raise RuntimeError(f"the timeline proxy answered HTTP {status}")
        return {rid: t for t, rids in orjson.loads(body) for rid in rids if isinstance(rid, str)}

    def close(self) -> None:
        if self.proxy_eng is not None:
            self.proxy_eng.close()
        if self.proxy is not None:
            self.proxy.kill()
            self.proxy.wait()
        if self.pool is not None:
            self.pool.shutdown(wait=False)


def start_helper(script: str, *argv: str) -> tuple[Any, str]:
    """Start bench/<script> with `argv` and a free port (its last argument); (process, its URL) once
    its /health answers (the instant server's, or the upstream's through the proxy)."""
    import socket
    import subprocess
    import sys

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve().parent / script), *argv, str(port)])
    url = f"http://127.0.0.1:{port}"
    for _ in range(400):
        try:
            if C.http_request(url, "/health", timeout=2)[0] == 200:
                return proc, url
        except OSError:
            pass
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    proc.kill()
    raise RuntimeError(f"bench/{script} did not start")


def measure(args: argparse.Namespace, model: str, record: C.Record) -> None:
    import rlgen
    from rlgen.episodes import first_prompt_ids

    size = record["sizes"]
    attached = bool(args.server)
    t0 = time.monotonic()
    if attached:
        C.log(f"attaching to {args.server} (rlgen.Engine.connect) ...")
        eng = rlgen.Engine.connect(args.server, progress=False)
    else:
        C.log(f"starting rlgen.Engine({model!r}, backend={args.backend!r}) ...")
        eng = rlgen.Engine(model, backend=args.backend, progress=False, log_dir=C.logs_dir(args.out, "server"),
                           server_args=shlex.split(args.server_args))
    n_ep = size["prompts"] * size["n"]
    tools = Tools(eng, ThreadPoolExecutor(max_workers=n_ep, thread_name_prefix="anchor-env") if args.sync_env else None)
    try:
        record["server"] = {"start_s": time.monotonic() - t0, "url": eng.url, "attached": attached,
                            "argv": (eng.info or {}).get("command"),
                            "max_total_num_tokens": (eng.server_info or {}).get("max_total_num_tokens")}
        C.log(f"server ready in {record['server']['start_s']:.1f} s at {eng.url}")
        if not attached:  # rlgen freezes the garbage collector of a server it launches (server/_process)
            record["server"]["gc_frozen"] = frozen = gc_freeze_lines(C.logs_dir(args.out, "server"))
            C.log(f"server's GC frozen: {len(frozen)} processes" if frozen else "server's GC NOT frozen (no such log line)")
        prompts = chats(size["prompts"])
        ids = [first_prompt_ids(eng.tokenizer, chat) for chat in prompts]
        max_in_flight = args.max_in_flight or n_ep
        repeats = C.repeats_of(args)
        for name in args.workload:
            sc = scenario_of(name, args, size, episodes=n_ep, repeats=repeats + args.timeline_runs)
            K = sc.max_new_tokens
            wl = C.Workload(name=name, prompts=ids, n=size["n"], describe=describe(sc, size, args.sync_env),
                            options={"max_new_tokens": sc.turns * K, "temperature": 1.0, "ignore_eos": True})
            entry = record["workloads"][name] = {
                "workload": {**wl.summary(), "max_in_flight": max_in_flight, "reply": REPLY, "sync_env": args.sync_env,
                             "first_prompt_tokens": [len(p) for p in ids], "turns": sc.turns,
                             "max_new_tokens": K, "ignore_eos": sc.ignore_eos, "anchor_sampling": sc.sampling,
                             "latency": sc.latency.summary() if sc.latency else None},
                "results": {}}
            C.log(f"workload {name}: {wl.describe}")
            record.save()
            try:
                run_workload(tools, args, record, entry, sc, wl, prompts, max_in_flight=max_in_flight,
                             repeats=repeats)
                if sc.latency is not None and args.timeline_runs:
                    timeline_runs(tools, args, record, entry, sc, wl, prompts, max_in_flight=max_in_flight,
                                  first_repeat=repeats)
            except Exception as err:  # report what there is, go on with the next workload
                entry["error"] = f"{type(err).__name__}: {err}"
                C.log(f"workload {name} FAILED: {entry['error']}")
            record.save()
    finally:
        C.log("closing the server" if not attached else "detaching from the server")
        tools.close()
        eng.close()


def run_workload(tools: Tools, args: argparse.Namespace, record: C.Record, entry: dict[str, Any], sc: Scenario,
                 wl: C.Workload, prompts: Sequence[Any], *, max_in_flight: int, repeats: int) -> None:
    """One workload's interleaved runs; every run analysed and saved as it ends."""
    eng = tools.eng
    size = record["sizes"]
    pending: dict[str, Any] = {}
    methods = timed_methods(eng, prompts, pending, sc, max_in_flight=max_in_flight, sync_env=args.sync_env,
                            split_batch=args.split_batch, pool=tools.pool)
    methods = {name: run for name, run in methods.items() if name in args.methods}

    def after_each(partial: dict[str, Any]) -> None:
        name, got, log, start = pending.pop("last", (None, None, None, 0.0))
        runs = (partial.get(name) or {}).get("runs")
        if not runs:
            pass
        elif name in RLGEN_METHODS:
            runs[-1]["details"] = analyse(got.records, log, start, turns=sc.turns, turn_tokens=sc.max_new_tokens)
        elif name == "generate" and log is not None:
            runs[-1]["details"] = {"phases": turn_phases(log.batches)}
        elif name == "lockstep":
            runs[-1]["details"] = {"request_sizes": got}
        elif name == "per-episode":
            runs[-1]["details"] = {"requests": len(got)}
        entry["results"] = partial
        record.save()

    entry["results"] = C.run_interleaved(methods, wl, repeats=repeats, warmup=wl.head(size["warmup_prompts"]),
                                         before_each=lambda: C.flush_cache(eng.url), after_each=after_each)


def timeline_runs(tools: Tools, args: argparse.Namespace, record: C.Record, entry: dict[str, Any], sc: Scenario,
                  wl: C.Workload, prompts: Sequence[Any], *, max_in_flight: int, first_repeat: int) -> None:
    """After the timed runs of an EOS workload, `--timeline-runs` more of each method (not judged),
    through the timeline proxy: the same call against the same server, one localhost hop further,
    where each request's arrival is noted; every method's run r meets the latencies of repeat
    `first_repeat + r`. Each run's `waits` (from the environment's step ends and the arrivals, by
    rid) go to `entry["timeline"][method]`."""
    assert sc.latency is not None
    eng = tools.through_proxy()
    n_ep = record["sizes"]["prompts"] * record["sizes"]["n"]
    pending: dict[str, Any] = {}
    names = [m for m in ("episodes", "episodes-single", "episodes-split", "lockstep", "per-episode") if m in args.methods]
    methods = timed_methods(eng, prompts, pending, sc, max_in_flight=max_in_flight, sync_env=args.sync_env,
                            split_batch=args.split_batch, pool=tools.pool, first_repeat=first_repeat,
                            rid_prefix="timeline")
    out = entry["timeline"] = {}
    for r in range(args.timeline_runs):
        for name in names:
            C.flush_cache(eng.url)
            tools.arrivals()  # forget what came before
            t = time.perf_counter()
            served = methods[name](wl)
            seconds = time.perf_counter() - t
            arrived = tools.arrivals()
            _, got, _, _ = pending.pop("last")
            ended = sc.latency.ended
            if name in RLGEN_METHODS:
                per_episode_arrivals = record_arrivals(got.records, arrived, n_ep)
            else:
                per_episode_arrivals = anchor_arrivals(f"timeline-{name}-{calls_of(methods[name])}-", arrived, n_ep,
                                                       sc.turns)
            run = {"repeat": first_repeat + r, "seconds": seconds, "tokens": served.tokens,
                   "tok_s": served.tokens / seconds if seconds > 0 else None,
                   "waits": waits(per_episode_arrivals, ended, source="arrival at the server (timeline proxy)")}
            out.setdefault(name, []).append(run)
            w = run["waits"]
            C.log(f"  timeline {name:12s} run {r + 1}/{args.timeline_runs}: wait after env p50 "
                  f"{C.fmt(w.get('p50_ms'), '.1f')} ms, p99 {C.fmt(w.get('p99_ms'), '.1f')} ms, max "
                  f"{C.fmt(w.get('max_ms'), '.1f')} ms ({w['n']} waits)")
            record.save()


def calls_of(run: Callable[..., Any]) -> int:
    """How many times a method of `timed_methods` has run (its `calls` attribute)."""
    return int(getattr(run, "calls", 0))


def gc_freeze_lines(logs: Path) -> list[str]:
    """The server log's lines that say a process froze its garbage collector (SGLang's "Freezing GC
    in Scheduler process. gen0: ..."), from every log under `logs`."""
    if not logs.is_dir():
        return []
    return [line.strip() for path in sorted(logs.rglob("*.log"))
            for line in path.read_text(errors="replace").splitlines() if "Freezing GC in" in line]


@contextmanager
def split_batches(most: int | None) -> Iterator[None]:
    """While open, the episodes' turn batches hold at most `most` turns each (None: as rlgen sends
    them). An experiment's switch, not an option of rlgen's: it swaps the sender class the runner
    makes (`rlgen.episodes._runner.Sender`, since fc02ac3) for one whose `max_batch` is capped."""
    if most is None:
        yield
        return
    from rlgen.episodes import _runner

    limit = most
    original = getattr(_runner, "Sender")  # noqa: B009 - the runner's module, not its public surface

    class Split(original):  # type: ignore[misc,valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.max_batch = min(self.max_batch, limit)

    setattr(_runner, "Sender", Split)  # noqa: B010
    try:
        yield
    finally:
        setattr(_runner, "Sender", original)  # noqa: B010


def timed_methods(eng: Any, prompts: Sequence[Any], pending: dict[str, Any], sc: Scenario, *, max_in_flight: int,
                  sync_env: bool, split_batch: int = 64, pool: Executor | None = None, first_repeat: int = -1,
                  rid_prefix: str | None = None) -> dict[str, Callable[[C.Workload], C.Served]]:
    """The timed methods of one workload on one Engine; each leaves (name, what to analyse, its
    RequestLog, its start) in `pending["last"]` for `after_each`. Each counts its own calls (its
    `calls` attribute): the first meets the latencies of repeat `first_repeat` (-1: the warm-up),
    the next `first_repeat + 1`, ... (`StepLatency.begin`). `rid_prefix`: the anchors name their
    items `f"{rid_prefix}-{method}-{call}-{episode}-{turn}"` (`anchor_arrivals`)."""
    T, K, lat = sc.turns, sc.max_new_tokens, sc.latency
    env = lat.function if lat is not None else fixed_reply(T, sync=sync_env)

    def counted(run: Callable[[C.Workload], C.Served]) -> Callable[[C.Workload], C.Served]:
        def wrapped(w: C.Workload) -> C.Served:
            wrapped.calls += 1  # type: ignore[attr-defined]
            if lat is not None:
                lat.begin(first_repeat + wrapped.calls - 1)  # type: ignore[attr-defined]
            return run(w)
        wrapped.calls = 0  # type: ignore[attr-defined]
        return wrapped

    def episodes_of(name: str, batch_turns: bool, split: int | None = None) -> Callable[[C.Workload], C.Served]:
        def run(w: C.Workload) -> C.Served:
            chosen = prompts[: len(w.prompts)]
            if lat is None:
                call: dict[str, Any] = {"n": w.n}
            else:  # each episode its own prompt entry, its index as data: the same chats, prompt-major
                chosen = [chat for chat in chosen for _ in range(w.n)]
                call = {"n": 1, "data": [{"episode": e} for e in range(len(chosen))]}
            log = RequestLog(eng._client)
            start = time.perf_counter()
            with log.installed(eng), split_batches(split):
                res = eng.episodes(chosen, env=env, max_turns=T, max_new_tokens=K, temperature=1.0,
                                   ignore_eos=sc.ignore_eos, progress=False, max_in_flight=max_in_flight,
                                   batch_turns=batch_turns, **call)
            df = res.df
            pending["last"] = (name, res, log, start)  # its records are read after the timing
            return C.Served(int(df["sampled_tokens"].sum()))
        return counted(run)

    def anchor(name: str) -> Callable[[C.Workload], C.Served]:
        loop = lockstep if name == "lockstep" else per_episode

        def run(w: C.Workload) -> C.Served:
            chosen = prompts[: len(w.prompts)]
            extra: dict[str, Any] = {}
            if lat is not None:
                extra = {"env": env, "data": [{"episode": e} for e in range(len(chosen) * w.n)],
                         "pool": pool if sync_env else None}
            if rid_prefix is not None:
                extra["rid"] = f"{rid_prefix}-{name}-{counting.calls}-"  # type: ignore[attr-defined]
            sampled, sizes = asyncio.run(loop(eng.url, chosen, eng.tokenizer, n=w.n, turns=T, sampling=sc.sampling,
                                              reply=REPLY, **extra))
            pending["last"] = (name, sizes, None, 0.0)
            return C.Served(sampled)
        counting = counted(run)
        return counting

    def run_generate(w: C.Workload) -> C.Served:
        log = RequestLog(eng._client)
        with log.installed(eng):
            res = eng.generate(w.prompts, n=w.n, progress=False, cache=False, **w.options)
        df = res.df
        pending["last"] = ("generate", None, log, 0.0)
        return C.Served(int(df["completion_tokens"].sum()), C.server_span(df["request_latency_s"].tolist()))

    out = {"episodes": episodes_of("episodes", True), "episodes-single": episodes_of("episodes-single", False),
           "episodes-split": episodes_of("episodes-split", True, split_batch),
           "lockstep": anchor("lockstep"), "per-episode": anchor("per-episode")}
    if sc.name == "fixed":  # one single-turn call of the same tokens: only where every turn has K tokens
        out["generate"] = run_generate
    return out


# ---------------------------------------------------------------------------------------------
# Report


def _interval_of(values: Sequence[float]) -> tuple[float, float] | None:
    return C.bootstrap_median(values) if len(values) >= 3 else None


def _span(iv: tuple[float, float] | None, spec: str = ".3f") -> str:
    return f"{iv[0]:{spec}}-{iv[1]:{spec}}" if iv else "-"


def workloads_of(record: C.Record) -> dict[str, dict[str, Any]]:
    """The record's workloads, {name: {"workload", "results", ...}}; a record from before workloads
    (2026-12-05r and earlier: one `results`) is its one workload, "fixed"."""
    data = record.data
    if data.get("workloads"):
        return data["workloads"]  # type: ignore[no-any-return]
    if data.get("results"):
        data["workloads"] = {"fixed": {"workload": data.get("workload") or {}, "results": data["results"]}}
        return data["workloads"]  # type: ignore[no-any-return]
    return {}


def report(record: C.Record) -> None:
    workloads = workloads_of(record)
    if not any(entry.get("results") for entry in workloads.values()):
        print("nothing was measured" + (f": {record.data['error']}" if record.data.get("error") else ""), flush=True)
        return
    record["summary"], checks = {}, []
    for name, entry in workloads.items():
        checks.append(report_workload(record, name, entry))
    print("\ntargets", flush=True)
    targets = C.Targets()
    for check in checks:
        check(targets)
    record["targets"] = targets.rows


def report_workload(record: C.Record, name: str, entry: dict[str, Any]) -> Callable[[C.Targets], None]:
    """One workload's tables, ratios and waits (printed; its summary into the record); returns the
    check of its targets, run once every workload is printed."""
    results: dict[str, Any] = entry.get("results") or {}
    workload = entry.get("workload") or {}
    print(f"\n===== workload {name}: {workload.get('describe')}; max_in_flight {workload.get('max_in_flight')}",
          flush=True)
    if entry.get("error"):
        print(f"  ERROR {entry['error']}", flush=True)
    rows = []
    for method in METHODS:
        runs = (results.get(method) or {}).get("runs") or []
        if not runs and method not in results:
            continue
        toks = [r["tok_s"] for r in runs]
        rows.append([method, str(len(runs)), C.fmt(C.median_or_none(toks)), _span(_interval_of(toks), ",.0f"),
                     C.fmt(C.median_or_none([r["seconds"] for r in runs]), ".3f"),
                     C.fmt(C.median_or_none([r["tokens"] for r in runs]))])
    C.print_table(f"{name}: sampled tokens/s (medians of interleaved runs, each after a prefix-cache flush; 90% "
                  "bootstrap interval of the median)", ["method", "runs", "tok/s", "interval", "wall s", "tokens"], rows)
    for method in METHODS:
        if (results.get(method) or {}).get("error"):
            print(f"  ERROR {method}: {results[method]['error']}", flush=True)
    details = [r["details"] for r in (results.get("episodes") or {}).get("runs") or [] if r.get("details")]
    source = report_runs(results, details)
    summary = ratios(results, details, source)
    summary["waits"] = report_waits(entry.get("timeline") or {})
    record["summary"][name] = entry["summary"] = summary
    entry["comparisons"] = summary.pop("comparisons")
    eos = name != "fixed" or bool((record.data.get("args") or {}).get("eos"))
    wrong = wrong_outcome(details, exact_tokens=not eos)

    def check(targets: C.Targets) -> None:
        if name == "fixed":
            targets.check_interval("fixed: episodes / the hand-written lockstep loop of the same turns (tok/s)",
                                   summary["ratio"], summary["ratio_interval"], TARGET_RATIO, wrong=wrong)
            targets.check_interval("fixed: prefix-cache share of turns 2..T's prompt tokens", summary["cached_share"],
                                   summary["cached_share_interval"], TARGET_CACHED, unit="")
            targets.check_interval(f"fixed: rlgen's own time per episode, % of its wall time "
                                   f"({source or 'not measured'})", summary["own_pct"], summary["own_pct_interval"],
                                   TARGET_OWN_PCT, op="<", unit="%")
        else:
            targets.check_interval(f"{name}: episodes / the better hand-written loop "
                                   f"({summary.get('better_anchor') or 'none measured'}) (tok/s)",
                                   summary["ratio_best"], summary["ratio_best_interval"], TARGET_BEST, wrong=wrong)
    return check


def report_runs(results: dict[str, Any], details: Sequence[dict[str, Any]]) -> str | None:
    """The per-run tables (the episodes' cache, own time and requests per turn; each batched
    request's phases); returns the source of rlgen's own time."""
    source = next((d["own"]["source"] for d in details if d["own"].get("source")), None)
    per_turn_rows = []
    for i, d in enumerate(details):
        rq = d["own"].get("requests") or {}
        rs = d["own"].get("rlgen_s") or {}
        per_turn_rows.append([
            str(i), ",".join(f"{k}={v}" for k, v in d["statuses"].items()), str(d["peak_in_flight"]),
            " ".join(str(len(sizes)) for sizes in d.get("turn_requests") or []) or "-",
            C.fmt(d["cache"]["share"], ".3f"), " ".join(C.fmt(v, ".2f") for v in d["cache"]["per_turn"].values()),
            C.fmt(rq.get("pct"), ".2f"), C.fmt(rq.get("before_first_ms_median"), ".1f"),
            C.fmt(rq.get("between_turns_ms_median"), ".2f"), C.fmt(rq.get("between_turns_ms_p90"), ".2f"),
            C.fmt(rq.get("transport_ms_median"), ".2f"), C.fmt(rs.get("pct"), ".2f"),
            C.fmt(rs.get("per_turn_ms_median"), ".2f")])
    if details:
        C.print_table(
            "episodes, per timed run: requests = /generate requests per turn (turn 1, 2, ...); cached = cached/prompt "
            "tokens of turns 2.. (per turn: turn 2, 3, ...); own %: rlgen's own time / episode wall (from request "
            "timestamps); first ms: call start to an episode's first request (median); gap ms: answer to next "
            "request less the env step (median, p90); transport ms: request span less SGLang's e2e_latency (JSON + "
            "HTTP, counted as the server's); rlgen_s: the runner's own timing, where the records have it",
            ["run", "statuses", "peak", "requests", "cached", "per turn", "own %", "first ms", "gap ms", "gap p90",
             "transport ms", "rlgen_s %", "rlgen_s ms/turn"], per_turn_rows)
    phase_rows = []
    for name in ("episodes", "generate"):
        runs = [r["details"]["phases"] for r in (results.get(name) or {}).get("runs") or []
                if (r.get("details") or {}).get("phases")]
        for k in range(max((len(p) for p in runs), default=0)):
            at = [p[k] for p in runs if k < len(p)]
            cells = [C.fmt(C.median_or_none([a[key] for a in at if a.get(key) is not None]), ".1f")
                     for key in PHASES]
            phase_rows.append([name, str(k + 1), str(at[0]["n"]), str(len(at)), *cells])
    if phase_rows:
        C.print_table(
            "batched requests: where each one's time went, ms, median over timed runs (turn = the k-th batched "
            "request of a call; SGLang's stages need --enable-metrics; turn_phases() says what each column spans)",
            ["method", "turn", "size", "runs", *PHASES], phase_rows)
    note = {"rlgen_s": "from the turns' rlgen_s (the runner's own timing)",
            "requests": "rlgen_s is not in the records: measured from request timestamps (RequestLog): the time "
                        "before an episode's first request plus answer-to-next-request gaps, less the environment; "
                        "the HTTP client's encode/decode counts as the server's",
            None: "not measured"}[source]
    print(f"  rlgen's own time: {note}", flush=True)
    return source


def paired_ratios(results: dict[str, Any], ours: str, theirs: str) -> list[float]:
    """tok/s of `ours` over `theirs` within each repeat that ran both (one round of the interleaving):
    what a drift of the machine over minutes, which moves both alike, leaves out."""
    by_repeat = {run.get("repeat"): run["tok_s"] for run in results[theirs]["runs"]}
    return [run["tok_s"] / by_repeat[run["repeat"]] for run in results[ours]["runs"]
            if run.get("repeat") is not None and by_repeat.get(run["repeat"])]


def versus_best(results: dict[str, Any], ours: str = "episodes", anchors: Sequence[str] = ANCHORS, *,
                level: float = 0.9, draws: int = 4000, seed: int = 0) -> dict[str, Any] | None:
    """`ours` against the better of `anchors` (the one of higher median tok/s): the ratio of medians;
    its percentile bootstrap interval, every draw resampling each method's runs on their own and
    dividing by the better anchor's median of that draw (so the choice of the better one is part of
    the interval; None below 3 runs a method); and paired by repeat, each repeat's ratio to the
    better of that repeat's anchor runs. None when `ours` or every anchor has no runs."""
    x = C.runs_of(results, [ours], "tok_s")
    ys = {a: C.runs_of(results, [a], "tok_s") for a in anchors}
    ys = {a: v for a, v in ys.items() if v}
    if not x or not ys:
        return None
    better = max(ys, key=lambda a: statistics.median(ys[a]))
    out: dict[str, Any] = {"ours": ours, "anchors": list(ys), "better": better,
                           "ratio": statistics.median(x) / statistics.median(ys[better]), "interval": None,
                           "runs": [len(x), *(len(v) for v in ys.values())]}
    if len(x) >= 3 and all(len(v) >= 3 for v in ys.values()):
        rng = random.Random(seed)
        values = sorted(statistics.median(rng.choices(x, k=len(x)))
                        / max(statistics.median(rng.choices(v, k=len(v))) for v in ys.values())
                        for _ in range(draws))
        tail = (1 - level) / 2
        out["interval"] = (values[int(tail * draws)], values[min(draws - 1, int((1 - tail) * draws))])
    by_repeat = [{r.get("repeat"): r["tok_s"] for r in results[a]["runs"]} for a in ys]
    paired = [run["tok_s"] / max(b[run["repeat"]] for b in by_repeat) for run in results[ours]["runs"]
              if run.get("repeat") is not None and all(b.get(run["repeat"]) for b in by_repeat)]
    out.update(paired=paired, paired_median=statistics.median(paired) if paired else None,
               paired_interval=C.bootstrap_median(paired))
    return out


# (ours, theirs) reported beside the judged ratios
OTHER_RATIOS = (("episodes", "generate"), ("lockstep", "generate"), ("episodes-single", "lockstep"),
                ("episodes", "episodes-single"), ("episodes-split", "lockstep"), ("episodes-split", "episodes"),
                ("per-episode", "lockstep"))


def ratios(results: dict[str, Any], details: Sequence[dict[str, Any]], source: str | None) -> dict[str, Any]:
    """The ratios (printed): episodes / each anchor (ratio of medians with its interval, and paired
    by repeat), episodes / the better anchor, the others beside them; the summary they make, with
    the cache and rlgen's own time from the episodes runs' details (`comparisons`: every compare)."""
    def has(name: str) -> bool:
        return bool((results.get(name) or {}).get("runs"))

    summary: dict[str, Any] = {"comparisons": {}}
    for anchor, key in (("lockstep", "ratio"), ("per-episode", "ratio_per_episode")):
        judged = C.compare(results, "episodes", [anchor]) if has("episodes") and has(anchor) else None
        paired = paired_ratios(results, "episodes", anchor) if judged else []
        paired_iv = C.bootstrap_median(paired)
        summary.update({key: judged["ratio"] if judged else None, f"{key}_interval": judged["interval"] if judged else None,
                        f"paired_{key}": statistics.median(paired) if paired else None,
                        f"paired_{key}_interval": paired_iv})
        if judged:
            summary["comparisons"][f"episodes / {anchor}"] = judged
            print(f"\n  episodes / {anchor}: {C.fmt(judged['ratio'], '.3f')}x [{_span(judged['interval'])}], rank test "
                  f"p {C.fmt(judged['p'], '.3f')}, runs {judged['runs'][0]} vs {judged['runs'][1]}; paired by repeat: "
                  + (f"median {statistics.median(paired):.3f}x [{_span(paired_iv)}], {len(paired)} repeats"
                     if paired else "-"), flush=True)
    best = versus_best(results)
    summary.update(better_anchor=best["better"] if best else None, ratio_best=best["ratio"] if best else None,
                   ratio_best_interval=best["interval"] if best else None,
                   paired_ratio_best=best["paired_median"] if best else None,
                   paired_ratio_best_interval=best["paired_interval"] if best else None)
    if best:
        summary["comparisons"]["episodes / the better anchor"] = best
        print(f"  episodes / the better anchor ({best['better']}): {best['ratio']:.3f}x [{_span(best['interval'])}]; "
              "paired by repeat (each repeat's better anchor): "
              + (f"median {best['paired_median']:.3f}x [{_span(best['paired_interval'])}]" if best["paired"] else "-"),
              flush=True)
    for a, b in OTHER_RATIOS:
        if has(a) and has(b):
            other = C.compare(results, a, [b])
            summary["comparisons"][f"{a} / {b}"] = other
            print(f"  {a} / {b}: {C.fmt(other['ratio'], '.3f')}x [{_span(other['interval'])}], "
                  f"rank test p {C.fmt(other['p'], '.3f')}", flush=True)
    vs_generate = summary["comparisons"].get("episodes / generate")
    cached = [d["cache"]["share"] for d in details if d["cache"]["share"] is not None]
    history = [d["cache"]["history_share"] for d in details if d["cache"]["history_share"] is not None]
    own_pct = [d["own"][source]["pct"] for d in details if source and d["own"].get(source, {}).get("pct") is not None]
    req = [d["own"]["requests"] for d in details if d["own"].get("requests")]
    summary.update({
        "tok_s": {m: {"median": C.median_or_none([r["tok_s"] for r in results[m]["runs"]]),
                      "interval": _interval_of([r["tok_s"] for r in results[m]["runs"]])}
                  for m in METHODS if has(m)},
        "ratio_to_generate": vs_generate["ratio"] if vs_generate else None,
        "ratio_to_generate_interval": vs_generate["interval"] if vs_generate else None,
        "cached_share": C.median_or_none(cached), "cached_share_interval": _interval_of(cached),
        "history_share": C.median_or_none(history), "own_source": source,
        "own_pct": C.median_or_none(own_pct), "own_pct_interval": _interval_of(own_pct),
        "between_turns_ms": C.median_or_none([r.get("between_turns_ms_median") for r in req]),
        "requests_per_turn": C.median_or_none([len(s) for d in details for s in d.get("turn_requests") or []]),
    })
    return summary


def report_waits(timeline: Mapping[str, Sequence[dict[str, Any]]]) -> dict[str, Any]:
    """The wait after each environment step, per method, from the timeline runs (printed;
    returned): the median over its runs of each run's p50, p99, max and count over 100 ms, the
    largest over all runs, per turn the median of each run's p50, and the runs' tokens/s (through
    the proxy; not judged)."""
    out: dict[str, Any] = {}
    rows = []
    for method in METHODS:
        runs = [r for r in timeline.get(method) or [] if (r.get("waits") or {}).get("n")]
        if not runs:
            continue
        per_run = [r["waits"] for r in runs]
        turns = sorted({k for w in per_run for k in w["per_turn"]}, key=int)
        out[method] = w = {
            "runs": len(per_run), "source": per_run[0]["source"],
            "p50_ms": C.median_or_none([x["p50_ms"] for x in per_run]),
            "p99_ms": C.median_or_none([x["p99_ms"] for x in per_run]),
            "max_ms": C.median_or_none([x["max_ms"] for x in per_run]),
            "max_ms_all_runs": max(x["max_ms"] for x in per_run),
            "over_100ms": C.median_or_none([x["over_100ms"] for x in per_run]),
            "waits_per_run": C.median_or_none([x["n"] for x in per_run]),
            "per_turn_p50_ms": {k: C.median_or_none([x["per_turn"][k]["p50_ms"] for x in per_run if k in x["per_turn"]])
                                for k in turns},
            "tok_s": C.median_or_none([r.get("tok_s") for r in runs]),
        }
        rows.append([method, str(w["runs"]), C.fmt(w["p50_ms"], ".1f"), C.fmt(w["p99_ms"], ".1f"),
                     C.fmt(w["max_ms"], ".1f"), C.fmt(w["max_ms_all_runs"], ".1f"),
                     f"{C.fmt(w['over_100ms'], '.0f')}/{C.fmt(w['waits_per_run'], '.0f')}",
                     " ".join(C.fmt(v, ".1f") for v in w["per_turn_p50_ms"].values()), C.fmt(w["tok_s"])])
    if rows:
        C.print_table("wait after env, ms (timeline runs, through the proxy that notes each request's arrival; not "
                      "judged): from an episode's environment step ending to its next request arriving at the server; "
                      "per run its p50, p99 and max, then the median over runs; max all: over every run; >100 ms: "
                      "waits over 100 ms / all waits of a run (median); per turn: the p50 of the waits before turn 2, "
                      "3, ...; lockstep's is its barrier; tok/s: of these runs",
                      ["method", "runs", "p50", "p99", "max", "max all", ">100 ms", "per turn p50", "tok/s"], rows)
    return out


def main() -> None:
    ap = C.base_parser(__doc__, repeats=REPEATS)
    ap.add_argument("--workload", type=lambda v: [w.strip() for w in v.split(",") if w.strip()], default=["fixed"],
                    help=f"the workloads to run, comma-separated, in order, of {','.join(WORKLOADS)} (default fixed)")
    ap.add_argument("--prompts", type=int, default=None, help="chat prompts (default 64; 2 with --quick)")
    ap.add_argument("--n", type=int, default=None, help="episodes per prompt (default 4; 2 with --quick)")
    ap.add_argument("--turns", type=int, default=None, help="assistant turns per episode (default 4)")
    ap.add_argument("--turn-tokens", type=int, default=None, help="fixed: tokens per turn, K (default 64; 4 with --quick)")
    ap.add_argument("--max-new-tokens", type=int, default=None,
                    help="EOS workloads: the most tokens a turn samples before its EOS (default 256; 8 with --quick)")
    ap.add_argument("--env-ms", type=float, default=ENV_MS,
                    help=f"EOS workloads: a step sleeps uniform 0-this ms (default {ENV_MS:g})")
    ap.add_argument("--tail-share", type=float, default=TAIL_SHARE,
                    help=f"eos-longtail: the share of steps that sleep --tail-s instead (default {TAIL_SHARE:g})")
    ap.add_argument("--tail-s", type=float, default=TAIL_S, help=f"eos-longtail: a slow step's seconds (default {TAIL_S:g})")
    ap.add_argument("--timeline-runs", type=int, default=1,
                    help="EOS workloads: runs of each method after the timed ones, through a proxy that notes when "
                         "each request arrives, for the wait after each environment step (default 1; 0: none)")
    ap.add_argument("--max-in-flight", type=int, default=None, help="episodes' requests in flight (default: all)")
    ap.add_argument("--sync-env", action="store_true", help="the environment a plain function (rlgen runs "
                    "each of its steps on a worker thread; the anchors on a pool of a thread per episode), not an "
                    "async def")
    ap.add_argument("--eos", action="store_true", help="fixed: turns end at the model's EOS (at most --turn-tokens): "
                    "lengths differ as real turns' do")
    ap.add_argument("--methods", type=lambda v: [m for m in v.split(",") if m], default=list(DEFAULT_METHODS),
                    help=f"which methods to time, comma-separated, of {','.join(METHODS)} (default "
                         f"{','.join(DEFAULT_METHODS)}; generate on the fixed workload only)")
    ap.add_argument("--split-batch", type=int, default=64, help="episodes-split: the most turns a batch part holds")
    ap.add_argument("--server-args", default="", help="extra server flags, e.g. '--enable-mixed-chunk' (SGLang's "
                    "scheduling), recorded with the run")
    ap.add_argument("--server", default=None, metavar="URL",
                    help="attach to a running server (rlgen.Engine.connect) instead of launching one (--backend "
                         "and --server-args unused): e.g. bench/_instant_server.py for a smoke test")
    C.add_report_only(ap)
    args = ap.parse_args()
    unknown = sorted(set(args.methods) - set(METHODS))
    if unknown or not args.methods:
        ap.error(f"--methods: {', '.join(unknown) or 'none given'}; choose from {', '.join(METHODS)}")
    if not args.workload or set(args.workload) - set(WORKLOADS) or len(set(args.workload)) != len(args.workload):
        ap.error(f"--workload takes distinct names of {', '.join(WORKLOADS)}, comma-separated")
    if C.reported_again(args, report):
        return
    if args.backend == "sglang" and not args.server:
        C.site_flags()  # before the launch: rlgen's Engine reads $RLGEN_SGLANG_ARGS itself
    model = C.model_path(args.model)
    record = C.Record(args.out, args, "bench/episodes.py")
    size = dict(SIZES["quick" if args.quick else "full"])
    for key in ("prompts", "n", "turns", "turn_tokens", "max_new_tokens"):
        if getattr(args, key) is not None:
            size[key] = getattr(args, key)
    size["warmup_prompts"] = min(size["warmup_prompts"], size["prompts"])
    record.data.update(model=model, sizes=size, workloads={})
    record.save()
    C.measure_and_report(record, lambda: measure(args, model, record), report)


if __name__ == "__main__":
    main()
