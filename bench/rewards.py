"""What scoring rollouts costs through `Rollouts.add_rewards`: worker processes next to inline.

Not a test. Builds Rollouts offline (no server: `rollouts_from_responses` on synthetic entries,
`--rows` rows (default 4096), 4 samples a prompt, plus an `answer` column) and times the user's
call, `res.add_rewards({name: fn}, mode=..., progress=False)` (no progress bar: it is display,
not scoring), in two phases, each with one untimed warm-up of every scenario and then rounds that
run every scenario once in a fresh shuffled order:

Trivial reward, `trivial(completion: str) -> float` (the length), so that nearly all of the time
is the machinery (`--repeats` rounds, default 15):

    inline        mode="inline": the rows one by one in this process (the floor)
    fresh         mode="process" after close_pools() (untimed): worker start-up included
    warm          mode="process", the pool's workers started by an untimed run just before
    hang_fresh    as fresh, but one row (the middle one) sleeps for an hour; timeout=1
    hang_warm     as warm, with that hanging row
    calls_inline  `rewards._exec.run_calls` on the same completions, inline: the pool's layer
    calls_warm    the same, mode="process", warm pool   without add_rewards' own work (the row
                  batch, the columns, the group statistics), which inline - calls_inline measures

math-verify, `rlgen.rewards.math_verify_reward(completion, answer)` on generated completions
(a reasoning preamble, then the final answer boxed, after "The answer is", or in plain text:
integers, fractions, decimals, roots, multiples of pi, polynomials; right in an equivalent form,
wrong, or no answer at all; fixed seed), workers=os.cpu_count() (`--math-repeats` rounds,
default 9):

    math_inline   mode="inline", in this process's main thread (math-verify's signal.alarm works)
    math_fresh    mode="process" after close_pools(): start-up, and each worker's imports of rlgen
                  and math-verify, included
    math_warm     mode="process" on workers that scored math-verify rows just before (untimed)
    math_one      as math_warm with workers=1 (no target): whether a row costs a worker more CPU
                  than it costs inline, apart from our own two workers contending for the cores

Every run is checked: the trivial scenarios must score every row "ok" with its length (the
hanging ones: exactly the hanging row "timeout", every other row "ok"); math-verify's runs must
give the statuses and values of the first inline run, row for row. A wrong run FAILs its target
whatever its time. Each run also records the CPU seconds this process and its workers used and
how many of the machine's cores were busy with other work meanwhile (/proc/stat; Linux).

Targets, judged on 90% bootstrap intervals (`_common.compare_difference` / `compare`: PASS if the
whole interval is on the right side of the bound, FAIL if all of it is on the wrong side, NOISE if
it straddles it):

    pool overhead (fresh - inline, warm - inline)                  < 1.5 s
    one hung row, timeout=1 (hang_fresh - fresh, hang_warm - warm)  < 3 s, every other row ok
    math-verify speed-up (math_inline / math_warm, / math_fresh)   >= 0.7 x os.cpu_count()

    python bench/rewards.py --out rewards.json
    python bench/rewards.py --report-only rewards.json --out /tmp/again.json
"""

from __future__ import annotations

import argparse
import gc
import math
import os
import random
import resource
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from typing import Any, NamedTuple

import _common as C

from rlgen.rewards import math_verify_reward
from rlgen.rewards._exec import Call, Mode, Outcome, close_pools, run_calls
from rlgen.rollouts import Rollouts, rollouts_from_responses

TRIVIAL = ("inline", "fresh", "warm", "hang_fresh", "hang_warm", "calls_inline", "calls_warm")
MATH = ("math_inline", "math_fresh", "math_warm", "math_one")
SAMPLES_PER_PROMPT = 4
OVERHEAD_BOUND_S = 1.5
HANG_BOUND_S = 3.0
HANG_TIMEOUT_S = 1.0
SPEEDUP_PER_CORE = 0.7


# ---------------------------------------------------------------------------------------------
# Reward functions


def trivial(completion: str) -> float:
    return float(len(completion))


def hanging_on(marker: str) -> Callable[[str], float]:
    """`trivial`, except that the row whose completion is `marker` sleeps for an hour."""
    def trivial(completion: str) -> float:
        if completion == marker:
            time.sleep(3600)
        return float(len(completion))

    return trivial


# ---------------------------------------------------------------------------------------------
# Rollouts built offline


def offline_rollouts(completions: Sequence[str], answers: Sequence[str]) -> Rollouts:
    """Rollouts as `generate` returns them (SGLang entries, `SAMPLES_PER_PROMPT` a prompt), plus `answer`."""
    entries = [{"text": c, "output_ids": list(range(1, 2 + i % 3)),
                "meta_info": {"finish_reason": {"type": "length" if i % 4 == 3 else "stop"},
                              "completion_tokens": 1 + i % 3}}
               for i, c in enumerate(completions)]
    res = rollouts_from_responses(entries, prompt_ids=[[1, 2]] * (len(completions) // SAMPLES_PER_PROMPT),
                                  n=SAMPLES_PER_PROMPT, pad_token_id=0)
    return res.with_columns({"answer": list(answers)})


def trivial_completions(rows: int) -> list[str]:
    return [f"row {i:05d}: the answer is {i % 97}" for i in range(rows)]


_STEPS = (
    lambda r: f"First, note that ${(a := r.randrange(2, 40))} + {(b := r.randrange(2, 40))} = {a + b}$.",
    lambda r: f"Multiplying both sides by {(c := r.randrange(2, 9))} gives ${c}x = {c * r.randrange(2, 30)}$.",
    lambda r: f"We have $\\frac{{{r.randrange(1, 9)}}}{{{r.randrange(2, 12)}}}$ of the total left.",
    lambda r: f"Squaring gives $y^2 = {r.randrange(2, 30) ** 2}$.",
    lambda _: "We simplify the expression step by step, collecting like terms.",
    lambda _: "Substituting back into the original equation confirms the result.",
    lambda _: "Let me reconsider the constraints before writing the final answer.",
)
_NO_MATH = (
    "I am not sure how to finish this problem.",
    "This problem needs more information than was given, so I cannot answer it.",
    "Let me think about this carefully. The approach above does not lead anywhere useful.",
)
SQUARE_FREE = (2, 3, 5, 6, 7, 10, 11)


def _problem(rng: random.Random) -> tuple[str, list[str], list[str]]:
    """A gold answer (LaTeX), forms of it a completion may give, and wrong answers of the same kind."""
    kind = rng.choice(("integer", "fraction", "fraction", "root", "pi", "polynomial"))
    if kind == "integer":
        k = rng.randrange(-50, 500)
        return str(k), [str(k), f"{k}.0" if rng.random() < 0.2 else str(k)], [str(k + d) for d in (1, -2, 10)]
    if kind == "fraction":
        b = rng.randrange(2, 13)
        a = rng.choice([x for x in range(1, 3 * b) if math.gcd(x, b) == 1])
        forms = [f"\\frac{{{a}}}{{{b}}}", f"{a}/{b}", f"\\dfrac{{{a}}}{{{b}}}"]
        if all(p in (2, 5) for p in _prime_factors(b)):
            forms.append(str(a / b))
        return f"\\frac{{{a}}}{{{b}}}", forms, [f"\\frac{{{a + 1}}}{{{b}}}", f"{b}/{a}", str(round(a / b + 0.1, 3))]
    if kind == "root":
        k, m = rng.randrange(1, 6), rng.choice(SQUARE_FREE)
        coeff = "" if k == 1 else str(k)
        return (f"{coeff}\\sqrt{{{m}}}", [f"{coeff}\\sqrt{{{m}}}", f"\\sqrt{{{k * k * m}}}"],
                [f"{coeff}\\sqrt{{{m + 1}}}", f"{k + 1}\\sqrt{{{m}}}"])
    if kind == "pi":
        k = rng.randrange(2, 13)
        return f"{k}\\pi", [f"{k}\\pi", f"\\pi \\cdot {k}"], [f"{k + 1}\\pi", f"\\frac{{{k}\\pi}}{{2}}"]
    a = rng.randrange(1, 9)
    gold = f"x^2+{2 * a}x+{a * a}"
    return gold, [gold, f"(x+{a})^2"], [f"(x-{a})^2", f"x^2+{a}x+{a * a}"]


def _prime_factors(n: int) -> set[int]:
    found, p = set(), 2
    while n > 1:
        while n % p == 0:
            found.add(p)
            n //= p
        p += 1
    return found


def _completion(rng: random.Random, forms: list[str], wrong: list[str]) -> tuple[str, str]:
    """One completion and what it was made to be: "right", "wrong" or "none" (no answer in it)."""
    outcome = rng.choices(("right", "wrong", "none"), weights=(50, 35, 15))[0]
    if outcome == "none":
        return " ".join(rng.sample(_NO_MATH, 2)), outcome
    steps = " ".join(step(rng) for step in rng.sample(_STEPS, rng.randrange(1, 5)))
    answer = rng.choice(forms if outcome == "right" else wrong)
    where = rng.choices(("boxed", "answer-is", "plain"), weights=(60, 25, 15))[0]
    if where == "plain" and "\\" not in answer and "^" not in answer:
        ending = f"So the answer is {answer}."
    elif where == "answer-is":
        ending = f"The answer is ${answer}$."
    else:
        ending = f"Therefore, the final answer is $\\boxed{{{answer}}}$."
    return f"{steps}\n\n{ending}", outcome


def math_rows(rows: int, *, seed: int = 0) -> tuple[list[str], list[str], Counter[str]]:
    """`rows` completions and their gold answers, `SAMPLES_PER_PROMPT` a problem, and how many of
    each made outcome (right / wrong / none)."""
    rng = random.Random(seed)
    completions: list[str] = []
    answers: list[str] = []
    made: Counter[str] = Counter()
    for _ in range(rows // SAMPLES_PER_PROMPT):
        gold, forms, wrong = _problem(rng)
        for _ in range(SAMPLES_PER_PROMPT):
            text, outcome = _completion(rng, forms, wrong)
            completions.append(text)
            answers.append(gold)
            made[outcome] += 1
    return completions, answers, made


# ---------------------------------------------------------------------------------------------
# CPU: this process and its workers, and the rest of the machine


class CpuMark(NamedTuple):
    wall: float
    ours_s: float | None     # this process + its children (workers), user + system
    own_s: float | None      # this process alone
    busy: int | None         # /proc/stat jiffies, all CPUs
    total: int | None


_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _children_cpu_s() -> float:
    """User + system seconds of this process's live children (the pool's workers), from /proc."""
    seconds = 0.0
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/children") as fh:
                pids = fh.read().split()
        except OSError:
            continue
        for pid in pids:
            try:
                with open(f"/proc/{pid}/stat") as fh:
                    fields = fh.read().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue  # gone meanwhile: reaped ones count in RUSAGE_CHILDREN
            seconds += (int(fields[11]) + int(fields[12])) / _TICK
    return seconds


def cpu_mark() -> CpuMark:
    now = time.perf_counter()
    try:
        own, reaped = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        ours = own.ru_utime + own.ru_stime + reaped.ru_utime + reaped.ru_stime + _children_cpu_s()
        with open("/proc/stat") as fh:
            jiffies = [int(x) for x in fh.readline().split()[1:]]
        idle = jiffies[3] + jiffies[4]  # idle + iowait
        total = sum(jiffies[:8])        # guest time is already in user
        return CpuMark(now, ours, own.ru_utime + own.ru_stime, total - idle, total)
    except (OSError, ValueError, IndexError):
        return CpuMark(now, None, None, None, None)


def cpu_between(a: CpuMark, b: CpuMark) -> dict[str, float | None]:
    """CPU seconds of this process and its workers, and of this process alone; the machine's busy
    cores and those busy with other work (everything but ours), averaged over the interval."""
    if (a.ours_s is None or b.ours_s is None or a.own_s is None or b.own_s is None or a.busy is None
            or b.busy is None or not b.total or not a.total):
        return {"ours_cpu_s": None, "parent_cpu_s": None, "busy_cores": None, "others_cores": None}
    wall = b.wall - a.wall
    ours = b.ours_s - a.ours_s
    busy = (os.cpu_count() or 1) * (b.busy - a.busy) / max(1, b.total - a.total)
    return {"ours_cpu_s": ours, "parent_cpu_s": b.own_s - a.own_s, "busy_cores": busy, "others_cores": max(0.0, busy - ours / wall) if wall > 0 else None}


# ---------------------------------------------------------------------------------------------
# Scenarios


@dataclass(frozen=True)
class Scenario:
    """`prepare` (untimed), then the timed `run`, then `check` of what it returned: None if right,
    else what was wrong."""

    prepare: Callable[[], None]
    run: Callable[[], Any]
    check: Callable[[Any], tuple[dict[str, int], str | None]]


def _nothing() -> None:
    pass


def warm_pool(fn: Callable[..., Any], args: tuple[Any, ...], workers: int | None = None) -> None:
    """Leave started workers in the pool, as many as a default run uses, having called `fn` (untimed)."""
    run_calls(fn, [Call(args)] * 64, workers=workers)


def check_columns(res: Rollouts, name: str, expected_status: list[str],
                  expected_value: Sequence[float]) -> tuple[dict[str, int], str | None]:
    """The statuses counted, and what differs from the expected statuses and values (NaN = NaN)."""
    df = res.df
    status = df[f"reward_{name}_status"].tolist()
    value = df[f"reward_{name}"].tolist()
    wrong = [i for i, (s, e, v, x) in enumerate(zip(status, expected_status, value, expected_value))
             if s != e or not (v == x or (v != v and x != x))]
    return dict(Counter(status)), (None if not wrong else
                                   f"{len(wrong)} rows differ, first row {wrong[0]}: {status[wrong[0]]} {value[wrong[0]]!r} "
                                   f"for {expected_status[wrong[0]]} {expected_value[wrong[0]]!r}")


def check_outcomes(outcomes: list[Outcome], expected: Sequence[float]) -> tuple[dict[str, int], str | None]:
    got = [(o.status, o.value) for o in outcomes]
    wrong = [i for i, (g, x) in enumerate(zip(got, expected)) if g != ("ok", x)]
    return dict(Counter(s for s, _ in got)), (None if not wrong else f"{len(wrong)} calls differ, first {wrong[0]}: "
                                                                     f"{got[wrong[0]]}")


def trivial_scenarios(res: Rollouts, hang_index: int) -> dict[str, Scenario]:
    completions = res.df["completion"].tolist()
    lengths = [float(len(c)) for c in completions]
    all_ok = ["ok"] * len(res)
    hung_status = ["timeout" if i == hang_index else "ok" for i in range(len(res))]
    hung_value = [math.nan if i == hang_index else v for i, v in enumerate(lengths)]
    hang = hanging_on(completions[hang_index])
    calls = [Call((c,)) for c in completions]

    def warm() -> None:
        warm_pool(trivial, ("w",))

    def scored(fn: Callable[[str], float], mode: Mode, timeout: float = 30.0) -> Callable[[], Rollouts]:
        return lambda: res.add_rewards({"trivial": fn}, mode=mode, timeout=timeout, progress=False)

    def ok_rows(out: Rollouts) -> tuple[dict[str, int], str | None]:
        return check_columns(out, "trivial", all_ok, lengths)

    def hung_rows(out: Rollouts) -> tuple[dict[str, int], str | None]:
        return check_columns(out, "trivial", hung_status, hung_value)

    return {
        "inline": Scenario(_nothing, scored(trivial, "inline"), ok_rows),
        "fresh": Scenario(close_pools, scored(trivial, "process"), ok_rows),
        "warm": Scenario(warm, scored(trivial, "process"), ok_rows),
        "hang_fresh": Scenario(close_pools, scored(hang, "process", HANG_TIMEOUT_S), hung_rows),
        "hang_warm": Scenario(warm, scored(hang, "process", HANG_TIMEOUT_S), hung_rows),
        "calls_inline": Scenario(_nothing, lambda: run_calls(trivial, calls, mode="inline"),
                                 lambda out: check_outcomes(out, lengths)),
        "calls_warm": Scenario(warm, lambda: run_calls(trivial, calls, mode="process"),
                               lambda out: check_outcomes(out, lengths)),
    }


def math_scenarios(res: Rollouts, reference: Rollouts, workers: int) -> dict[str, Scenario]:
    """The math-verify runs; each is checked against `reference` (an inline run, row for row)."""
    ref = reference.df
    status, value = ref["reward_math_status"].tolist(), ref["reward_math"].tolist()
    first = res.df[["completion", "answer"]].iloc[0].tolist()

    def warm() -> None:
        warm_pool(math_verify_reward, tuple(first), workers=workers)

    def scored(mode: Mode, n: int | None = None) -> Callable[[], Rollouts]:
        return lambda: res.add_rewards({"math": math_verify_reward}, mode=mode, workers=n, progress=False)

    def same(out: Rollouts) -> tuple[dict[str, int], str | None]:
        return check_columns(out, "math", status, value)

    return {"math_inline": Scenario(_nothing, scored("inline"), same),
            "math_fresh": Scenario(close_pools, scored("process", workers), same),
            "math_warm": Scenario(warm, scored("process", workers), same),
            "math_one": Scenario(warm, scored("process", 1), same)}


def timed(scenario: Scenario) -> dict[str, Any]:
    scenario.prepare()
    gc.collect()
    before = cpu_mark()
    t0 = time.perf_counter()
    out = scenario.run()
    seconds = time.perf_counter() - t0
    after = cpu_mark()
    statuses, wrong = scenario.check(out)
    rows = len(out)
    return {"seconds": seconds, "rows": rows, "rows_s": rows / seconds, "statuses": statuses, "wrong": wrong,
            **cpu_between(before, after)}


def interleave(phase: str, scenarios: dict[str, Scenario], repeats: int, record: C.Record, *, seed: int) -> None:
    """One untimed warm-up of each scenario, then `repeats` rounds of all of them in a fresh shuffled order;
    every run into record["phases"][phase][name]["runs"], saved as it ends."""
    out: dict[str, dict[str, Any]] = {name: {"warmup": None, "runs": []} for name in scenarios}
    record["phases"][phase] = out
    for name, scenario in scenarios.items():
        out[name]["warmup"] = run = timed(scenario)
        C.log(f"{phase} warm-up {name:12s} {run['seconds']:7.3f} s {run['statuses']}"
              + (f" WRONG: {run['wrong']}" if run["wrong"] else ""))
    record.save()
    order_rng = random.Random(seed)
    for r in range(repeats):
        order = list(scenarios)
        order_rng.shuffle(order)  # a fresh shuffle each round: no scenario always follows the same one
        for position, name in enumerate(order):
            run = timed(scenarios[name])
            run.update(repeat=r, after=order[position - 1] if position else None, loadavg=os.getloadavg())
            out[name]["runs"].append(run)
            C.log(f"{phase} {r + 1}/{repeats} {name:12s} {run['seconds']:7.3f} s, ours {C.fmt(run['ours_cpu_s'], '.2f')} "
                  f"CPU s, others {C.fmt(run['others_cores'], '.2f')} cores {run['statuses']}"
                  + (f" WRONG: {run['wrong']}" if run["wrong"] else ""))
            record.save()


# ---------------------------------------------------------------------------------------------
# Report


def _interval(values: Sequence[float]) -> str:
    found = C.bootstrap_median(values)
    return f"{found[0]:.3f}-{found[1]:.3f}" if found else "-"


def _wrong(per: dict[str, Any], names: Sequence[str]) -> str | None:
    bad = [f"{name} repeat {r['repeat'] + 1}: {r['wrong']}" for name in names for r in per[name]["runs"] if r["wrong"]]
    return "; ".join(bad) if bad else None


def scenario_table(title: str, per: dict[str, Any]) -> None:
    rows = []
    for name, result in per.items():
        runs = result["runs"]
        seconds = [r["seconds"] for r in runs]
        rows.append([name, str(len(runs)), str(sum(bool(r["wrong"]) for r in runs)),
                     C.fmt(C.median_or_none(seconds), ".3f"), _interval(seconds),
                     C.fmt(min(seconds, default=None), ".3f"), C.fmt(max(seconds, default=None), ".3f"),
                     C.fmt(C.median_or_none([r["ours_cpu_s"] for r in runs]), ".2f"),
                     C.fmt(C.median_or_none([r.get("parent_cpu_s") for r in runs]), ".2f"),
                     C.fmt(C.median_or_none([r["others_cores"] for r in runs]), ".2f")])
    C.print_table(title, ["scenario", "runs", "wrong", "median s", "90% interval", "min s", "max s",
                          "our CPU s", "this process", "others' cores"], rows)


def math_by_round(per: dict[str, Any], comparisons: dict[str, Any]) -> None:
    """Each round's own inline / process ratios, beside the other work measured during its inline run.

    Not the verdict (that is `compare` on the pooled runs): the machine's other load drifts over
    minutes, and the runs of one round stand closest in time, so these show how the speed-up
    follows the cores left to us.
    """
    inline = {r["repeat"]: r for r in per["math_inline"]["runs"]}
    others = [name for name in MATH if name != "math_inline" and name in per]
    rounds = {name: {r["repeat"]: r for r in per[name]["runs"]} for name in others}
    rows = []
    for k in sorted(inline):
        rows.append([str(k + 1), C.fmt(inline[k]["seconds"], ".2f"), C.fmt(inline[k]["others_cores"], ".2f"),
                     *(f"{inline[k]['seconds'] / rounds[name][k]['seconds']:.2f} "
                       f"({C.fmt(rounds[name][k]['others_cores'], '.2f')})" if k in rounds[name] else "-"
                       for name in others)])
    C.print_table("math-verify, round by round: inline seconds, inline / each process run (others' cores during it)",
                  ["round", "inline s", "others' cores", *(f"/ {name}" for name in others)], rows)
    for name in others:
        ratios = [inline[k]["seconds"] / rounds[name][k]["seconds"] for k in sorted(inline) if k in rounds[name]]
        interval = C.bootstrap_median(ratios)
        comparisons[f"math_inline / {name}, paired by round"] = {
            "ratios": ratios, "median": C.median_or_none(ratios), "interval": interval}
        shown = f" [{interval[0]:.3f}-{interval[1]:.3f}]" if interval else ""
        print(f"  paired by round, inline / {name}: median {C.fmt(C.median_or_none(ratios), '.3f')}x{shown}",
              flush=True)


def report(record: C.Record) -> None:
    phases: dict[str, dict[str, Any]] = record["phases"]
    rows, cores = record["rows"], record["environment"]["cpu_count"] or 1
    targets = C.Targets()
    comparisons: dict[str, Any] = {}
    trivial_runs = phases.get("trivial")
    if trivial_runs:
        scenario_table(f"Trivial reward, {rows} rows: seconds per add_rewards (calls_*: run_calls) call", trivial_runs)
        print("\nTargets", flush=True)
        for label, ours, theirs, bound in [
            ("pool overhead, fresh pool (fresh - inline)", "fresh", "inline", OVERHEAD_BOUND_S),
            ("pool overhead, warm pool (warm - inline)", "warm", "inline", OVERHEAD_BOUND_S),
            (f"one row hung, timeout={HANG_TIMEOUT_S:g}, fresh pool (hang_fresh - fresh)", "hang_fresh", "fresh",
             HANG_BOUND_S),
            (f"one row hung, timeout={HANG_TIMEOUT_S:g}, warm pool (hang_warm - warm)", "hang_warm", "warm",
             HANG_BOUND_S),
        ]:
            c = comparisons[f"{ours} - {theirs}"] = C.compare_difference(trivial_runs, ours, [theirs])
            targets.check_interval(label, c["difference"], c["interval"], bound, op="<", unit="s",
                                   wrong=_wrong(trivial_runs, [ours, theirs]))
        print("\nNot targets (median differences [90% interval], rank test p)", flush=True)
        for label, ours, theirs in [
            ("add_rewards' own work, inline (inline - calls_inline)", "inline", "calls_inline"),
            ("add_rewards' own work, warm pool (warm - calls_warm)", "warm", "calls_warm"),
            ("the pool alone, warm (calls_warm - calls_inline)", "calls_warm", "calls_inline"),
            ("a fresh pool's start (fresh - warm)", "fresh", "warm"),
        ]:
            c = comparisons[f"{ours} - {theirs}"] = C.compare_difference(trivial_runs, ours, [theirs])
            shown = C.fmt(c["difference"], ".3f")
            if c["interval"]:
                shown += f" [{c['interval'][0]:.3f}-{c['interval'][1]:.3f}]"
            print(f"  {label}: {shown} s, p = {C.fmt(c['p'], '.3f')}", flush=True)
    math_runs = phases.get("math")
    if math_runs:
        scenario_table(f"math_verify_reward, {rows} rows, workers={record['math_workers']}: seconds per add_rewards "
                       "call", math_runs)
        print("\nTargets", flush=True)
        bound = SPEEDUP_PER_CORE * cores
        for name in ("math_warm", "math_fresh"):
            # compare's ratio on seconds, inline over process: the speed-up
            c = comparisons[f"math_inline / {name}"] = C.compare(math_runs, "math_inline", [name], key="seconds")
            targets.check_interval(f"math-verify speed-up, inline / {name} ({c['runs'][0]} vs {c['runs'][1]} runs, "
                                   f"p = {C.fmt(c['p'], '.3f')})", c["ratio"], c["interval"], bound,
                                   wrong=_wrong(math_runs, ["math_inline", name]))
        one = comparisons["math_inline / math_one"] = C.compare(math_runs, "math_inline", ["math_one"], key="seconds")
        if one["ratio"] is not None:
            shown = f" [{one['interval'][0]:.3f}-{one['interval'][1]:.3f}]" if one["interval"] else ""
            print(f"  (not a target) inline / one worker: {one['ratio']:.3f}x{shown}, p = {C.fmt(one['p'], '.3f')}",
                  flush=True)
        math_by_round(math_runs, comparisons)
        print("\nWhere the cores went (medians over runs)", flush=True)
        for name in MATH:
            if name not in math_runs:
                continue
            runs = math_runs[name]["runs"]
            cpu, parent, wall, others = (C.median_or_none([r.get(k) for r in runs])
                                         for k in ("ours_cpu_s", "parent_cpu_s", "seconds", "others_cores"))
            if cpu is None or wall is None:
                continue
            per_run = C.median_or_none([r["ours_cpu_s"] / r["seconds"] for r in runs if r.get("ours_cpu_s")])
            print(f"  {name}: {cpu:.2f} CPU s (this process {C.fmt(parent, '.2f')}), {per_run:.2f} of {cores} cores "
                  f"busy for us, {C.fmt(others, '.2f')} with other work", flush=True)
    record["comparisons"] = comparisons
    record["targets"] = targets.rows
    made = record.data.get("math_made")
    if made:
        print(f"\nmath-verify rows as made: {made}; the reference (inline) run's statuses "
              f"{record.data.get('math_reference')} and values {record.data.get('math_reference_values')}", flush=True)
    print(f"load average at start {record['loadavg_at_start']}, at end {record.data.get('loadavg_at_end')}",
          flush=True)


# ---------------------------------------------------------------------------------------------


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="where to write the JSON of all raw numbers")
    ap.add_argument("--rows", type=int, default=4096, help="rows per run (default 4096)")
    ap.add_argument("--repeats", type=int, default=15, help="timed rounds of the trivial reward (default 15)")
    ap.add_argument("--math-repeats", type=int, default=9, help="timed rounds of math-verify (default 9)")
    ap.add_argument("--phases", default="trivial,math", help="comma-separated subset of trivial,math")
    ap.add_argument("--quick", action="store_true", help="256 rows, 2 rounds: a smoke run, numbers mean nothing")
    C.add_report_only(ap)
    args = ap.parse_args()
    if C.reported_again(args, report):
        return
    phases = C.subset(ap, "--phases", args.phases, ("trivial", "math"))
    if args.quick:
        args.rows, args.repeats, args.math_repeats = 256, 2, 2
    if args.rows % SAMPLES_PER_PROMPT:
        ap.error(f"--rows must be a multiple of {SAMPLES_PER_PROMPT}")
    record = C.Record(args.out, args, "bench/rewards.py")
    record["rows"] = args.rows
    record["loadavg_at_start"] = os.getloadavg()  # the CPUs are shared: other work shows here
    record["packages"] = {}
    for name in ("cloudpickle", "math-verify", "latex2sympy2_extended", "sympy", "numpy"):
        try:
            record["packages"][name] = version(name)
        except PackageNotFoundError:
            record["packages"][name] = None
    record["phases"] = {}
    if "trivial" in phases:
        res = offline_rollouts(trivial_completions(args.rows), ["0"] * args.rows)
        interleave("trivial", trivial_scenarios(res, args.rows // 2), args.repeats, record, seed=0)
    if "math" in phases:
        workers = os.cpu_count() or 1
        completions, answers, made = math_rows(args.rows, seed=0)
        res = offline_rollouts(completions, answers)
        reference = res.add_rewards({"math": math_verify_reward}, mode="inline", progress=False)
        record["math_workers"], record["math_made"] = workers, dict(made)
        record["math_reference"] = dict(Counter(reference.df["reward_math_status"]))
        record["math_reference_values"] = dict(Counter(str(v) for v in reference.df["reward_math"]))
        interleave("math", math_scenarios(res, reference, workers), args.math_repeats, record, seed=1)
    close_pools()
    record["loadavg_at_end"] = os.getloadavg()
    report(record)
    record.save(complete=True)


if __name__ == "__main__":
    main()
