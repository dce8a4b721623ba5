"""rlgen's own time in an episodes call, with no server and no HTTP: where it goes.

Not a test. `run_episodes` (the runner `Engine.episodes` drives) and the hand-written lockstep loop
of `episodes.py` run against one in-process client that answers every `/generate` at once with
`_instant_server.answers` (no JSON, no socket), so each method's time is its own Python work and the
making of the answers, which both pay alike; their difference is what rlgen's bookkeeping costs
(records, texts, turns, the environment's contained step). The workload and the environment are
`episodes.py`'s (64 chats x n=4, 4 turns of 64 tokens, a fixed reply); each timed run is one
`asyncio.run` with the cyclic GC paused, as `Engine.episodes` pauses it, after a collection.

One experiment takes one piece out of rlgen's path, to weigh it (a switch of this script, not an
option of rlgen's: it swaps a function the runner calls, only while it runs):

    episodes-nocontain   the environment's step awaited directly, without `call_contained`'s task,
                         timeout and failure handling

(An earlier `episodes-nodecode`, which swapped the batch's one `batch_decode` of the turns' texts,
went with that batch decode: each turn's text is decoded as its answer is written.)

Reported: each method's median ms with its 90% bootstrap interval, episodes - lockstep, and what
each experiment saves (episodes - experiment). The numbers are this machine's: compare within a run.
`--server-ms`: each answer handed back that long after its request (a server's time on a turn), so
that what rlgen does while a server works is off the critical path and out of the difference.

    python bench/episodes_inprocess.py --out /tmp/inprocess.json
    python bench/episodes_inprocess.py --out /tmp/inprocess.json --repeats 15
    python bench/episodes_inprocess.py --out /tmp/inprocess.json --server-ms 100
"""

from __future__ import annotations

import asyncio
import gc
import random
import statistics
import time
from collections.abc import Callable, Coroutine, Iterator
from contextlib import contextmanager
from typing import Any

import _common as C
import _instant_server as instant
import episodes as E

SIZES = {"prompts": 64, "n": 4, "turns": 4, "turn_tokens": 64}
SAMPLING = {"temperature": 1.0, "ignore_eos": True}


class InstantClient:
    """What the runner needs of a client (`generate`, `generate_stream`, `abort`): every answer made
    at once, in process, then handed back after `server_s` (the time a server would work on it:
    rlgen's work done while it waits is then off the critical path, as on a real server); a streamed
    batch yields each item's answer as one chunk tagged with its index."""

    server_s = 0.0

    def __init__(self) -> None:
        self.rng = random.Random(0)

    async def generate(self, payload: dict[str, Any]) -> Any:
        made = instant.answers(payload, self.rng, 0.0)
        if self.server_s:
            await asyncio.sleep(self.server_s)
        return made

    async def generate_stream(self, payload: dict[str, Any]) -> Any:
        made = await self.generate(payload)
        for index, entry in enumerate(made if isinstance(made, list) else [made]):
            yield {**entry, "index": index} if isinstance(made, list) else entry

    async def abort(self, rids: list[str]) -> None:
        return None


@contextmanager
def experiment(name: str) -> Iterator[None]:
    """While open, the runner runs without the piece `name` takes out (see the module docstring)."""
    from rlgen.episodes import _env

    if name == "episodes-nocontain":
        async def direct(fn: Any, args: Any, timeout: Any, what: str) -> Any:
            return _env.normalise_return(await fn(*args), what=what)
        module, attr, value = _env, "call_contained", direct
    else:
        yield
        return
    original = getattr(module, attr)
    setattr(module, attr, value)
    try:
        yield
    finally:
        setattr(module, attr, original)


def methods(tok: Any) -> dict[str, Callable[[], Coroutine[Any, Any, Any]]]:
    from rlgen.episodes import message_delta_ids, run_episodes

    chats, env = E.chats(SIZES["prompts"]), E.fixed_reply(SIZES["turns"])
    n, turns, k = SIZES["n"], SIZES["turns"], SIZES["turn_tokens"]

    async def episodes() -> Any:
        return await run_episodes(InstantClient(), tok, chats, env=env, n=n, max_turns=turns, max_new_tokens=k,
                                  sampling=SAMPLING, max_in_flight=n * len(chats))

    async def lockstep() -> Any:  # episodes.lockstep's loop, without its HTTP
        client, eos = InstantClient(), tok.eos_token_id
        delta = message_delta_ids(tok, [{"role": "user", "content": E.REPLY}])
        first = [list(tok.apply_chat_template(c, add_generation_prompt=True, tokenize=True, return_dict=False))
                 for c in chats]
        histories = [list(ids) for ids in first for _ in range(n)]
        params = {**SAMPLING, "max_new_tokens": k}
        for turn in range(turns):
            answers = await client.generate({"input_ids": histories, "sampling_params": params, "return_logprob": True,
                                             "rid": [str(i) for i in range(len(histories))]})
            for history, answer in zip(histories, answers):
                history += answer["output_ids"]
                history.append(eos)
                if turn < turns - 1:
                    history += delta
        return histories

    return {"episodes": episodes, "lockstep": lockstep, "episodes-nocontain": episodes}


def timed(name: str, run: Callable[[], Coroutine[Any, Any, Any]]) -> float:
    gc.collect()
    gc.disable()
    try:
        with experiment(name):
            t0 = time.perf_counter()
            asyncio.run(run())
            return time.perf_counter() - t0
    finally:
        gc.enable()


def main() -> None:
    ap = C.base_parser(__doc__, repeats=9)
    ap.add_argument("--server-ms", type=float, default=0.0,
                    help="each answer handed back this long after its request (a server's time on a turn); "
                         "then episodes - lockstep is rlgen's time on the critical path, not all of it")
    args = ap.parse_args()
    InstantClient.server_s = args.server_ms / 1000
    from rlgen.engine._startup import load_tokenizer

    record = C.Record(args.out, args, "bench/episodes_inprocess.py")
    tok = load_tokenizer(C.model_path(args.model))
    runs = methods(tok)
    ms: dict[str, list[float]] = {name: [] for name in runs}
    for name, run in runs.items():  # a warm-up each
        timed(name, run)
    order_rng = random.Random(0)
    for _ in range(C.repeats_of(args)):
        order = list(runs)
        order_rng.shuffle(order)
        for name in order:
            ms[name].append(timed(name, runs[name]) * 1000)
    record.data.update(sizes=SIZES, ms=ms, server_ms=args.server_ms)
    print(f"ms per call, in process ({SIZES}, answers after {args.server_ms:g} ms); medians [90% bootstrap interval]")
    for name, values in ms.items():
        iv = C.bootstrap_median(values)
        print(f"  {name:20s} {statistics.median(values):8.1f}  [{iv[0]:.1f}-{iv[1]:.1f}]" if iv else f"  {name}")
    diffs = {"episodes - lockstep": ("episodes", "lockstep")}
    diffs["saved by episodes-nocontain"] = ("episodes", "episodes-nocontain")
    record["differences"] = {}
    for label, (a, b) in diffs.items():
        d, iv = statistics.median(ms[a]) - statistics.median(ms[b]), C.bootstrap_difference(ms[a], ms[b])
        record["differences"][label] = {"ms": d, "interval": iv}
        print(f"  {label:32s} {d:7.1f} ms" + (f" [{iv[0]:.1f}-{iv[1]:.1f}]" if iv else ""))
    record.save(complete=True)


if __name__ == "__main__":
    main()
