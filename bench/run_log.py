"""What a rollout log costs to open, re-score and keep: `rlgen.RolloutLog` on a 300-step log of 100,800 rows.

Not a test. Builds one log, untimed, in a temporary folder (`--dir`, removed at the end unless
`--keep`): `--steps` steps (default 300), each one part of `--prompts` prompts x `--samples`
samples (default 42 x 8 = 336 rows, so GRPO groups exist), built offline with
`rollouts_from_responses` on SGLang-shaped entries (fixed seed): prompts of 40-150 tokens from a
pool of 2,000; completions of 30-119 tokens of Zipf-drawn words (token ids one per word), 15% cut
at 120 tokens (finish reason "length"), the rest ending "the answer is K" ("stop"); per-token
logprobs; SGLang's meta_info; an `answer` column; scored by `add_rewards` (inline) with
`correct(completion, answer)`, so every part carries add_rewards' columns (`reward`, statuses,
group statistics, `advantage`). Then three phases, the timed ones as one untimed warm-up of every
scenario followed by rounds that run every scenario once in a fresh shuffled order:

Opening the log and drawing the trend (`--repeats` rounds, default 9):

    trend_cold    a NEW `rlgen.RolloutLog(path)` (nothing cached), `log.trend()`, then
                  `log.plot.trend()` rendered to PNG (`fig.savefig` into a BytesIO)
    trend_warm    the same calls on one log object opened before (its columns cached)

Re-scoring the whole log against scoring the same rows in memory, with a cheap function
`cheap(completion, answer)` (`--rescore-repeats` rounds, default 5), for mode M = "process" (the
default; workers warmed by an untimed call before every run) and "inline":

    rescore_M     `log.rescore(cheap, version=<a fresh name each run>, mode=M, progress=False)`:
                  reading every part in full, scoring, writing one version file per part (the
                  log object opened once before the rounds: its parts' footers are known)
    in_memory_M   `res.add_rewards(cheap, mode=M, progress=False)` on the same 100,800 rows loaded
                  once (`log.load()`, untimed) with the logged reward columns dropped, as rescore
                  drops them before scoring

Bytes per row (untimed, sizes only): the parts as written; TRL's own completion log of the same
rows (what TRL 1.16's `log_completions` writes once per logged step: a pandas DataFrame of step,
prompt, completion, one float column per reward function, advantage, through `df.to_parquet` with
pandas' defaults); and each step's part written from the same rows without logprobs. Plus, from
the parts' parquet footers, the compressed bytes of each column (token ids, logprobs, text, ...).

Every run is checked: the trend's per-step rows and mean rewards must be those the build logged,
and its PNG non-empty; every re-score must have scored every part (the warm-up's scores are read
back and compared row for row) and every in-memory score must equal `cheap`'s value row for row.
A wrong run MISSes its target whatever its time.

After the rounds, an untimed breakdown (`--breakdown-repeats` passes, default 2) times the stages
of `trend_cold` (listing, footers, column reads, the trend table, the figure, the PNG) and of a
re-score (reading and concatenating the parts, preparing the rows, scoring, serialising and
writing the version files, with and without fsync) by calling the same internals in the same
order, and one fresh interpreter's import + open + trend + plot.

Scale (`--phases scale`, issue 45; `--scale-repeats` fresh interpreters each, default 5; with `--s3`
the log is also copied to a local S3 server, moto's, started here, and read as `s3://`): each
scenario in a NEW interpreter (imports untimed; `s` is opening the log and the call; `peak_rss_mib`
the process's peak RSS, /proc's VmHWM):

    trend_local / trend_s3            `log.trend()` (from the parts' summaries, one file a part)
    trend_s3_indexed                  the same after `log.write_summaries()` wrote one index of them
    trend_no_summaries_local          the same with the summaries moved away (a log written before
                                      rlgen kept them: every part's five columns are read)
    step_local / step_s3              `log.rows(steps=<the middle step>)`
    step_open_local / step_open_s3    the same in a process that opened the log and read the next step
                                      first (imports, the S3 client's set-up done): the step's read alone

Targets, judged on the 90% bootstrap interval of the median (`_common.bootstrap_median`,
`_common.compare`): PASS only if the whole interval is within the bound, else MISS (with the
numbers: whether the interval straddles the bound or lies wholly beyond it):

    trend_cold median                                           < 2 s
    rescore / in_memory, ratio of medians, each mode            <= 1.2x

    python bench/run_log.py --out run_log.json
    python bench/run_log.py --quick --out /tmp/run_log-quick.json       # a smoke run: numbers mean nothing
    python bench/run_log.py --report-only run_log.json --out /tmp/again.json
"""

from __future__ import annotations

import argparse
import gc
import io
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import _common as C
import numpy as np
from rewards import cpu_between, cpu_mark, warm_pool

import rlgen
from rlgen.rewards._exec import close_pools
from rlgen.rollouts import Rollouts, rollouts_from_responses

TREND = ("trend_cold", "trend_warm")
MODES = ("process", "inline")
RESCORE = tuple(f"{kind}_{mode}" for mode in MODES for kind in ("rescore", "in_memory"))
TREND_BOUND_S = 2.0
UNSUMMED = "(not in the sum) "  # a breakdown's entry measured apart from the stages
RESCORE_BOUND = 1.2
TREND_COLUMNS = ["step", "prompt_index", "completion_tokens", "finish_reason"]  # what log.trend() reads
PROMPT_POOL = 2000
MAX_TOKENS = 120
SEED = 0


# ---------------------------------------------------------------------------------------------
# Reward functions (module level: process mode sends them to workers by reference)


def correct(completion: str, answer: str) -> float:
    """What the run logged: 1.0 when the completion ends with "the answer is <answer>"."""
    return float(completion.endswith(f"the answer is {answer}"))


def cheap(completion: str, answer: str) -> float:
    """The re-score: the logged check, stricter (the answer must come within 600 characters)."""
    return float(len(completion) < 600 and completion.endswith(f"the answer is {answer}"))


# ---------------------------------------------------------------------------------------------
# The log, built offline


def vocabulary() -> list[str]:
    """Common words, the numbers 0-99, then 6,000 made-up words (a token is one word)."""
    common = ["the", "of", "and", "to", "a", "in", "is", "that", "it", "for", "on", "with", "as", "was", "be", "by",
              "this", "are", "or", "at", "from", "an", "which", "have", "not", "but", "we", "can", "number", "so",
              "let", "first", "then", "answer", "sum", "total", "value", "each", "two", "three", "four", "five",
              "six", "seven", "eight", "nine", "ten", "multiply", "divide", "add", "subtract", "equation", "solve",
              "step", "therefore", "because", "since", "check", "result", "if", "x", "y", "both", "sides", "gives",
              "means", "now", "next", "find", "all"]
    rng = random.Random(SEED)
    syllables = ["ka", "ro", "mi", "tel", "an", "ver", "so", "li", "qu", "ent", "ion", "pre", "con", "st", "ar",
                 "ed", "ing", "de", "pa", "ul", "or", "ex", "im", "ty"]
    made = {"".join(rng.choice(syllables) for _ in range(rng.randrange(1, 4))) for _ in range(9000)}
    return list(dict.fromkeys([*common, *map(str, range(100)), *sorted(made)]))[:6200]


@dataclass(frozen=True)
class Step:
    """One step's rows, twice: with logprobs (the logged part) and without (for the sizes)."""

    logged: Rollouts
    without_logprobs: Rollouts


class Builder:
    """Synthetic SGLang entries, `prompts` x `samples` a step, from a fixed seed."""

    def __init__(self, prompts: int, samples: int, pool: int = PROMPT_POOL) -> None:
        self.words = vocabulary()
        self.index = {w: i for i, w in enumerate(self.words)}
        self.prompts, self.samples = prompts, samples
        rng = np.random.default_rng(SEED)
        ranks = np.arange(1, len(self.words) + 1, dtype=float)
        self.cdf = np.cumsum(ranks ** -1.1 / np.sum(ranks ** -1.1))  # Zipf-like word frequencies, as in text
        self.pool: list[tuple[str, list[int], int, float]] = []
        for _ in range(pool):
            ids = self.draw(rng, int(rng.integers(40, 150)))
            # the answer, and how often this prompt's samples get it (easy, hard, in between)
            skill = float(rng.choice([0.0, 0.15, 0.5, 0.85, 1.0]))
            self.pool.append((" ".join(self.words[i] for i in ids) + "?", [1000 + int(i) for i in ids],
                              int(rng.integers(0, 100)), skill))

    def draw(self, rng: np.random.Generator, size: int) -> np.ndarray:
        """`size` word indices, Zipf-distributed."""
        return np.minimum(np.searchsorted(self.cdf, rng.random(size)), len(self.words) - 1)

    def entries(self, step: int, *, logprobs: bool) -> tuple[list[dict[str, Any]], list[int]]:
        """The step's SGLang entries (prompt-major) and its prompts' indices in the pool."""
        rng = np.random.default_rng([SEED, step])
        picked = [int(i) for i in rng.choice(len(self.pool), size=self.prompts, replace=False)]
        tail = [self.index[w] for w in ("so", "the", "answer", "is")]
        out = []
        for p in picked:
            _, prompt_ids, answer, skill = self.pool[p]
            for _ in range(self.samples):
                cut = rng.random() < 0.15
                length = MAX_TOKENS if cut else int(rng.integers(30, MAX_TOKENS))
                words = self.draw(rng, length).tolist()
                if not cut:
                    said = answer if rng.random() < skill else int(rng.integers(0, 100))
                    words[-5:] = [*tail, self.index[str(said)]]
                ids = [1000 + w for w in words]
                meta: dict[str, Any] = {
                    "id": f"{int(rng.integers(0, 2**62)):032x}",
                    "finish_reason": {"type": "length", "length": MAX_TOKENS} if cut else {"type": "stop", "matched": 2},
                    "prompt_tokens": len(prompt_ids), "completion_tokens": length,
                    "cached_tokens": int(rng.choice([0, len(prompt_ids)])), "e2e_latency": float(rng.uniform(1, 6))}
                if logprobs:
                    lps = (-rng.exponential(0.6, size=length)).tolist()
                    meta["output_token_logprobs"] = [[lp, i, None] for lp, i in zip(lps, ids)]
                out.append({"text": " ".join(self.words[w] for w in words), "output_ids": ids, "meta_info": meta})
        return out, picked

    def rollouts(self, entries: list[dict[str, Any]], picked: list[int]) -> Rollouts:
        return rollouts_from_responses(
            entries, prompt_ids=[self.pool[p][1] for p in picked], prompt_texts=[self.pool[p][0] for p in picked],
            n=self.samples, pad_token_id=0, model="synthetic/bench-run-log",
            sampling={"temperature": 1.0, "max_new_tokens": MAX_TOKENS},
            extra={"answer": [str(self.pool[p][2]) for p in picked for _ in range(self.samples)]})

    def step(self, step: int) -> Step:
        entries, picked = self.entries(step, logprobs=True)
        logged = self.rollouts(entries, picked).add_rewards(correct, mode="inline", progress=False)
        bare = [{**e, "meta_info": {k: v for k, v in e["meta_info"].items() if k != "output_token_logprobs"}}
                for e in entries]
        plain = self.rollouts(bare, picked)
        written = [c for c in logged.df.columns if c not in plain.df.columns]
        return Step(logged, plain.with_columns({c: logged.df[c].to_numpy() for c in written}))


def trl_frame(res: Rollouts, step: int) -> Any:
    """What TRL 1.16's `log_completions` writes for these rows: step, prompt, completion, one float
    column per reward function (here `correct`), advantage."""
    import pandas as pd

    df = res.df
    return pd.DataFrame({"step": [step] * len(df), "prompt": df["prompt"].tolist(),
                         "completion": df["completion"].tolist(), "correct": df["reward_correct"].tolist(),
                         "advantage": df["advantage"].tolist()})


def build(root: Path, steps: int, prompts: int, samples: int, pool: int = PROMPT_POOL) -> dict[str, Any]:
    """The log at root/log, TRL's files at root/trl; sizes and what the build logged, per step."""
    from rlgen.rollout_log._parts import part_bytes

    t0 = time.perf_counter()
    builder = Builder(prompts, samples, pool)
    log = rlgen.RolloutLog.create(root / "log")
    (root / "trl").mkdir()
    without_lp, trl, means, rows = [], [], [], []
    finish: Counter[str] = Counter()
    tokens: list[int] = []
    for step in range(steps):
        made = builder.step(step)
        log.append(step, made.logged)
        without_lp.append(len(part_bytes(made.without_logprobs, step)))
        path = root / "trl" / f"completions_{step:05d}.parquet"
        trl_frame(made.logged, step).to_parquet(path)  # pandas' defaults, as TRL calls it
        trl.append(path.stat().st_size)
        df = made.logged.df
        means.append(float(df["reward"].mean()))
        rows.append(len(df))
        finish.update(df["finish_reason"])
        tokens.extend(df["completion_tokens"].tolist())
        if step % 50 == 49:
            C.log(f"built {step + 1}/{steps} steps ({time.perf_counter() - t0:.0f} s)")
    parts = sorted((root / "log" / "parts").iterdir())
    return {"path": str(root / "log"), "steps": steps, "prompts": prompts, "samples": samples, "rows": sum(rows),
            "rows_per_step": rows, "parts": len(parts), "build_s": time.perf_counter() - t0,
            "reward_mean_per_step": means, "finish_reasons": dict(finish),
            "completion_tokens": {"mean": statistics.mean(tokens), "min": min(tokens), "max": max(tokens)},
            "bytes": {"parts": [p.stat().st_size for p in parts], "parts_without_logprobs": without_lp,
                      "trl": trl}}


# ---------------------------------------------------------------------------------------------
# Scenarios


@dataclass(frozen=True)
class Scenario:
    """`prepare` (untimed), the timed `run`, then `check` of what it returned: (statuses, None if
    right else what was wrong)."""

    prepare: Callable[[], None]
    run: Callable[[], Any]
    check: Callable[[Any], tuple[dict[str, Any], str | None]]


def _nothing() -> None:
    pass


def draw_trend(log: rlgen.RolloutLog) -> tuple[Any, int]:
    """`log.trend()`, then `log.plot.trend()` rendered to PNG: the table and the PNG's size."""
    table = log.trend()
    fig = log.plot.trend()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    return table, len(buffer.getvalue())


def trend_scenarios(path: str, built: dict[str, Any]) -> dict[str, Scenario]:
    kept = rlgen.RolloutLog(path)  # trend_warm's object: its columns cached by the warm-up

    def check(out: tuple[Any, int]) -> tuple[dict[str, Any], str | None]:
        table, png = out
        rows, means = built["rows_per_step"], built["reward_mean_per_step"]
        wrong = []
        if table.index.tolist() != list(range(built["steps"])):
            wrong.append(f"steps {table.index.tolist()[:5]}...")
        elif table["rows"].tolist() != rows:
            wrong.append("rows per step differ from the build's")
        elif not np.allclose(table["reward"].to_numpy(dtype=float), means, rtol=0, atol=1e-9):
            wrong.append("mean rewards per step differ from the build's")
        if png < 10_000:
            wrong.append(f"a PNG of {png} bytes")
        return {"steps": len(table), "png_bytes": png}, "; ".join(wrong) or None

    return {"trend_cold": Scenario(_nothing, lambda: draw_trend(rlgen.RolloutLog(path)), check),
            "trend_warm": Scenario(_nothing, lambda: draw_trend(kept), check)}


def loaded_without_rewards(log: rlgen.RolloutLog) -> Rollouts:
    """Every row of the log as one result, without the logged reward columns (as rescore drops them)."""
    from rlgen.rollout_log._versions import logged_columns

    res = log.load()
    res.df = res.df.drop(columns=logged_columns(list(res.df.columns)))
    return res


def rescore_scenarios(path: str, base: Rollouts) -> tuple[dict[str, Scenario], rlgen.RolloutLog]:
    from rlgen.rollout_log._versions import scored_parts

    log = rlgen.RolloutLog(path)
    parts = {p.file for p in log._parts()}
    expected = [cheap(c, a) for c, a in zip(base.df["completion"].tolist(), base.df["answer"].tolist())]
    made = iter(range(10**6))
    checked: set[str] = set()

    def warm() -> None:
        warm_pool(cheap, ("w", "1"))

    def rescored(mode: str) -> Callable[[], str]:
        return lambda: log.rescore(cheap, version=f"cheap_{mode}_{next(made)}", mode=mode, progress=False)

    def check_version(name: str) -> tuple[dict[str, Any], str | None]:
        scored = scored_parts(log._store, name)
        statuses: dict[str, Any] = {"version": name, "parts": len(scored)}
        if scored != parts:
            return statuses, f"{len(scored)} of {len(parts)} parts scored"
        mode = name.split("_")[1]
        if mode not in checked:  # each mode's first run (its warm-up): read the scores back, row for row
            checked.add(mode)
            got = log.rewards(name)
            statuses.update(Counter(got["reward_cheap_status"]))
            if got["reward"].tolist() != expected:
                return statuses, "the version's rewards differ from cheap's values"
        return statuses, None

    def in_memory(mode: str) -> Callable[[], Rollouts]:
        return lambda: base.add_rewards(cheap, mode=mode, progress=False)

    def check_rows(out: Rollouts) -> tuple[dict[str, Any], str | None]:
        status = Counter(out.df["reward_cheap_status"])
        wrong = out.df["reward"].tolist() != expected
        return dict(status), "rewards differ from cheap's values" if wrong else None

    scenarios: dict[str, Scenario] = {}
    for mode in MODES:
        prepare = warm if mode == "process" else _nothing
        scenarios[f"rescore_{mode}"] = Scenario(prepare, rescored(mode), check_version)
        scenarios[f"in_memory_{mode}"] = Scenario(prepare, in_memory(mode), check_rows)
    return scenarios, log


def timed(scenario: Scenario) -> dict[str, Any]:
    scenario.prepare()
    gc.collect()
    before = cpu_mark()
    t0 = time.perf_counter()
    out = scenario.run()
    seconds = time.perf_counter() - t0
    after = cpu_mark()
    statuses, wrong = scenario.check(out)
    return {"seconds": seconds, "statuses": statuses, "wrong": wrong, **cpu_between(before, after)}


def interleave(phase: str, scenarios: dict[str, Scenario], repeats: int, record: C.Record, *, seed: int) -> None:
    """One untimed warm-up of each scenario, then `repeats` rounds of all of them in a fresh shuffled
    order; every run into record["phases"][phase][name]["runs"], saved as it ends."""
    out: dict[str, dict[str, Any]] = {name: {"warmup": None, "runs": []} for name in scenarios}
    record["phases"][phase] = out
    for name, scenario in scenarios.items():
        out[name]["warmup"] = run = timed(scenario)
        C.log(f"{phase} warm-up {name:18s} {run['seconds']:7.3f} s" + (f" WRONG: {run['wrong']}" if run["wrong"] else ""))
    record.save()
    order_rng = random.Random(seed)
    for r in range(repeats):
        order = list(scenarios)
        order_rng.shuffle(order)  # a fresh shuffle each round: no scenario always follows the same one
        for position, name in enumerate(order):
            run = timed(scenarios[name])
            run.update(repeat=r, after=order[position - 1] if position else None, loadavg=os.getloadavg())
            out[name]["runs"].append(run)
            C.log(f"{phase} {r + 1}/{repeats} {name:18s} {run['seconds']:7.3f} s, ours {C.fmt(run['ours_cpu_s'], '.2f')} "
                  f"CPU s, others {C.fmt(run['others_cores'], '.2f')} cores"
                  + (f" WRONG: {run['wrong']}" if run["wrong"] else ""))
            record.save()


# ---------------------------------------------------------------------------------------------
# Breakdowns (untimed as targets: the stages of one scenario, by the same internals in the same order)


class Stages:
    """Seconds per named stage of one pass, in order."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._t = time.perf_counter()

    def mark(self, name: str) -> None:
        now = time.perf_counter()
        self.seconds[name] = self.seconds.get(name, 0.0) + now - self._t
        self._t = now


def trend_stages(path: str) -> dict[str, float]:
    """trend_cold, stage by stage: what `RolloutLog(path)`, `trend()` and `plot.trend()` do, in order."""
    from rlgen.rollout_log._parts import read_light
    from rlgen.rollout_log._views import trend_table

    gc.collect()
    s = Stages()
    log = rlgen.RolloutLog(path)
    s.mark("open (log.json)")
    parts = log._parts()
    s.mark("list parts")
    cache, store = log._cache, log._store
    with ThreadPoolExecutor(max_workers=8) as pool:  # read_light's pool, footers first
        list(pool.map(lambda p: cache.footer(store, p.file), parts))
    s.mark("read footers")
    rows = read_light(store, cache, parts, TREND_COLUMNS)
    s.mark("read 4 light columns -> DataFrame")
    scores = log.rows(columns=["reward"])
    s.mark("list again + read reward column")
    trend_table(rows, scores["reward"].to_numpy(dtype=float), threshold=1.0)
    s.mark("trend table")
    fig = log.plot.trend()
    s.mark("plot.trend(): its own trend() (columns cached), figure, panels")
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    s.mark("plot: render PNG")
    seconds = s.seconds
    t0 = time.perf_counter()
    log.trend()
    seconds[f"{UNSUMMED}a trend() with cached columns, as plot.trend() calls it"] = time.perf_counter() - t0
    return seconds


def rescore_stages(path: str, mode: str, version: str) -> dict[str, float]:
    """A re-score, stage by stage, as `_rescore.rescore` runs it (chunks of whole parts: read them,
    concatenate, drop the logged columns and batch the rows, score, then each part's version file:
    its parquet bytes, then the store's write: temporary file, fsync, link)."""
    import pandas as pd

    from rlgen.core._options import RescoreOptions, resolve
    from rlgen.rewards._scoring import named_functions, rewards_columns, status_totals
    from rlgen.rollout_log._parts import read_full
    from rlgen.rollout_log._rescore import _chunks
    from rlgen.rollout_log._versions import REWARDS, claim_version, lineage_of, logged_columns
    from rlgen.rollouts._groups import group_keys, row_batch

    log = rlgen.RolloutLog(path)
    store = log._store
    log._parts()
    for p in log._parts():
        log._cache.num_rows(store, p.file)  # footers known, as in the timed runs
    gc.collect()
    s = Stages()
    parts = log._parts()
    opts = resolve(RescoreOptions, {"version": version, "mode": mode, "progress": False})
    named = named_functions(cheap)
    claim_version(store, version, lineage_of(named, opts))
    s.mark("list parts, claim the version")
    options = {k: v for k, v in opts.items() if k not in ("version", "steps", "repeats")}
    for chunk in _chunks(parts, lambda p: log._cache.num_rows(store, p.file)):
        results = read_full(store, chunk, Rollouts)
        s.mark("read parts in full (from_parquet)")
        res = results[0] if len(results) == 1 else Rollouts.concat(results)
        s.mark("concat the chunk's parts")
        df = res.df
        fresh = df.drop(columns=logged_columns(list(df.columns)))
        rows = row_batch(fresh, completion_ids=res.id_lists("response"), prompt_ids=res.id_lists("prompt"),
                         data_columns=[c for c in res.data_columns if c in fresh.columns])
        groups = group_keys(df)
        s.mark("drop logged columns, batch the rows")
        cols, _ = rewards_columns(rows, groups, cheap, options)
        s.mark("score (rewards_columns)")
        columns: dict[str, list[Any]] = {}
        for k, v in cols.items():  # as _rescore._score and rescore() keep them
            columns.setdefault(k, []).extend(list(v))
        statuses = {k: list(v) for k, v in columns.items() if k.endswith("_status")}
        repeat = [0] * len(res)
        s.mark("columns to lists, statuses")
        total, start = len(res), 0
        for part, result in zip(chunk, results):  # as _rescore._write and _versions.write_scores
            size = len(result)
            picks = [r * total + start + i for r in range(len(repeat) // max(total, 1)) for i in range(size)]
            picked = {k: [v[j] for j in picks] for k, v in columns.items()}
            frame = pd.DataFrame({"repeat": [repeat[j] for j in picks], **{k: list(v) for k, v in picked.items()}})
            buffer = io.BytesIO()
            frame.to_parquet(buffer, index=False)
            data = buffer.getvalue()
            s.mark("version files: each part's rows -> DataFrame -> parquet bytes")
            store.write_new(data, REWARDS, version, part.file)
            s.mark("version files: store.write_new (tmp, fsync, link)")
            start += size
    status_totals(statuses)
    s.mark("columns to lists, statuses")
    return s.seconds


def in_memory_stages(base: Rollouts, mode: str) -> dict[str, float]:
    """add_rewards, stage by stage: batch the rows, score, add the columns."""
    from rlgen.core._options import RewardOptions, resolve
    from rlgen.rewards._scoring import rewards_columns
    from rlgen.rollouts._groups import group_keys, row_batch

    gc.collect()
    s = Stages()
    opts = resolve(RewardOptions, {"mode": mode, "progress": False})
    rows = row_batch(base.df, completion_ids=base.id_lists("response"), prompt_ids=base.id_lists("prompt"),
                     data_columns=base.data_columns)
    groups = group_keys(base.df)
    s.mark("batch the rows")
    cols, _ = rewards_columns(rows, groups, cheap, opts)
    s.mark("score (rewards_columns)")
    base.with_columns(cols)
    s.mark("add the columns")
    return s.seconds


def fsync_cost(root: Path, sizes: Sequence[int]) -> dict[str, float]:
    """Writing files of these sizes (the version files') with and without fsync, nothing else."""
    out = {}
    for label, sync in (("with fsync", True), ("without fsync", False)):
        folder = root / f"fsync-{label.replace(' ', '-')}-{time.monotonic_ns()}"
        folder.mkdir()
        t0 = time.perf_counter()
        for i, size in enumerate(sizes):
            with open(folder / f"f{i}", "wb") as f:
                f.write(b"\0" * size)
                if sync:
                    f.flush()
                    os.fsync(f.fileno())
        out[label] = time.perf_counter() - t0
        shutil.rmtree(folder)
    return out


FRESH_PROCESS = r"""
import io, json, sys, time
t0 = time.perf_counter()
import rlgen
t1 = time.perf_counter()
log = rlgen.RolloutLog(sys.argv[1])
table = log.trend()
t2 = time.perf_counter()
fig = log.plot.trend()
buffer = io.BytesIO()
fig.savefig(buffer, format="png")
t3 = time.perf_counter()
print(json.dumps({"import rlgen": t1 - t0, "open + trend()": t2 - t1, "plot.trend() + PNG (imports matplotlib)": t3 - t2,
                  "total": t3 - t0}))
"""


def fresh_process(path: str) -> dict[str, float] | str:
    """A fresh interpreter: import rlgen, open the log, trend(), plot.trend() to PNG (the whole of a
    notebook's first look, imports included)."""
    env = {**os.environ, "PYTHONPATH": str(C.REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""), "MPLBACKEND": "Agg"}
    done = subprocess.run([sys.executable, "-c", FRESH_PROCESS, path], capture_output=True, text=True, timeout=300,
                          env=env, check=False)
    if done.returncode != 0:
        return f"failed: {done.stderr[-500:]}"
    loaded: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return loaded


SCALE_PROCESS = r"""
import json, sys, time
import rlgen
url, what, opts = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
t0 = time.perf_counter()
log = rlgen.RolloutLog(url, storage_options=opts or None)
if what == "trend":
    n = int(log.trend()["rows"].sum())
elif what.startswith("open:"):  # the log open and another step read first (imports, the S3 client): one step alone
    log.rows(steps=int(what[5:]) + 1)
    t0 = time.perf_counter()
    n = len(log.rows(steps=int(what[5:])))
else:
    n = len(log.rows(steps=int(what)))
s = time.perf_counter() - t0
# VmHWM: this process image's peak (ru_maxrss would carry the forking bench's RSS across exec on Linux)
peak = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM:")) / 1024
print(json.dumps({"s": s, "rows": n, "peak_rss_mib": peak}))
"""


def scale_run(url: str, what: str, options: dict[str, Any] | None) -> dict[str, Any]:
    """One fresh interpreter's open + `trend()` or one step's `rows()` (see SCALE_PROCESS)."""
    env = {**os.environ, "PYTHONPATH": str(C.REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    done = subprocess.run([sys.executable, "-c", SCALE_PROCESS, url, what, json.dumps(options or {})],
                          capture_output=True, text=True, timeout=600, env=env, check=False)
    if done.returncode != 0:
        return {"error": done.stderr[-800:]}
    loaded: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return loaded


def moto_log(path: str) -> tuple[str, dict[str, Any], subprocess.Popen[bytes]]:
    """The log at `path` copied to a moto S3 server started here: (its URL, storage options, the server)."""
    import socket
    import urllib.request

    import boto3
    import fsspec

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {**os.environ, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}
    server = subprocess.Popen([sys.executable, "-m", "moto.server", "-p", str(port)], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    endpoint = f"http://127.0.0.1:{port}"
    for _ in range(300):
        try:
            urllib.request.urlopen(endpoint + "/moto-api/", timeout=2).close()
            break
        except OSError:
            time.sleep(0.2)
    boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="testing",
                 aws_secret_access_key="testing").create_bucket(Bucket="runs")
    options = {"key": "testing", "secret": "testing", "client_kwargs": {"endpoint_url": endpoint, "region_name": "us-east-1"}}
    fs = fsspec.filesystem("s3", **options)
    t0 = time.perf_counter()
    files = [f for f in Path(path).rglob("*") if f.is_file()]
    fs.put([str(f) for f in files], [f"runs/log/{f.relative_to(path).as_posix()}" for f in files])
    C.log(f"copied {len(files)} files to moto in {time.perf_counter() - t0:.0f} s")
    return "s3://runs/log", options, server


def scale(record: C.Record, path: str, repeats: int, *, s3: bool) -> None:
    """The scale phase (module docstring): every scenario `repeats` times in fresh interpreters, in turn."""
    step = str(record["log"]["steps"] // 2)
    out: dict[str, Any] = {}
    record["scale"] = out
    hidden = Path(path) / "summaries"
    for k in range(repeats):
        for name, what in (("trend_local", "trend"), ("step_local", step), ("step_open_local", f"open:{step}")):
            out.setdefault(name, []).append(scale_run(path, what, None))
        hidden.rename(hidden.with_name("summaries-away"))
        try:
            out.setdefault("trend_no_summaries_local", []).append(scale_run(path, "trend", None))
        finally:
            hidden.with_name("summaries-away").rename(hidden)
        C.log(f"scale round {k + 1}: " + ", ".join(f"{n} {v[-1].get('s', 'failed')}" for n, v in out.items()))
        record.save()
    if not s3:
        return
    url, options, server = moto_log(path)
    try:
        for k in range(repeats):
            for name, what in (("trend_s3", "trend"), ("step_s3", step), ("step_open_s3", f"open:{step}")):
                out.setdefault(name, []).append(scale_run(url, what, options))
            C.log(f"scale s3 round {k + 1}: trend {out['trend_s3'][-1].get('s')}, step {out['step_s3'][-1].get('s')}")
            record.save()
        t0 = time.perf_counter()
        rlgen.RolloutLog(url, storage_options=options).write_summaries()  # one index of every part's summary
        out["write_index_s3_s"] = time.perf_counter() - t0
        for k in range(repeats):
            out.setdefault("trend_s3_indexed", []).append(scale_run(url, "trend", options))
            C.log(f"scale s3 indexed round {k + 1}: trend {out['trend_s3_indexed'][-1].get('s')}")
            record.save()
    finally:
        server.terminate()
        server.wait(30)


def breakdown(record: C.Record, path: str, base: Rollouts | None, repeats: int, root: Path, phases: list[str], *,
              fresh: bool = True) -> None:
    out: dict[str, Any] = {}
    record["breakdown"] = out
    if "trend" in phases:
        out["trend_cold"] = [trend_stages(path) for _ in range(repeats)]
        C.log(f"breakdown trend_cold: {_medians(out['trend_cold'])}")
        out["fresh_process"] = [fresh_process(path) for _ in range(min(repeats, 2) if fresh else 0)]
        C.log(f"breakdown fresh process: {out['fresh_process']}")
        record.save()
    if "rescore" in phases and base is not None:
        made = iter(range(10**6))
        for mode in MODES:
            if mode == "process":
                warm_pool(cheap, ("w", "1"))
            out[f"rescore_{mode}"] = [rescore_stages(path, mode, f"stages_{mode}_{next(made)}") for _ in range(repeats)]
            C.log(f"breakdown rescore_{mode}: {_medians(out[f'rescore_{mode}'])}")
            if mode == "process":
                warm_pool(cheap, ("w", "1"))
            out[f"in_memory_{mode}"] = [in_memory_stages(base, mode) for _ in range(repeats)]
            C.log(f"breakdown in_memory_{mode}: {_medians(out[f'in_memory_{mode}'])}")
            record.save()
        sizes = [f.stat().st_size for f in sorted((Path(path) / "rewards").glob("stages_inline_*/step-*.parquet"))]
        sizes = sizes[: record["log"]["parts"]]
        out["version_files"] = {"files": len(sizes), "bytes": sum(sizes),
                                "writes": [fsync_cost(root, sizes) for _ in range(repeats)]}
        C.log(f"breakdown: {len(sizes)} version files of {sum(sizes):,} bytes: "
              f"{_medians(out['version_files']['writes'])}")
        record.save()


def _medians(passes: Sequence[dict[str, float] | str]) -> dict[str, float]:
    kept = [p for p in passes if isinstance(p, dict)]
    names = list(dict.fromkeys(k for p in kept for k in p))
    return {k: round(statistics.median(p[k] for p in kept if k in p), 4) for k in names}


# ---------------------------------------------------------------------------------------------
# Sizes


def column_bytes(path: str) -> dict[str, int]:
    """Compressed bytes per column over every part (parquet footers), and the footers themselves."""
    import pyarrow.parquet as pq

    sizes: Counter[str] = Counter()
    for file in sorted((Path(path) / "parts").glob("*.parquet")):
        meta = pq.read_metadata(file)
        sizes["(footer)"] += meta.serialized_size
        for g in range(meta.num_row_groups):
            group = meta.row_group(g)
            for c in range(meta.num_columns):
                column = group.column(c)
                sizes[column.path_in_schema.split(".")[0]] += column.total_compressed_size
    return dict(sizes.most_common())


def rewritten_bytes(path: str, every: int) -> dict[str, Any]:
    """Every `every`-th part rewritten with other pyarrow writer settings (the same table, metadata
    included): what the parts would weigh, per row; not what rlgen writes (it uses pyarrow's defaults)."""
    import pyarrow.parquet as pq

    options: dict[str, dict[str, Any]] = {
        "as written (pyarrow defaults: snappy, dictionary everywhere)": {},
        "no dictionary for the logprobs": {"use_dictionary": "ALL_BUT_LOGPROBS"},
        "no dictionary for the logprobs, zstd": {"use_dictionary": "ALL_BUT_LOGPROBS", "compression": "zstd"},
        "logprobs byte_stream_split, zstd": {"use_dictionary": "ALL_BUT_LOGPROBS", "compression": "zstd",
                                             "column_encoding": {"_rlgen_logprobs.list.element": "BYTE_STREAM_SPLIT"}},
    }
    files = sorted((Path(path) / "parts").glob("*.parquet"))[::every]
    totals: Counter[str] = Counter()
    rows = 0
    for file in files:
        table = pq.read_table(file)
        rows += table.num_rows
        for label, kwargs in options.items():
            kwargs = dict(kwargs)
            if kwargs.get("use_dictionary") == "ALL_BUT_LOGPROBS":
                kwargs["use_dictionary"] = [c for c in table.column_names if c != "_rlgen_logprobs"]
            buffer = io.BytesIO()
            pq.write_table(table, buffer, **kwargs)
            totals[label] += len(buffer.getvalue())
    return {"parts": len(files), "rows": rows, "per_row": {k: v / rows for k, v in totals.items()} if rows else {}}


def sizes(record: C.Record) -> None:
    built = record["log"]
    rows = built["rows"]
    b = built["bytes"]
    parts, plain, trl = sum(b["parts"]), sum(b["parts_without_logprobs"]), sum(b["trl"])
    columns = column_bytes(built["path"])
    record["sizes"] = {
        "rows": rows, "parts_bytes": parts, "parts_without_logprobs_bytes": plain, "trl_bytes": trl,
        "per_row": {"parts": parts / rows, "parts_without_logprobs": plain / rows, "trl": trl / rows},
        "columns_bytes": columns, "columns_per_row": {k: v / rows for k, v in columns.items()},
        "tokens": int(record["log"]["completion_tokens"]["mean"] * rows),
        "rewritten": rewritten_bytes(built["path"], max(1, built["parts"] // 30)),
    }


# ---------------------------------------------------------------------------------------------
# Report


def judge(name: str, value: float | None, interval: Sequence[float] | None, bound: float, *, op: str, unit: str,
          wrong: str | None, rows: list[dict[str, Any]]) -> None:
    """PASS only where the whole 90% interval is within the bound (op "<": below it; "<=": at or
    below); else MISS, saying whether the interval straddles the bound or lies beyond it."""
    within = (lambda v: v < bound) if op == "<" else (lambda v: v <= bound)
    if value is None or interval is None:
        ok, word, how = None, "n/a", "not measured, or too few runs for an interval"
    else:
        lo, hi = interval
        ok = within(hi)
        word = "PASS" if ok else "MISS"
        how = "whole interval within" if ok else ("interval straddles the bound" if within(lo) else "whole interval beyond")
    if wrong is not None:
        ok, word, how = False, "MISS", f"wrong: {wrong}"
    rows.append({"target": name, "value": value, "interval": list(interval) if interval else None, "op": op,
                 "bound": bound, "unit": unit, "ok": ok, "verdict": word, "how": how, "wrong": wrong})
    sep = "" if unit == "x" else " "
    shown = "not measured" if value is None else f"{value:.3f}{sep}{unit}"
    if interval:
        shown += f" [90% interval {interval[0]:.3f}-{interval[1]:.3f}]"
    print(f"  {word:4s}  {name}: {shown} (target {op} {bound:g}{sep}{unit}; {how})", flush=True)


def _interval(values: Sequence[float]) -> str:
    found = C.bootstrap_median(values)
    return f"{found[0]:.3f}-{found[1]:.3f}" if found else "-"


def _wrong(per: dict[str, Any], names: Sequence[str]) -> str | None:
    bad = [f"{name} {'warm-up' if r is per[name]['warmup'] else 'repeat ' + str(r.get('repeat', 0) + 1)}: {r['wrong']}"
           for name in names for r in [per[name]["warmup"], *per[name]["runs"]] if r and r["wrong"]]
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
                     C.fmt(C.median_or_none([r["others_cores"] for r in runs]), ".2f")])
    C.print_table(title, ["scenario", "runs", "wrong", "median s", "90% interval", "min s", "max s", "our CPU s",
                          "others' cores"], rows)


def stages_table(title: str, passes: Sequence[dict[str, float] | str]) -> None:
    medians = _medians(passes)
    total = sum(v for k, v in medians.items() if not k.startswith(UNSUMMED))
    rows = [[k, f"{v:.3f}", f"{100 * v / total:.0f}%" if total and not k.startswith(UNSUMMED) else ""]
            for k, v in medians.items()]
    rows.append(["(sum)", f"{total:.3f}", ""])
    C.print_table(f"{title} ({len([p for p in passes if isinstance(p, dict)])} passes, medians)",
                  ["stage", "seconds", "share"], rows)


def report(record: C.Record) -> None:
    built = record["log"]
    print(f"\nlog: {built['steps']} steps, {built['parts']} parts, {built['rows']:,} rows "
          f"({built['prompts']} prompts x {built['samples']} samples a step), completion tokens mean "
          f"{built['completion_tokens']['mean']:.1f} ({built['completion_tokens']['min']}-"
          f"{built['completion_tokens']['max']}), finish reasons {built['finish_reasons']}; built in "
          f"{built['build_s']:.1f} s", flush=True)
    phases: dict[str, Any] = record["phases"]
    targets: list[dict[str, Any]] = []
    comparisons: dict[str, Any] = {}
    trend = phases.get("trend")
    if trend:
        scenario_table("Opening the log and drawing the trend: seconds per run", trend)
    rescore = phases.get("rescore")
    if rescore:
        scenario_table(f"Re-scoring {built['rows']:,} rows with cheap(completion, answer): seconds per call", rescore)
    print("\nTargets", flush=True)
    if trend:
        seconds = [r["seconds"] for r in trend["trend_cold"]["runs"]]
        judge(f"trend_cold: new RolloutLog + trend() + plot.trend() to PNG, {built['rows']:,} rows in "
              f"{built['parts']} parts ({len(seconds)} runs)", C.median_or_none(seconds), C.bootstrap_median(seconds),
              TREND_BOUND_S, op="<", unit="s", wrong=_wrong(trend, ["trend_cold"]), rows=targets)
    if rescore:
        for mode in MODES:
            ours, theirs = f"rescore_{mode}", f"in_memory_{mode}"
            if ours not in rescore or theirs not in rescore:
                continue
            c = comparisons[f"{ours} / {theirs}"] = C.compare(rescore, ours, [theirs], key="seconds")
            judge(f"rescore / in_memory, mode={mode!r} ({c['runs'][0]} vs {c['runs'][1]} runs, p = {C.fmt(c['p'], '.3f')})",
                  c["ratio"], c["interval"], RESCORE_BOUND, op="<=", unit="x", wrong=_wrong(rescore, [ours, theirs]),
                  rows=targets)
            d = comparisons[f"{ours} - {theirs}"] = C.compare_difference(rescore, ours, [theirs])
            shown = C.fmt(d["difference"], ".3f")
            if d["interval"]:
                shown += f" [{d['interval'][0]:.3f}-{d['interval'][1]:.3f}]"
            print(f"        (the same as seconds: rescore_{mode} - in_memory_{mode} = {shown} s)", flush=True)
    if trend:
        d = comparisons["trend_cold - trend_warm"] = C.compare_difference(trend, "trend_cold", ["trend_warm"])
        shown = C.fmt(d["difference"], ".3f") + (f" [{d['interval'][0]:.3f}-{d['interval'][1]:.3f}]" if d["interval"] else "")
        print(f"\nNot a target: what a cold log object adds (trend_cold - trend_warm): {shown} s", flush=True)
    parts = record.data.get("breakdown") or {}
    if parts.get("trend_cold"):
        stages_table("Where trend_cold's time goes", parts["trend_cold"])
    fresh = [p for p in parts.get("fresh_process") or [] if isinstance(p, dict)]
    if fresh:
        print("  a fresh interpreter (imports included): " + ", ".join(f"{k} {v:.2f} s" for k, v in _medians(fresh).items()),
              flush=True)
    for mode in MODES:
        if parts.get(f"rescore_{mode}"):
            stages_table(f"Where rescore (mode={mode!r}) time goes", parts[f"rescore_{mode}"])
        if parts.get(f"in_memory_{mode}"):
            stages_table(f"Where add_rewards (mode={mode!r}) time goes", parts[f"in_memory_{mode}"])
    files = parts.get("version_files")
    if files:
        m = _medians(files["writes"])
        print(f"\n{files['files']} version files ({files['bytes']:,} bytes) written bare: "
              + ", ".join(f"{k} {v:.3f} s" for k, v in m.items()), flush=True)
    found = record.data.get("sizes")
    if found:
        per = found["per_row"]
        rows = [["log parts, as written (ids + logprobs)", f"{found['parts_bytes']:,}", f"{per['parts']:.0f}",
                 f"{per['parts'] / per['trl']:.2f}x"],
                ["log parts without logprobs (ids kept)", f"{found['parts_without_logprobs_bytes']:,}",
                 f"{per['parts_without_logprobs']:.0f}", f"{per['parts_without_logprobs'] / per['trl']:.2f}x"],
                ["TRL's completion parquet (text, rewards, advantage)", f"{found['trl_bytes']:,}", f"{per['trl']:.0f}",
                 "1.00x"]]
        C.print_table(f"Bytes per row, {found['rows']:,} rows in {built['parts']} files each",
                      ["files", "bytes", "bytes/row", "/ TRL"], rows)
        print(f"  logprobs cost {per['parts'] - per['parts_without_logprobs']:.0f} bytes/row "
              f"({per['parts'] / per['parts_without_logprobs']:.2f}x the part without them)", flush=True)
        tokens = found["tokens"] / found["rows"]
        cols = found["columns_per_row"]
        print(f"  per completion token ({tokens:.1f} a row): logprobs {cols.get('_rlgen_logprobs', 0) / tokens:.2f} bytes, "
              f"completion ids {cols.get('_rlgen_response_ids', 0) / tokens:.2f} bytes, completion text "
              f"{cols.get('completion', 0) / tokens:.2f} bytes", flush=True)
        again = found.get("rewritten") or {}
        if again.get("per_row"):
            print(f"  the same tables rewritten with other writer settings ({again['parts']} parts, not what rlgen "
                  "writes): " + "; ".join(f"{k} {v:.0f}" for k, v in again["per_row"].items()) + " bytes/row", flush=True)
        top = list(found["columns_per_row"].items())[:12]
        print("  compressed bytes/row by column (parts' footers): "
              + ", ".join(f"{k} {v:.0f}" for k, v in top), flush=True)
    scale_report(record)
    record["targets"] = targets
    record["comparisons"] = comparisons
    print(f"load average at start {record['loadavg_at_start']}, at end {record.data.get('loadavg_at_end')}", flush=True)


def scale_report(record: C.Record) -> None:
    """The scale phase's table: per scenario the runs, their median and 90% interval, peak RSS;
    every run is checked to have read every row (trend) or one step's rows."""
    found = record.data.get("scale")
    if not found:
        return
    built = record["log"]
    mid = built["rows_per_step"][built["steps"] // 2]
    expected = {"trend": built["rows"], "step": mid}
    rows = []
    for name, runs in found.items():
        if not isinstance(runs, list):
            continue
        ok = [r for r in runs if "s" in r and r["rows"] == expected[name.split("_")[0]]]
        seconds = [r["s"] for r in ok]
        median = C.median_or_none(seconds)
        rows.append([name, f"{len(ok)}/{len(runs)}", C.fmt(median, ".3f"), _interval(seconds),
                     ", ".join(f"{v:.2f}" for v in seconds), C.fmt(max((r["peak_rss_mib"] for r in ok), default=None), ".0f")])
    C.print_table(f"Scale: fresh interpreters, {built['rows']:,} rows in {built['parts']} parts (open + call, s)",
                  ["scenario", "right", "median", "90% CI", "runs", "peak MiB"], rows)


# ---------------------------------------------------------------------------------------------


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="where to write the JSON of all raw numbers")
    ap.add_argument("--steps", type=int, default=300, help="steps in the log, one part each (default 300)")
    ap.add_argument("--prompts", type=int, default=42, help="prompts a step (default 42)")
    ap.add_argument("--samples", type=int, default=8, help="samples a prompt (default 8)")
    ap.add_argument("--repeats", type=int, default=9, help="timed rounds of the trend scenarios (default 9)")
    ap.add_argument("--rescore-repeats", type=int, default=5, help="timed rounds of the re-score scenarios (default 5)")
    ap.add_argument("--breakdown-repeats", type=int, default=2, help="passes of each breakdown (default 2)")
    ap.add_argument("--phases", default="trend,rescore,breakdown", help="comma-separated subset of "
                    "trend,rescore,breakdown,scale (the build and the sizes always run)")
    ap.add_argument("--scale-repeats", type=int, default=5, help="fresh interpreters per scale scenario (default 5)")
    ap.add_argument("--s3", action="store_true", help="scale phase: also on a moto S3 server (needs moto, s3fs)")
    ap.add_argument("--dir", default=None, help="where to build the log (default: a new temporary folder)")
    ap.add_argument("--keep", action="store_true", help="leave the built log in place")
    ap.add_argument("--quick", action="store_true", help="6 steps of 4 x 4 rows, 1 round, no fresh interpreter: a smoke "
                    "run, numbers mean nothing")
    C.add_report_only(ap)
    args = ap.parse_args()
    if C.reported_again(args, report):
        return
    phases = C.subset(ap, "--phases", args.phases, ("trend", "rescore", "breakdown", "scale"))
    if args.quick:
        args.steps, args.prompts, args.samples = 6, 4, 4
        args.repeats, args.rescore_repeats, args.breakdown_repeats = 1, 1, 1
    os.environ.setdefault("MPLBACKEND", "Agg")
    record = C.Record(args.out, args, "bench/run_log.py")
    record["loadavg_at_start"] = os.getloadavg()  # the CPUs are shared: other work shows here
    record["packages"] = {name: C.package_version(name) for name in ("pyarrow", "numpy", "matplotlib", "cloudpickle",
                                                                      "pandas", "s3fs", "moto")}
    record["phases"] = {}
    root = Path(tempfile.mkdtemp(prefix="rlgen-run-log-", dir=args.dir))
    try:
        record["log"] = build(root, args.steps, args.prompts, args.samples, 50 if args.quick else PROMPT_POOL)
        C.log(f"built {record['log']['rows']:,} rows in {record['log']['parts']} parts in {record['log']['build_s']:.1f} s")
        sizes(record)
        record.save()
        path = record["log"]["path"]
        if "trend" in phases:
            interleave("trend", trend_scenarios(path, record["log"]), args.repeats, record, seed=0)
        base = None
        if "rescore" in phases or "breakdown" in phases:
            base = loaded_without_rewards(rlgen.RolloutLog(path))
        if "rescore" in phases and base is not None:
            scenarios, _ = rescore_scenarios(path, base)
            interleave("rescore", scenarios, args.rescore_repeats, record, seed=1)
        if "breakdown" in phases:
            breakdown(record, path, base, args.breakdown_repeats, root,
                      [p for p in ("trend", "rescore") if p in phases] or ["trend", "rescore"], fresh=not args.quick)
        if "scale" in phases:
            scale(record, path, args.scale_repeats, s3=args.s3)
    finally:
        close_pools()
        if args.keep:
            C.log(f"the log is kept at {root / 'log'}")
        else:
            shutil.rmtree(root, ignore_errors=True)
    record["loadavg_at_end"] = os.getloadavg()
    report(record)
    record.save(complete=True)


if __name__ == "__main__":
    main()
