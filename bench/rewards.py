"""What running a reward function in worker processes costs, next to calling it inline.

Not a test. Times `rlgen._reward_exec.run_calls` on `--calls` (default 4096) short strings with a
trivial function (`lambda x: float(len(x))`), so that nearly all of the time is the machinery:

    inline        mode="inline": the calls one by one in this process (the floor)
    thread        mode="thread"
    fresh         mode="process" after close_pools(): worker start-up included
    warm          mode="process" with the pool's workers already started by an untimed run
    hang_fresh    as fresh, but one call (the middle one) sleeps for an hour; timeout=1
    hang_warm     as warm, with that one hanging call

One untimed warm-up round, then `--repeats` rounds, each running every scenario once in a fresh
shuffled order. Prints medians with 90% bootstrap intervals (of the median, and of the difference
of medians for the derived numbers), and judges the targets:

    pool overhead (fresh - inline, and warm - inline)        < 1.5 s
    the hanging call's extra time (hang_X - X)               < 3 s, every other call ok

A target PASSes when all of its interval is on the right side of the bound, FAILs when all of it is
on the wrong side, and is NOISE otherwise. Every run's statuses are checked: a run where a call
other than the hanging one is not "ok" is recorded as a failure of that scenario.

    python bench/rewards.py --out rewards.json
"""

from __future__ import annotations

import argparse
import gc
import os
import random
import statistics
import time
from collections import Counter
from collections.abc import Callable
from importlib.metadata import PackageNotFoundError, version
from typing import Any

import _common as C

from rlgen._reward_exec import Call, close_pools, run_calls

SCENARIOS = ("inline", "thread", "fresh", "warm", "hang_fresh", "hang_warm")
OVERHEAD_BOUND_S = 1.5
HANG_BOUND_S = 3.0
HANG_TIMEOUT_S = 1.0


def trivial(x: str) -> float:
    return float(len(x))


def hangs_on(marker: str) -> Callable[[str], float]:
    def maybe_hang(x: str) -> float:
        if x == marker:
            time.sleep(3600)
        return float(len(x))

    return maybe_hang


def warm_pool() -> None:
    """Leave started workers in the pool (as many as a default run uses), untimed."""
    run_calls(trivial, [Call(("w",))] * 64)


def scenario(name: str, calls: list[Call], hang_index: int) -> Callable[[], dict[str, Any]]:
    hanging = name.startswith("hang")
    fn = hangs_on(calls[hang_index].args[0]) if hanging else trivial
    mode = "inline" if name == "inline" else "thread" if name == "thread" else "process"
    fresh = name.endswith("fresh")

    def prepare() -> None:
        if mode == "process":
            if fresh:
                close_pools()
            else:
                warm_pool()

    def run() -> dict[str, Any]:
        prepare()
        gc.collect()
        first: list[float] = []
        t0 = time.perf_counter()
        outcomes = run_calls(fn, calls, mode=mode, timeout=HANG_TIMEOUT_S if hanging else 30.0,
                             on_progress=lambda _: first.append(time.perf_counter()) if not first else None)
        seconds = time.perf_counter() - t0
        expected = ["timeout" if hanging and i == hang_index else "ok" for i in range(len(calls))]
        got = [o.status for o in outcomes]
        return {"seconds": seconds, "first_outcome_s": (first[0] - t0) if first else None,
                "statuses": dict(Counter(got)), "as_expected": got == expected}

    return run


def median_interval(values: list[float], *, draws: int = 4000, seed: int = 0) -> tuple[float, float] | None:
    if len(values) < 3:
        return None
    rng = random.Random(seed)
    medians = sorted(statistics.median(rng.choices(values, k=len(values))) for _ in range(draws))
    return medians[int(0.05 * draws)], medians[int(0.95 * draws) - 1]


def difference_interval(a: list[float], b: list[float], *, draws: int = 4000,
                        seed: int = 0) -> tuple[float, float] | None:
    """90% bootstrap interval of median(a) - median(b), each side resampled on its own."""
    if min(len(a), len(b)) < 3:
        return None
    rng = random.Random(seed)
    diffs = sorted(statistics.median(rng.choices(a, k=len(a))) - statistics.median(rng.choices(b, k=len(b)))
                   for _ in range(draws))
    return diffs[int(0.05 * draws)], diffs[int(0.95 * draws) - 1]


def judge(value: float | None, interval: tuple[float, float] | None, bound: float) -> str:
    """`value < bound`, judged on its interval."""
    if value is None:
        return "n/a"
    if interval is None:
        return "PASS" if value < bound else "FAIL"
    lo, hi = interval
    return "PASS" if hi < bound else "FAIL" if lo >= bound else "NOISE"


def report(record: C.Record) -> None:
    runs: dict[str, list[dict[str, Any]]] = record["runs"]
    seconds = {name: [r["seconds"] for r in runs.get(name, []) if r.get("as_expected")] for name in SCENARIOS}
    rows = []
    for name in SCENARIOS:
        values = seconds[name]
        interval = median_interval(values)
        firsts = [r["first_outcome_s"] for r in runs.get(name, []) if r.get("first_outcome_s") is not None]
        failed = sum(not r.get("as_expected") for r in runs.get(name, []))
        rows.append([name, C.fmt(statistics.median(values) if values else None, ".3f"),
                     f"{interval[0]:.3f}-{interval[1]:.3f}" if interval else "-",
                     C.fmt(statistics.median(firsts) if firsts else None, ".3f"), str(len(values)), str(failed)])
    C.print_table(f"{record['args']['calls']} calls of a trivial function: wall seconds per run",
                  ["scenario", "median s", "90% interval", "first outcome s", "runs ok", "runs wrong"], rows)
    targets = []
    for label, a, b, bound in [
        ("pool overhead, fresh pool (fresh - inline)", "fresh", "inline", OVERHEAD_BOUND_S),
        ("pool overhead, warm pool (warm - inline)", "warm", "inline", OVERHEAD_BOUND_S),
        ("one call hanging, fresh pool (hang_fresh - fresh)", "hang_fresh", "fresh", HANG_BOUND_S),
        ("one call hanging, warm pool (hang_warm - warm)", "hang_warm", "warm", HANG_BOUND_S),
    ]:
        xs, ys = seconds[a], seconds[b]
        value = statistics.median(xs) - statistics.median(ys) if xs and ys else None
        interval = difference_interval(xs, ys)
        word = judge(value, interval, bound)
        if any(not r.get("as_expected") for r in runs.get(a, [])):
            word = "FAIL"  # a wrong outcome is a miss whatever the time
        targets.append({"target": label, "value": value, "interval": interval, "bound": bound, "verdict": word})
        shown = "not measured" if value is None else f"{value:.3f} s"
        if interval:
            shown += f" [90% interval {interval[0]:.3f}-{interval[1]:.3f}]"
        print(f"  {word:5s} {label}: {shown} (target < {bound:g} s)", flush=True)
    record["targets"] = targets


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="where to write the JSON of all raw numbers")
    ap.add_argument("--calls", type=int, default=4096, help="calls per run (default 4096)")
    ap.add_argument("--repeats", type=int, default=7, help="timed rounds (default 7)")
    ap.add_argument("--quick", action="store_true", help="256 calls, 2 rounds: a smoke run, numbers mean nothing")
    C.add_report_only(ap)
    args = ap.parse_args()
    if C.reported_again(args, report):
        return
    if args.quick:
        args.calls, args.repeats = 256, 2
    record = C.Record(args.out, args, "bench/rewards.py")
    record["loadavg_at_start"] = os.getloadavg()  # the CPUs may be shared: other work shows here
    try:
        record["cloudpickle"] = version("cloudpickle")
    except PackageNotFoundError:
        record["cloudpickle"] = None
    calls = [Call((f"row {i:05d}: the answer is {i % 97}",)) for i in range(args.calls)]
    hang_index = args.calls // 2
    methods = {name: scenario(name, calls, hang_index) for name in SCENARIOS}
    record["runs"] = {name: [] for name in SCENARIOS}
    record["warmup"] = {}
    for name, run in methods.items():
        record["warmup"][name] = run()
        C.log(f"warm-up {name:11s} {record['warmup'][name]['seconds']:.3f} s")
    order_rng = random.Random(0)
    for r in range(args.repeats):
        order = list(SCENARIOS)
        order_rng.shuffle(order)  # a fresh shuffle each round: no scenario always follows the same one
        for position, name in enumerate(order):
            result = methods[name]()
            result.update(repeat=r, after=order[position - 1] if position else None)
            record["runs"][name].append(result)
            C.log(f"repeat {r + 1}/{args.repeats} {name:11s} {result['seconds']:.3f} s "
                  f"(first outcome {C.fmt(result['first_outcome_s'], '.3f')} s) {result['statuses']}")
            record.save()
    close_pools()
    record["loadavg_at_end"] = os.getloadavg()
    report(record)
    record.save(complete=True)


if __name__ == "__main__":
    main()
