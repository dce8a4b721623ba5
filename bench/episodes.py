"""Multi-turn episodes: `Engine.episodes` against a hand-written lockstep loop of the same turns.

Not a test. Owns the episodes benchmark: its workload (chat prompts, an environment that answers
every assistant turn with one fixed short user message and ends after `--turns` turns, each turn
sampling exactly `--turn-tokens` tokens with ignore_eos), the timed methods (four by default, an
experiment on request), the per-run analysis of the episodes' records (requests per turn, prefix
cache, rlgen's own time per turn) and the report. It also owns `RequestLog`, a wrapper of the
Engine's HTTP client that timestamps every /generate request of an episodes call
(scripts/gpu/episodes_check.py uses it too), and `lockstep`, the anchor. Starts ONE server with
`rlgen.Engine(model, backend=...)`, then, interleaved (`_common.run_interleaved`: one warm-up each,
then every repeat runs every method in a shuffled order, each after a prefix-cache flush):

    episodes   eng.episodes(chats, env=<fixed reply>, n=N, max_turns=T, max_new_tokens=K,
               ignore_eos=True, temperature=1, max_in_flight=<all episodes>) and its .df: the
               turns that are ready together sent as one batched /generate (the default)
    episodes-single  the same with batch_turns=False: one /generate request per turn
    episodes-split   the same, each turn's batch sent in parts of at most --split-batch turns (64),
               each part as soon as it is ready (an experiment: does sending the first part while
               the runner still reads the rest of the answer hide its time behind the server's?)
    lockstep   what a user writes without rlgen (`lockstep`, plain aiohttp + orjson on the Engine's
               URL, no rlgen code): per turn ONE POST /generate of all N x prompts histories as
               `input_ids` (one `sampling_params` for all: max_new_tokens=K, ignore_eos, T=1;
               `return_logprob`), then each history += the sampled ids (+ EOS when the turn did not
               end with it) + the reply's template delta. The delta is rendered once per run with
               `rlgen.episodes.message_delta_ids(tok, [reply])`: the reply is the same every turn,
               so a hand-written loop renders it once (rlgen renders each episode's own). Timed
               from the chats, as the episodes are: it renders their first-turn ids inside the
               timing
    generate   eng.generate(<the same chats' first-turn ids>, n=N, max_new_tokens=T*K,
               ignore_eos=True, temperature=1, cache=False) and its .df: the same sampled tokens
               in ONE single-turn call (rlgen's default chunking)

The server's garbage collector is frozen once it is up, as rlgen does for every server it launches
(`rlgen.server._process`; SGLang's /freeze_gc): the record keeps the log lines that say so
(`server.gc_frozen`). Before that (2026-12-04p and earlier), generation-2 collections of 0.4-0.6 s
in SGLang's processes made the same call's time vary 15-30% between runs.

The anchor is the lockstep loop, not generate: a turn-by-turn loop pays SGLang's per-request costs
(admission, prefill, the answer of every sequence) once per turn, which no client can avoid; what
rlgen can be judged on is what it adds to that loop.

Default sizes: 64 prompts x n=4 = 256 episodes x 4 assistant turns x 64 tokens (65,536 sampled
tokens per run, every method). `--eos`: turns end at the model's EOS (or at `--turn-tokens`), so
their lengths differ as real turns do, and a batched turn waits for its longest; the methods then
sample different token counts, so only tokens/s compares. `--sync-env`: the environment a plain
function (rlgen runs each step on a worker thread), not an `async def`. --quick: 2 prompts x 2
x 4 turns x 4 tokens (a smoke run on the CPU backend: its numbers mean nothing).

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

Targets, judged on 90% bootstrap intervals (`_common.Targets.check_interval`: PASS, FAIL, or NOISE
when the interval straddles the bound):

    episodes / lockstep, sampled tokens/s          >= 0.95x   (the headline)
    cached share of turns 2..T                     >= 90%
    rlgen's own time, % of the episode's wall time  < 5%

Reported beside them, not judged: episodes / generate, lockstep / generate, episodes-single /
lockstep, episodes / episodes-single.

    python bench/episodes.py --backend sglang --out episodes_bench.json        # the GPU machine
    python bench/episodes.py --backend cpu --quick --out /tmp/episodes.json    # smoke test anywhere
    python bench/episodes.py --report-only episodes_bench.json --out again.json
"""

from __future__ import annotations

import argparse
import os
import random
import shlex
import statistics
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import _common as C

SIZES: dict[str, dict[str, int]] = {
    "full": {"prompts": 64, "n": 4, "turns": 4, "turn_tokens": 64, "warmup_prompts": 8},
    "quick": {"prompts": 2, "n": 2, "turns": 4, "turn_tokens": 4, "warmup_prompts": 1},
}
REPEATS = 11  # a run of each method takes 1-3 s on the H200 (65k tokens) at 135M
REPLY = "Continue."
TARGET_RATIO, TARGET_CACHED, TARGET_OWN_PCT = 0.95, 0.9, 5.0  # the ratio: episodes / lockstep
# "episodes": the turns that are ready together sent as one batched /generate (the default);
# "episodes-single": one request per turn (batch_turns=False), as before the batcher; "lockstep":
# the hand-written loop (`lockstep`), the anchor; "episodes-split": batches sent in parts.
METHODS = ("episodes", "episodes-single", "episodes-split", "lockstep", "generate")
DEFAULT_METHODS = ("episodes", "episodes-single", "lockstep", "generate")  # the experiment when asked for


# ---------------------------------------------------------------------------------------------
# Workload


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


# ---------------------------------------------------------------------------------------------
# The hand-written anchor: every episode's turn k in one batched /generate


async def lockstep(url: str, chats: Sequence[Sequence[Mapping[str, Any]]], tokenizer: Any, *, n: int, turns: int,
                   sampling: dict[str, Any], reply: str) -> tuple[int, list[int]]:
    """What a user writes without rlgen (~30 lines of aiohttp), timed from the chats as an episodes
    call is: each chat's ids rendered by the tokenizer (n histories a chat, prompt-major) and the
    fixed reply's template delta rendered once (the reply is the same every turn); then per turn ONE
    POST /generate of every history as `input_ids` (one `sampling_params` for all,
    `return_logprob`), and each history += the sampled ids, + EOS when the turn did not end with it,
    + the delta. JSON by orjson, as rlgen's client; the cyclic GC paused while an answer is
    decoded, as rlgen's client does. Returns (sampled tokens, samples per request)."""
    import gc

    import aiohttp
    import orjson

    from rlgen.episodes import message_delta_ids

    eos = tokenizer.eos_token_id
    delta = message_delta_ids(tokenizer, [{"role": "user", "content": reply}])
    first = [tokenizer.apply_chat_template([dict(m) for m in chat], add_generation_prompt=True, tokenize=True,
                                           return_dict=False) for chat in chats]
    ids = [list(f) for f in first for _ in range(n)]
    logprobs: list[list[Any]] = [[] for _ in ids]  # kept, as a trainer needs them
    sampled, sizes = 0, []
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None)) as session:
        for turn in range(turns):
            body = orjson.dumps({"input_ids": ids, "sampling_params": sampling, "return_logprob": True})
            async with session.post(url + "/generate", data=body, headers={"Content-Type": "application/json"}) as r:
                raw = await r.read()
                if r.status >= 400:
                    raise RuntimeError(f"/generate failed with HTTP {r.status}: {raw[:300]!r}")
            gc.disable()
            try:
                answers = orjson.loads(raw)
            finally:
                gc.enable()
            if not isinstance(answers, list) or len(answers) != len(ids):
                raise RuntimeError(f"/generate answered {type(answers).__name__} for {len(ids)} histories")
            sizes.append(len(answers))
            for history, kept, answer in zip(ids, logprobs, answers):
                out = answer["output_ids"]
                sampled += len(out)
                kept.extend(answer["meta_info"]["output_token_logprobs"])
                if turn + 1 < turns:
                    history += out + ([] if out and out[-1] == eos else [eos]) + delta
    return sampled, sizes


# ---------------------------------------------------------------------------------------------
# Timestamps of an episodes call's requests


class RequestLog:
    """Wraps an Engine's HTTP client (`eng._client`) while `installed`: every /generate request is
    timed (send, answer) and keyed by hash(input_ids + output_ids), which is the episode's ids up to
    the end of that turn's sampled tokens, so that requests are matched to records afterwards
    whatever list objects the runner passed. The timed call keeps only references to the payload's
    and the answer's id lists (neither changes afterwards: the runner sends a copy of its ids);
    `entries` hashes them when read, after the timing, so that the log adds no per-token work to the
    call it times. Also counts requests in flight (`peak`)."""

    def __init__(self, client: Any) -> None:
        self._client = client
        # (sent, answered, input ids, output ids, SGLang's e2e_latency or None): `entries` once read
        self._kept: list[tuple[float, float, list[int], list[int], float | None]] = []
        self.sizes: list[int] = []  # samples per HTTP request, in order (`entries` has one per sample)
        self.in_flight = 0
        self.peak = 0
        # One dict per batched request (`batch_stamps`): where a batched turn's time went.
        self.batches: list[dict[str, Any]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)

    async def generate(self, payload: dict[str, Any]) -> Any:
        ids = payload.get("input_ids")
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
        inputs = ids if isinstance(ids, list) and ids and isinstance(ids[0], list) else [ids]
        for one, item in zip(answers, inputs):  # a batch's samples share its send and answer times
            out = one.get("output_ids") if isinstance(one, dict) else None
            if isinstance(item, list) and isinstance(out, list):
                e2e = (one.get("meta_info") or {}).get("e2e_latency")
                self._kept.append((sent, answered, item, out, float(e2e) if isinstance(e2e, (int, float)) else None))
        return answer

    @property
    def entries(self) -> list[tuple[float, float, int, int, int, float | None]]:
        """Per sample: (sent, answered, key, input length, output length, SGLang's e2e_latency or None)."""
        return [(sent, answered, hash((*item, *out)), len(item), len(out), e2e)
                for sent, answered, item, out, e2e in self._kept]

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
    by_key: dict[int, list[tuple[float, float, int, int, int, float | None]]] = {}
    for entry in log.entries:
        by_key.setdefault(entry[2], []).append(entry)
    out: list[dict[str, Any] | None] = []
    for r in records:
        spans = _assistant_spans(r.roles)
        found = []
        for _, end in spans:
            candidates = by_key.get(hash(tuple(r.ids[:end])))
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
# Measuring


def measure(args: argparse.Namespace, model: str, record: C.Record) -> None:
    import rlgen
    from rlgen.episodes import first_prompt_ids

    size = record["sizes"]
    T, K = size["turns"], size["turn_tokens"]
    C.log(f"starting rlgen.Engine({model!r}, backend={args.backend!r}) ...")
    t0 = time.monotonic()
    eng = rlgen.Engine(model, backend=args.backend, progress=False, log_dir=C.logs_dir(args.out, "server"),
                       server_args=shlex.split(args.server_args))
    try:
        record["server"] = {"start_s": time.monotonic() - t0, "url": eng.url, "argv": eng.info.get("command"),
                            "max_total_num_tokens": eng.server_info.get("max_total_num_tokens")}
        C.log(f"server ready in {record['server']['start_s']:.1f} s at {eng.url}")
        # rlgen freezes the garbage collector of a server it launches (server/_process): the log says so
        record["server"]["gc_frozen"] = frozen = gc_freeze_lines(C.logs_dir(args.out, "server"))
        C.log(f"server's GC frozen: {len(frozen)} processes" if frozen else "server's GC NOT frozen (no such log line)")
        prompts = chats(size["prompts"])
        ids = [first_prompt_ids(eng.tokenizer, chat) for chat in prompts]
        n_ep = size["prompts"] * size["n"]
        max_in_flight = args.max_in_flight or n_ep
        ignore_eos = not args.eos
        wl = C.Workload(name="episodes", prompts=ids,
                        options={"max_new_tokens": T * K, "temperature": 1.0, "ignore_eos": ignore_eos}, n=size["n"],
                        describe=f"{size['prompts']} chat prompts x n={size['n']} = {n_ep} episodes x {T} turns "
                                 + (f"x {K} tokens (ignore_eos, T=1)" if ignore_eos else
                                    f"x up to {K} tokens (ending at EOS, T=1)")
                                 + f"; generate: the same prompts, {T * K} tokens"
                                 + ("; the environment a plain function" if args.sync_env else ""))
        record["workload"] = {**wl.summary(), "max_in_flight": max_in_flight, "reply": REPLY,
                              "sync_env": args.sync_env, "first_prompt_tokens": [len(p) for p in ids]}
        record.save()
        pending: dict[str, Any] = {}
        methods = timed_methods(eng, prompts, pending, turns=T, turn_tokens=K, ignore_eos=ignore_eos,
                                max_in_flight=max_in_flight, sync_env=args.sync_env, split_batch=args.split_batch)
        methods = {name: run for name, run in methods.items() if name in args.methods}

        def after_each(partial: dict[str, Any]) -> None:
            name, res, log, start = pending.pop("last", (None, None, None, 0.0))
            if name in ("episodes", "episodes-single", "episodes-split") and partial[name]["runs"]:
                partial[name]["runs"][-1]["details"] = analyse(res.records, log, start, turns=T, turn_tokens=K)
            elif name == "generate" and partial[name]["runs"] and log is not None:
                partial[name]["runs"][-1]["details"] = {"phases": turn_phases(log.batches)}
            elif name == "lockstep" and partial[name]["runs"]:
                partial[name]["runs"][-1]["details"] = {"request_sizes": res}
            record["results"] = partial
            record.save()

        record["results"] = C.run_interleaved(methods, wl, repeats=C.repeats_of(args),
                                              warmup=wl.head(size["warmup_prompts"]),
                                              before_each=lambda: C.flush_cache(eng.url), after_each=after_each)
        record.save()
    finally:
        C.log("closing the server")
        eng.close()


def gc_freeze_lines(logs: Path) -> list[str]:
    """The server log's lines that say a process froze its garbage collector (SGLang's "Freezing GC
    in Scheduler process. gen0: ..."), from every log under `logs`."""
    return [line.strip() for path in sorted(logs.rglob("*.log"))
            for line in path.read_text(errors="replace").splitlines() if "Freezing GC in" in line]


@contextmanager
def split_batches(most: int | None) -> Iterator[None]:
    """While open, the episodes' turn batches hold at most `most` turns each (None: as rlgen sends
    them). An experiment's switch, not an option of rlgen's: it swaps the batcher class the runner
    makes for one with a smaller `max_batch`."""
    if most is None:
        yield
        return
    from rlgen.episodes import _episode

    limit = most
    original = getattr(_episode, "TurnBatcher")  # noqa: B009 - the runner's module, not its public surface

    class Split(original):  # type: ignore[misc,valid-type]
        def __init__(self, *args: Any, max_batch: int = 256, **kwargs: Any) -> None:
            super().__init__(*args, max_batch=min(max_batch, limit), **kwargs)

    setattr(_episode, "TurnBatcher", Split)  # noqa: B010
    try:
        yield
    finally:
        setattr(_episode, "TurnBatcher", original)  # noqa: B010


def timed_methods(eng: Any, prompts: Sequence[Any], pending: dict[str, Any], *, turns: int, turn_tokens: int,
                  ignore_eos: bool, max_in_flight: int, sync_env: bool,
                  split_batch: int = 64) -> dict[str, Callable[[C.Workload], C.Served]]:
    """The timed methods on one Engine; each leaves (name, what to analyse, its RequestLog, its
    start) in `pending["last"]` for `after_each`."""
    import asyncio


    env = fixed_reply(turns, sync=sync_env)

    def episodes_of(name: str, batch_turns: bool, split: int | None = None) -> Callable[[C.Workload], C.Served]:
        def run(w: C.Workload) -> C.Served:
            log = RequestLog(eng._client)
            start = time.perf_counter()
            with log.installed(eng), split_batches(split):
                res = eng.episodes(prompts[: len(w.prompts)], env=env, n=w.n, max_turns=turns,
                                   max_new_tokens=turn_tokens, temperature=1.0, ignore_eos=ignore_eos,
                                   progress=False, max_in_flight=max_in_flight, batch_turns=batch_turns)
            df = res.df
            pending["last"] = (name, res, log, start)  # its records are read after the timing
            return C.Served(int(df["sampled_tokens"].sum()))
        return run

    def run_lockstep(w: C.Workload) -> C.Served:
        sampling = {"max_new_tokens": turn_tokens, "temperature": 1.0, "ignore_eos": ignore_eos}
        sampled, sizes = asyncio.run(lockstep(eng.url, prompts[: len(w.prompts)], eng.tokenizer, n=w.n, turns=turns,
                                              sampling=sampling, reply=REPLY))
        pending["last"] = ("lockstep", sizes, None, 0.0)
        return C.Served(sampled)

    def run_generate(w: C.Workload) -> C.Served:
        log = RequestLog(eng._client)
        with log.installed(eng):
            res = eng.generate(w.prompts, n=w.n, progress=False, cache=False, **w.options)
        df = res.df
        pending["last"] = ("generate", None, log, 0.0)
        return C.Served(int(df["completion_tokens"].sum()), C.server_span(df["request_latency_s"].tolist()))

    return {"episodes": episodes_of("episodes", True), "episodes-single": episodes_of("episodes-single", False),
            "episodes-split": episodes_of("episodes-split", True, split_batch),
            "lockstep": run_lockstep, "generate": run_generate}


# ---------------------------------------------------------------------------------------------
# Report


def _interval_of(values: Sequence[float]) -> tuple[float, float] | None:
    return C.bootstrap_median(values) if len(values) >= 3 else None


def _span(iv: tuple[float, float] | None, spec: str = ".3f") -> str:
    return f"{iv[0]:{spec}}-{iv[1]:{spec}}" if iv else "-"


def report(record: C.Record) -> None:
    results: dict[str, Any] = record.data.get("results") or {}
    if not results:
        print("nothing was measured" + (f": {record.data['error']}" if record.data.get("error") else ""), flush=True)
        return
    workload = record.data.get("workload") or {}
    print(f"\nworkload: {workload.get('describe')}; max_in_flight {workload.get('max_in_flight')}", flush=True)
    rows = []
    for name in METHODS:
        runs = (results.get(name) or {}).get("runs") or []
        toks = [r["tok_s"] for r in runs]
        rows.append([name, str(len(runs)), C.fmt(C.median_or_none(toks)), _span(_interval_of(toks), ",.0f"),
                     C.fmt(C.median_or_none([r["seconds"] for r in runs]), ".3f"),
                     C.fmt(C.median_or_none([r["tokens"] for r in runs]))])
    C.print_table("sampled tokens/s (medians of interleaved runs, each after a prefix-cache flush; 90% bootstrap "
                  "interval of the median)", ["method", "runs", "tok/s", "interval", "wall s", "tokens"], rows)
    for name in METHODS:
        if (results.get(name) or {}).get("error"):
            print(f"  ERROR {name}: {results[name]['error']}", flush=True)
    details = [r["details"] for r in (results.get("episodes") or {}).get("runs") or [] if r.get("details")]
    source = report_runs(results, details)
    verdicts(record, results, details, source)


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


# (ours, theirs) reported beside the headline, episodes / lockstep
OTHER_RATIOS = (("episodes", "generate"), ("lockstep", "generate"), ("episodes-single", "lockstep"),
                ("episodes", "episodes-single"), ("episodes-split", "lockstep"), ("episodes-split", "episodes"))


def verdicts(record: C.Record, results: dict[str, Any], details: Sequence[dict[str, Any]], source: str | None) -> None:
    """The ratios (episodes / lockstep the headline), the summary and the targets."""
    def has(name: str) -> bool:
        return bool((results.get(name) or {}).get("runs"))

    cached = [d["cache"]["share"] for d in details if d["cache"]["share"] is not None]
    history = [d["cache"]["history_share"] for d in details if d["cache"]["history_share"] is not None]
    own_pct = [d["own"][source]["pct"] for d in details if source and d["own"].get(source, {}).get("pct") is not None]
    req = [d["own"]["requests"] for d in details if d["own"].get("requests")]
    headline = C.compare(results, "episodes", ["lockstep"]) if has("episodes") and has("lockstep") else None
    record["comparison"] = headline
    if headline:
        print(f"\n  episodes / lockstep: {C.fmt(headline['ratio'], '.3f')}x [{_span(headline['interval'])}], rank "
              f"test p {C.fmt(headline['p'], '.3f')}, runs {headline['runs'][0]} vs {headline['runs'][1]}", flush=True)
    paired = paired_ratios(results, "episodes", "lockstep") if headline else []
    paired_iv = C.bootstrap_median(paired)
    if paired_iv:  # not the judged number: the GC stalls are gone, and the drift left is what pairs cancel
        print(f"  paired by repeat (beside it, not judged): median {statistics.median(paired):.3f}x "
              f"[{_span(paired_iv)}], {len(paired)} repeats", flush=True)
    for a, b in OTHER_RATIOS:
        if has(a) and has(b):
            other = C.compare(results, a, [b])
            record.data.setdefault("comparisons", {})[f"{a} / {b}"] = other
            print(f"  {a} / {b}: {C.fmt(other['ratio'], '.3f')}x [{_span(other['interval'])}], "
                  f"rank test p {C.fmt(other['p'], '.3f')}", flush=True)
    vs_generate = (record.data.get("comparisons") or {}).get("episodes / generate")
    record["summary"] = {
        "ratio": headline["ratio"] if headline else None, "ratio_interval": headline["interval"] if headline else None,
        "paired_ratio": statistics.median(paired) if paired else None, "paired_ratio_interval": paired_iv,
        "ratio_to_generate": vs_generate["ratio"] if vs_generate else None,
        "ratio_to_generate_interval": vs_generate["interval"] if vs_generate else None,
        "cached_share": C.median_or_none(cached), "cached_share_interval": _interval_of(cached),
        "history_share": C.median_or_none(history), "own_source": source,
        "own_pct": C.median_or_none(own_pct), "own_pct_interval": _interval_of(own_pct),
        "between_turns_ms": C.median_or_none([r["between_turns_ms_median"] for r in req]),
        "requests_per_turn": C.median_or_none([len(s) for d in details for s in d.get("turn_requests") or []]),
    }
    print("\ntargets", flush=True)
    targets = C.Targets()
    wrong = wrong_outcome(details, exact_tokens=not (record.data.get("args") or {}).get("eos"))
    if headline:
        targets.check_interval("episodes / the hand-written lockstep loop of the same turns (tok/s)",
                               headline["ratio"], headline["interval"], TARGET_RATIO, wrong=wrong)
    targets.check_interval("prefix-cache share of turns 2..T's prompt tokens", C.median_or_none(cached),
                           _interval_of(cached), TARGET_CACHED, unit="")
    targets.check_interval(f"rlgen's own time per episode, % of its wall time ({source or 'not measured'})",
                           C.median_or_none(own_pct), _interval_of(own_pct), TARGET_OWN_PCT, op="<", unit="%")
    record["targets"] = targets.rows


def main() -> None:
    ap = C.base_parser(__doc__, repeats=REPEATS)
    ap.add_argument("--prompts", type=int, default=None, help="chat prompts (default 64; 2 with --quick)")
    ap.add_argument("--n", type=int, default=None, help="episodes per prompt (default 4; 2 with --quick)")
    ap.add_argument("--turns", type=int, default=None, help="assistant turns per episode (default 4)")
    ap.add_argument("--turn-tokens", type=int, default=None, help="tokens per turn, K (default 64; 4 with --quick)")
    ap.add_argument("--max-in-flight", type=int, default=None, help="episodes' requests in flight (default: all)")
    ap.add_argument("--sync-env", action="store_true", help="the environment a plain function (rlgen runs "
                    "each of its steps on a worker thread), not an async def")
    ap.add_argument("--eos", action="store_true", help="turns end at the model's EOS (at most --turn-tokens): "
                    "lengths differ as real turns' do")
    ap.add_argument("--methods", type=lambda v: [m for m in v.split(",") if m], default=list(DEFAULT_METHODS),
                    help=f"which methods to time, comma-separated, of {','.join(METHODS)} (default "
                         f"{','.join(DEFAULT_METHODS)})")
    ap.add_argument("--split-batch", type=int, default=64, help="episodes-split: the most turns a batch part holds")
    ap.add_argument("--server-args", default="", help="extra server flags, e.g. '--enable-mixed-chunk' (SGLang's "
                    "scheduling), recorded with the run")
    C.add_report_only(ap)
    args = ap.parse_args()
    unknown = sorted(set(args.methods) - set(METHODS))
    if unknown or not args.methods:
        ap.error(f"--methods: {', '.join(unknown) or 'none given'}; choose from {', '.join(METHODS)}")
    if C.reported_again(args, report):
        return
    if args.backend == "sglang":
        C.site_flags()  # before the launch: rlgen's Engine reads $RLGEN_SGLANG_ARGS itself
    model = C.model_path(args.model)
    record = C.Record(args.out, args, "bench/episodes.py")
    size = dict(SIZES["quick" if args.quick else "full"])
    for key in ("prompts", "n", "turns", "turn_tokens"):
        if getattr(args, key) is not None:
            size[key] = getattr(args, key)
    size["warmup_prompts"] = min(size["warmup_prompts"], size["prompts"])
    record.data.update(model=model, sizes=size, results={})
    record.save()
    try:
        measure(args, model, record)
    except Exception as err:  # report what there is
        record["error"] = f"{type(err).__name__}: {err}"
        C.log(f"FAILED: {record['error']}")
    report(record)
    record.save(complete=True)
    C.log(f"wrote {os.path.abspath(args.out)}")


if __name__ == "__main__":
    main()
