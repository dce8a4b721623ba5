"""Client-side cost of one large /generate answer: JSON parse + Rollouts + DataFrame + tensors.

Not a test. Builds a synthetic SGLang /generate body (default 4096 samples x 256 tokens, with
per-token logprobs; a second variant adds top-5 logprobs), then times, per repeat and per variant
(variants interleaved so drift hits both alike):

    parse     orjson.loads(body)                      (the client's job)
    build     rollouts_from_responses(...) incl. .df  (flat arrays + per-row DataFrame columns)
    tensors   .tensors()                              (padding into torch tensors)
    free      dropping the parsed responses           (and any GC work a pause deferred)

each once with Python's cyclic GC on and once with it paused around the whole sequence, and
prints medians in ms plus microseconds per generated token.

    python bench/client_overhead.py                    # the numbers in the report
    python bench/client_overhead.py --options          # also: ways to pull logprobs out of tuples
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import statistics
import sys
import time
from collections.abc import Callable
from itertools import chain
from operator import itemgetter
from pathlib import Path
from typing import Any

import numpy as np
import orjson

sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[1]))  # run from a checkout
import _common as C  # this directory is on sys.path (the script's own, or scaling's)

from rlgen.rollouts import rollouts_from_responses


def make_body(rows: int, tokens: int, n: int, top_k: int, seed: int = 0) -> tuple[bytes, list[list[int]]]:
    """A JSON body shaped like SGLang's batched /generate answer (rows built one at a time)."""
    rng = random.Random(seed)
    prompts = [[rng.randrange(32000) for _ in range(rng.randrange(16, 128))] for _ in range(rows // n)]
    parts = []
    for i in range(rows):
        length = tokens if i % 4 else rng.randrange(1, tokens)  # a quarter stop early
        ids = [rng.randrange(32000) for _ in range(length)]
        meta: dict[str, Any] = {
            "id": f"rid-{i}",
            "finish_reason": (
                {"type": "length", "length": length} if length == tokens else {"type": "stop", "matched": 2}
            ),
            "prompt_tokens": len(prompts[i // n]),
            "completion_tokens": length,
            "cached_tokens": 0,
            "e2e_latency": 1.5,
            "weight_version": "default",
            "output_token_logprobs": [[-rng.random() * 4, t, None] for t in ids],
        }
        if top_k:
            meta["output_top_logprobs"] = [
                [[-rng.random() * 4, rng.randrange(32000), None] for _ in range(top_k)] for _ in ids
            ]
        parts.append(orjson.dumps({"text": "x" * (4 * length), "output_ids": ids, "meta_info": meta}))
    return b"[" + b",".join(parts) + b"]", prompts


def run_variant(body: bytes, prompts: list[list[int]], n: int, gc_paused: bool) -> dict[str, float]:
    """One parse + build + tensors + free; with `gc_paused`, cyclic GC is off for all of it.

    Millions of small lists make the cyclic GC run (and rescan them) many times while orjson
    builds them; a client can pause it, since nothing here creates cycles. Pausing only moves
    work if the parsed objects outlive the pause, so the responses are freed before GC comes back
    and that freeing is timed too ("free").
    """
    gc.collect()
    if gc_paused:
        gc.disable()
    t0 = time.perf_counter()
    data = orjson.loads(body)
    t1 = time.perf_counter()
    res = rollouts_from_responses(data, prompt_ids=prompts, n=n, pad_token_id=0, model="bench")
    _ = res.df
    t2 = time.perf_counter()
    tensors = res.tensors()
    t3 = time.perf_counter()
    n_rows = len(data)
    del data
    if gc_paused:
        gc.enable()
        gc.collect(0)  # whatever the pause deferred is paid here, inside the timing
    t4 = time.perf_counter()
    assert tensors["logprobs"].shape[0] == n_rows
    return {"parse": t1 - t0, "build": t2 - t1, "tensors": t3 - t2, "free": t4 - t3, "tokens": float(res.lengths.sum())}


def compare_options(body: bytes, repeats: int) -> None:
    """Ways to turn per-row [[lp, id, None], ...] lists into one flat float32 array."""
    data = orjson.loads(body)
    rows = [d["meta_info"]["output_token_logprobs"] for d in data]
    total = sum(map(len, rows))
    options: dict[str, Callable[[], np.ndarray]] = {
        "fromiter(map(itemgetter(0), chain))": lambda: np.fromiter(
            map(itemgetter(0), chain.from_iterable(rows)), np.float32, total
        ),
        "per row np.asarray(row, object)[:, 0]": lambda: np.concatenate(
            [np.asarray(r, dtype=object)[:, 0].astype(np.float32) for r in rows]
        ),
        "per row np.array([t[0] for t in row])": lambda: np.concatenate(
            [np.array([t[0] for t in r], np.float32) for r in rows]
        ),
        "flat list comprehension": lambda: np.array([t[0] for r in rows for t in r], np.float32),
    }
    times: dict[str, list[float]] = {k: [] for k in options}
    for _ in range(repeats):
        for name, fn in options.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    print(f"\nlogprob extraction options ({total} tokens, median of {repeats}):")
    for name, ts in times.items():
        print(f"  {name:42s} {statistics.median(ts) * 1e3:8.1f} ms")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=4096)
    ap.add_argument("--tokens", type=int, default=256, help="max tokens per sample")
    ap.add_argument("--n", type=int, default=4, help="samples per prompt")
    ap.add_argument("--top-k", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--options", action="store_true", help="also compare logprob extraction methods")
    ap.add_argument("--out", type=Path, default=None, help="also write the medians here (JSON)")
    args = ap.parse_args()
    if args.rows % args.n:
        ap.error("--rows must be a multiple of --n")

    variants = {}
    for k in (0, args.top_k):
        t0 = time.perf_counter()
        variants[f"top_k={k}"] = make_body(args.rows, args.tokens, args.n, k)
        body = variants[f"top_k={k}"][0]
        print(f"built top_k={k} body: {len(body) / 1e6:.1f} MB in {time.perf_counter() - t0:.1f}s")

    warm_body, warm_prompts = make_body(args.n * 4, 8, args.n, args.top_k)
    run_variant(warm_body, warm_prompts, args.n, False)  # imports pandas and torch outside the timings

    results: dict[tuple[str, bool], list[dict[str, float]]] = {}
    for _ in range(args.repeats):  # interleaved: every repeat runs every variant once
        for name, (body, prompts) in variants.items():
            for gc_paused in (False, True):
                results.setdefault((name, gc_paused), []).append(run_variant(body, prompts, args.n, gc_paused))

    print(f"\n{args.rows} samples, up to {args.tokens} tokens each; medians of {args.repeats} interleaved repeats (ms)")
    print(
        f"{'variant':12s} {'cyclic gc':9s} {'parse':>8s} {'build':>8s} {'tensors':>8s} {'free':>8s} {'total':>8s} "
        f"{'us/token':>9s} {'build+tensors us/token':>23s}"
    )
    summary = []
    for (name, gc_paused), runs in results.items():
        med = {k: statistics.median(r[k] for r in runs) for k in ("parse", "build", "tensors", "free")}
        tokens = runs[0]["tokens"]
        total = sum(med.values())
        summary.append({"variant": name, "gc_paused": gc_paused, "tokens": tokens, "total_s": total,
                        **{f"{k}_s": v for k, v in med.items()}})
        ours = med["build"] + med["tensors"]
        print(
            f"{name:12s} {'paused' if gc_paused else 'on':9s} {med['parse'] * 1e3:8.1f} {med['build'] * 1e3:8.1f} "
            f"{med['tensors'] * 1e3:8.1f} {med['free'] * 1e3:8.1f} {total * 1e3:8.1f} "
            f"{total / tokens * 1e6:9.3f} {ours / tokens * 1e6:23.3f}"
        )
    print(f"tokens per variant: {int(tokens)}")
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"script": "bench/client_overhead.py", "environment": C.environment(),
                                        "args": {k: str(v) for k, v in vars(args).items()}, "medians": summary,
                                        "cpu_count": os.cpu_count()}, indent=1))
    if args.options:
        compare_options(variants["top_k=0"][0], args.repeats)


if __name__ == "__main__":
    main()
