"""rlgen's own cost in an episodes call: `Engine.episodes` against the hand-written lockstep loop, with
no model behind the server.

Not a test. The server is `_instant_server.py` (SGLang's /generate shape, answered at once), so
each method's wall time is its own client work plus the HTTP round trips and the stub's JSON: what
an episodes call adds to the hand-written loop (`episodes.lockstep`) on a real server, measured
where it can be seen, on any machine. The workload, the environment and the two methods are
`episodes.py`'s (its defaults: 64 chats x n=4, 4 turns of 64 tokens), interleaved by
`_common.run_interleaved` (a GC collection before each timed run).

Per timed run: wall seconds, and the cyclic GC's collections during it (count and seconds per
generation, from `gc.callbacks`). Reported: each method's median, episodes - lockstep in ms with
its 90% bootstrap interval, and that difference as a share of the lockstep loop's wall time on
the H200 (`--gpu-lockstep-s`, default 2.571 s: the 135M run of docs/gpu/2026-12-03n), which is
what the difference would cost there if the server's time were the same for both.
`--profile`: one more episodes call under cProfile, on the thread that runs it, the top lines.
Per episodes call, its timeline (`Timeline`): the ms from the call to its first request, between
each answer and the next request (the client's work on the critical path, where the server waits),
and from the last answer to the call's return (the last turn and the result), with their medians.
`--server-ms`: the server answers each request that long after it came (a GPU's time on a turn),
so that the difference is rlgen's time on the critical path (work done while the server works is
not counted), not all of it; the H200 share then assumes the same server time for both methods.

    python bench/episodes_client.py --out /tmp/episodes_client.json
    python bench/episodes_client.py --out /tmp/p.json --repeats 3 --profile
    python bench/episodes_client.py --out /tmp/c.json --server-ms 400
"""

from __future__ import annotations

import gc
import os
import statistics
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

import _common as C
import episodes as E

HERE = Path(__file__).resolve().parent
GPU_LOCKSTEP_S = 2.571  # lockstep's median wall time at 135M on the H200, docs/gpu/2026-12-03n


class GcClock:
    """The cyclic GC's collections while `on`: per generation, how many and their seconds."""

    def __init__(self) -> None:
        self.on, self.started = False, 0.0
        self.by_gen: dict[int, list[float]] = {}
        gc.callbacks.append(self._callback)

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        if not self.on:
            return
        if phase == "start":
            self.started = time.perf_counter()
        else:
            self.by_gen.setdefault(int(info["generation"]), []).append(time.perf_counter() - self.started)

    def take(self) -> dict[str, Any]:
        out = {str(g): {"count": len(v), "seconds": sum(v)} for g, v in sorted(self.by_gen.items())}
        self.by_gen = {}
        return out


class Timeline:
    """When an episodes call's requests left and their answers came (rlgen's client's `generate` and
    `generate_stream`, wrapped while `on`; a streamed batch is answered when its stream ends): per
    call, `before_first` (from the call to its first request), `between` (each answer to the next
    request: the client's work on the critical path) and `after_last` (the last answer to the
    call's return: the last turn's work and the result's building), in ms."""

    def __init__(self) -> None:
        self.marks: list[tuple[str, float]] = []

    @contextmanager
    def on(self) -> Iterator[None]:
        from rlgen.client import _http

        original, original_stream, marks = _http.Client.generate, _http.Client.generate_stream, self.marks

        async def generate(client: Any, payload: dict[str, Any]) -> Any:
            marks.append(("sent", time.perf_counter()))
            try:
                return await original(client, payload)
            finally:
                marks.append(("answered", time.perf_counter()))

        async def generate_stream(client: Any, payload: dict[str, Any]) -> Any:  # a batched turn since fc02ac3
            marks.append(("sent", time.perf_counter()))
            try:
                async for chunk in original_stream(client, payload):
                    yield chunk
            finally:
                marks.append(("answered", time.perf_counter()))  # the stream's end: its last item answered

        self.marks.clear()
        marks.append(("call", time.perf_counter()))
        _http.Client.generate = generate  # type: ignore[method-assign]
        _http.Client.generate_stream = generate_stream  # type: ignore[method-assign]
        try:
            yield
        finally:
            _http.Client.generate = original  # type: ignore[method-assign]
            _http.Client.generate_stream = original_stream  # type: ignore[method-assign]
            marks.append(("returned", time.perf_counter()))

    def take(self) -> dict[str, Any]:
        sent = [t for k, t in self.marks if k == "sent"]
        answered = [t for k, t in self.marks if k == "answered"]
        if not sent or len(sent) != len(answered):
            return {}
        return {"before_first_ms": 1e3 * (sent[0] - self.marks[0][1]),
                "between_ms": [1e3 * (b - a) for a, b in zip(answered, sent[1:])],
                "after_last_ms": 1e3 * (self.marks[-1][1] - answered[-1]), "requests": len(sent)}


def start_server(model: str, delay_s: float = 0.0) -> tuple[subprocess.Popen[bytes], str]:
    """The instant server on `model`'s tokenizer, answering after `delay_s`: (process, URL)."""
    proc, url = E.start_helper("_instant_server.py", model, str(delay_s))
    return proc, url


def methods(eng: Any, chats: list[Any], size: dict[str, int], clock: GcClock, runs: dict[str, list[dict[str, Any]]],
            *, sync_env: bool, timeline: Timeline | None = None) -> dict[str, Callable[[C.Workload], C.Served]]:
    import asyncio

    T, K, N = size["turns"], size["turn_tokens"], size["n"]
    env = E.fixed_reply(T, sync=sync_env)
    tok = eng.tokenizer

    def timed(name: str, call: Callable[[], int]) -> int:
        clock.on = True
        try:
            tokens = call()
        finally:
            clock.on = False
        runs.setdefault(name, []).append(clock.take())
        return tokens

    def episodes(w: C.Workload) -> C.Served:
        def call() -> int:
            with timeline.on() if timeline is not None else nullcontext():
                res = eng.episodes(chats, env=env, n=N, max_turns=T, max_new_tokens=K, temperature=1.0,
                                   ignore_eos=True, progress=False, max_in_flight=len(chats) * N)
            if timeline is not None:
                runs.setdefault("timeline", []).append(timeline.take())
            return int(res.df["sampled_tokens"].sum())
        return C.Served(timed("episodes", call))

    def lockstep(w: C.Workload) -> C.Served:
        def call() -> int:
            sampled, _ = asyncio.run(E.lockstep(eng.url, chats, tok, n=N, turns=T, reply=E.REPLY,
                                                sampling={"max_new_tokens": K, "temperature": 1.0, "ignore_eos": True}))
            return sampled
        return C.Served(timed("lockstep", call))

    return {"episodes": episodes, "lockstep": lockstep}


def profile(eng: Any, run: Callable[[C.Workload], C.Served], wl: C.Workload, top: int) -> None:
    """One episodes call with cProfile on the thread that runs its loop (rlgen's background loop)."""
    import cProfile
    import pstats

    from rlgen.engine import _episodes as engine_episodes

    original = engine_episodes.run_episodes
    prof = cProfile.Profile()

    async def profiled(*args: Any, **kwargs: Any) -> Any:
        prof.enable()
        try:
            return await original(*args, **kwargs)
        finally:
            prof.disable()

    engine_episodes.run_episodes = profiled  # type: ignore[assignment]
    try:
        run(wl)
    finally:
        engine_episodes.run_episodes = original  # type: ignore[assignment]
    pstats.Stats(prof).sort_stats("tottime").print_stats(top)


def main() -> None:
    ap = C.base_parser(__doc__, repeats=15)
    for key, default in (("prompts", 64), ("n", 4), ("turns", 4), ("turn-tokens", 64)):
        ap.add_argument(f"--{key}", type=int, default=default)
    ap.add_argument("--sync-env", action="store_true", help="the environment a plain function (each step on a worker thread)")
    ap.add_argument("--gpu-lockstep-s", type=float, default=GPU_LOCKSTEP_S)
    ap.add_argument("--profile", type=int, nargs="?", const=40, default=0, help="profile one more episodes call")
    ap.add_argument("--server-ms", type=float, default=0.0,
                    help="the server answers each /generate this long after it came (a real server's time on a "
                         "turn): rlgen's work done while it waits is then off the critical path, as on a GPU")
    args = ap.parse_args()
    import rlgen

    size = {"prompts": args.prompts, "n": args.n, "turns": args.turns, "turn_tokens": args.turn_tokens}
    record = C.Record(args.out, args, "bench/episodes_client.py")
    model = C.model_path(args.model)
    proc, url = start_server(model, args.server_ms / 1000)
    try:
        eng = rlgen.Engine.connect(url, progress=False)
        chats = E.chats(size["prompts"])
        wl = C.Workload("episodes", [[0]] * size["prompts"], n=size["n"], options={})
        clock, gc_runs = GcClock(), {}
        timed = methods(eng, chats, size, clock, gc_runs, sync_env=args.sync_env, timeline=Timeline())
        results = C.run_interleaved(timed, wl, repeats=C.repeats_of(args))
        for name, result in results.items():  # the warm-up's GC entry comes first
            for run, collected in zip(result["runs"], gc_runs.get(name, [])[1:]):
                run["gc"] = collected
        for run, line in zip(results["episodes"]["runs"], gc_runs.get("timeline", [])[1:]):
            run["timeline"] = line
        record.data.update(sizes=size, results=results, server_ms=args.server_ms)
        report(record, args.gpu_lockstep_s)
        record.save(complete=True)
        if args.profile:
            profile(eng, timed["episodes"], wl, args.profile)
        eng.close()
    finally:
        proc.kill()


def report(record: C.Record, gpu_lockstep_s: float) -> None:
    results = record["results"]
    rows = []
    for name in ("episodes", "lockstep"):
        runs = results[name]["runs"]
        secs = [r["seconds"] for r in runs]
        gc_s = [sum(g["seconds"] for g in r.get("gc", {}).values()) for r in runs]
        full = sum(r.get("gc", {}).get("2", {}).get("count", 0) for r in runs)
        rows.append([name, str(len(runs)), C.fmt(1e3 * statistics.median(secs), ".1f"),
                     "-".join(C.fmt(1e3 * x, ".1f") for x in C.bootstrap_median(secs) or ()) or "-",
                     C.fmt(1e3 * statistics.median(gc_s), ".1f"), str(full)])
    C.print_table("wall ms per call against an instant server (medians; 90% bootstrap interval); gc ms: the cyclic "
                  "GC's collections in the call (median); full: generation-2 collections over all runs",
                  ["method", "runs", "ms", "interval", "gc ms", "full"], rows)
    lines = [r["timeline"] for r in results["episodes"]["runs"] if r.get("timeline")]
    if lines:
        parts = {"before_first_ms": [x["before_first_ms"] for x in lines],
                 "between_ms": [b for x in lines for b in x["between_ms"]],
                 "after_last_ms": [x["after_last_ms"] for x in lines]}
        record["timeline"] = {k: {"median": statistics.median(v), "interval": C.bootstrap_median(v)}
                              for k, v in parts.items() if v}
        print("\n  an episodes call's client time on the critical path (ms, medians [90% interval]): " + "; ".join(
            f"{k} {v['median']:.1f}" + (f" [{v['interval'][0]:.1f}-{v['interval'][1]:.1f}]" if v["interval"] else "")
            for k, v in record["timeline"].items()), flush=True)
    diff = C.compare_difference(results, "episodes", ["lockstep"])
    iv = diff["interval"] or (diff["difference"], diff["difference"])
    share = diff["difference"] / gpu_lockstep_s
    record["summary"] = {"difference_s": diff["difference"], "interval_s": iv, "p": diff["p"],
                         "share_of_gpu_lockstep": share, "gpu_lockstep_s": gpu_lockstep_s}
    print(f"\n  episodes - lockstep: {1e3 * diff['difference']:.1f} ms [{1e3 * iv[0]:.1f}-{1e3 * iv[1]:.1f}], "
          f"rank test p {C.fmt(diff['p'], '.3f')}; as a share of the H200 lockstep loop's {gpu_lockstep_s:.3f} s: "
          f"{100 * share:.1f}% (a ratio of about {gpu_lockstep_s / (gpu_lockstep_s + diff['difference']):.3f}x "
          f"if the server's time were the same)", flush=True)


if __name__ == "__main__":
    os.environ.setdefault("RLGEN_PROGRESS", "0")
    main()
