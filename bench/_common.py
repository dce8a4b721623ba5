"""Shared pieces of the GPU benchmarks (`throughput.py`, `startup.py`, `scaling.py`) and of `rewards.py`.

Not a benchmark itself. It holds what more than one script needs, so that they measure alike:

- the command line every script takes (`--out`, `--quick`, `--backend`, `--model`, `--repeats`),
  progress lines (`log`, flushed) and the JSON record (`Record`, rewritten after every phase so a
  run killed at the time limit still leaves its numbers), which starts with `environment()`: the
  rlgen commit and whether the tree was dirty, package versions, Python, the GPU and the exact
  command line (`python bench/_common.py --for CMD` prints it for scripts/gpu/'s shell scripts);
- SGLang's site flags (`$RLGEN_SGLANG_ARGS`, e.g. triton attention on the lent H200) for raw
  launches and `sglang.Engine`, so every launch gets the same ones rlgen's Engine reads itself;
- workloads (`Workload`): token-id prompts of an exact length from a fixed seed, or chat prompts
  from templates, rendered to token ids once, so every method sends identical `input_ids` and the
  sampling parameters rlgen itself would send (`rlgen.core._options.to_sglang()`);
- the clients that compete with rlgen on the same server (`RawClient`: aiohttp + orjson, one
  batched request, chunked requests, or one request per prompt) and rlgen's own call;
- `run_interleaved`: warm up each method once, then every repeat runs every method once in a
  shuffled order, with a cache flush and a GC collection before each timed run; a failing method is
  recorded and dropped while the others go on; medians of generated tokens/s;
- `compare`: one method against others' pooled runs (ratio of medians, 90% bootstrap interval,
  rank test, and the split at the server), which the scripts' verdicts use; `compare_difference`,
  the same for a difference of medians (the seconds a cost adds); both rest on `bootstrap_medians`;
- `nvidia-smi` readings (memory used / total; per process: `rlgen.server._process_tree.gpu_memory_mib`) and
  plain-text tables.

Runnable scripts import it as `_common` (Python puts the script's directory on sys.path).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import http.client
import json
import math
import operator
import os
import platform
import random
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import Any, NamedTuple
from urllib.parse import urlsplit

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))  # run from a checkout; on the GPU machine PYTHONPATH has it too

SGLANG_ARGS_ENV = "RLGEN_SGLANG_ARGS"
# What the lent H200 needs (no FA3 kernels in its SGLang bundle); used when the variable is unset.
DEFAULT_SITE_ARGS = "--attention-backend triton --sampling-backend pytorch"
VOCAB_RANGE = (1000, 30000)  # token ids drawn for synthetic prompts: ordinary tokens of SmolLM2's 49k
CHUNK_SIZE = 256             # the most prompts per /generate request rlgen sends unless told (chunk_size=None)
_T0 = time.monotonic()


# ---------------------------------------------------------------------------------------------
# Command line, progress, JSON record


def base_parser(doc: str | None, *, repeats: int = 3) -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="where to write the JSON of all raw numbers")
    ap.add_argument("--quick", action="store_true", help="tiny sizes: a smoke run, numbers mean nothing")
    ap.add_argument("--backend", choices=("sglang", "cpu"), default="sglang",
                    help="cpu: rlgen's CPU backend (smoke tests without a GPU; SGLang-only phases are skipped)")
    ap.add_argument("--model", default=None, help="HF checkout (default: $RLGEN_TEST_MODEL, else rlgen's default model)")
    ap.add_argument("--repeats", type=int, default=None,
                    help=f"timed repeats per method (default {repeats}; {min(2, repeats)} with --quick)")
    ap.set_defaults(default_repeats=repeats)
    return ap


def subset(ap: argparse.ArgumentParser, flag: str, text: str, allowed: Sequence[str]) -> list[str]:
    """The comma-separated names of `text`, each one of `allowed` (else a usage error naming `flag`)."""
    names = [part.strip() for part in text.split(",") if part.strip()]
    if not names or set(names) - set(allowed):
        ap.error(f"{flag} takes a comma-separated subset of {','.join(allowed)}")
    return names


def add_report_only(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--report-only", metavar="JSON", default=None,
                    help="measure nothing: print the report of a saved run again (and write it, re-analysed, to --out)")


def reported_again(args: argparse.Namespace, report: Callable[[Record], None]) -> bool:
    """With --report-only: `report` the saved run again and write it to --out. True if it did."""
    if not args.report_only:
        return False
    record = Record.load(args.report_only, out=args.out)
    report(record)
    record.save(complete=True)
    return True


def begin(doc: str | None, script: str, report: Callable[[Record], None], *, repeats: int
          ) -> tuple[argparse.Namespace, str, Record] | None:
    """The opening every measuring script shares: its command line (with `--report-only`), SGLang's
    site flags for an sglang run, the model, and the Record; None when the call only re-reported a
    saved run."""
    ap = base_parser(doc, repeats=repeats)
    add_report_only(ap)
    args = ap.parse_args()
    if reported_again(args, report):
        return None
    if args.backend == "sglang":
        site_flags()
    return args, model_path(args.model), Record(args.out, args, script)


def measure_and_report(record: Record, measure: Callable[[], None], report: Callable[[Record], None]) -> None:
    """The closing every measuring script shares: `measure()` (a failure is recorded with its
    traceback, and what was measured before it is still reported), the report, the record saved
    complete, and where it went."""
    import traceback

    try:
        measure()
    except Exception as err:  # report what there is
        record["error"] = f"{type(err).__name__}: {err}"
        record["traceback"] = traceback.format_exc(limit=10)
        log(f"FAILED: {record['error']}")
    report(record)
    record.save(complete=True)
    log(f"wrote {os.path.abspath(record.path)}")


def repeats_of(args: argparse.Namespace) -> int:
    if args.repeats is not None:
        return args.repeats
    return min(2, args.default_repeats) if args.quick else args.default_repeats


def log(msg: str) -> None:
    """One progress line, flushed at once (PYTHONUNBUFFERED may be unset on the GPU machine)."""
    print(f"[{time.monotonic() - _T0:7.1f}s] {msg}", flush=True)


def logs_dir(out: str, name: str) -> Path:
    """Where a script keeps server logs: beside --out (`<stem>-logs/<name>`), so they travel with it."""
    path = Path(out).resolve()
    return path.parent / f"{path.stem}-logs" / name


def model_path(arg: str | None) -> str:
    if arg:
        return arg
    if os.environ.get("RLGEN_TEST_MODEL"):
        return os.environ["RLGEN_TEST_MODEL"]
    from rlgen.server._models import default_model_path

    return str(default_model_path())


def read_saved(saved: str | Path) -> str:
    """A saved run's JSON text; `*.json.xz` and `*.json.gz` (large runs kept compressed under docs/gpu/) too."""
    path = Path(saved)
    if path.suffix == ".xz":
        import lzma
        return lzma.decompress(path.read_bytes()).decode()
    if path.suffix == ".gz":
        import gzip
        return gzip.decompress(path.read_bytes()).decode()
    return path.read_text()


class Record:
    """The JSON written to `--out`: environment, arguments, then whatever each phase adds.

    `save()` rewrites the whole file; call it after every phase so a run killed by the time limit
    still leaves everything measured so far.
    """

    def __init__(self, path: str, args: argparse.Namespace, script: str) -> None:
        self.path = Path(path)
        self.data: dict[str, Any] = {"script": script, "args": vars(args), "environment": environment(), "complete": False}

    @classmethod
    def load(cls, saved: str, *, out: str) -> Record:
        """A saved run, to be reported again and written to `out` (`saved` itself is left alone)."""
        self = cls.__new__(cls)
        self.path = Path(out)
        self.data = json.loads(read_saved(saved))
        self.data["reported_again_from"] = saved
        self.data["reported_again_environment"] = environment()  # the report's own commit and command
        return self

    def __setitem__(self, key: str, value: Any) -> None:
        self.data[key] = value

    def __getitem__(self, key: str) -> Any:
        return self.data[key]

    def save(self, *, complete: bool = False) -> None:
        self.data["complete"] = complete
        self.data["finished_at" if complete else "saved_at"] = time.strftime("%Y-%m-%dT%H:%M:%S")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(json.dumps(self.data, indent=1, default=str))
        tmp.replace(self.path)


COMMIT_ENV = "RLGEN_COMMIT"
PACKAGES = ("rlgen", "sglang", "torch", "transformers", "tokenizers", "aiohttp", "orjson", "pandas")


def environment(command: str | None = None) -> dict[str, Any]:
    """What a run needs to be read again later: the rlgen commit (and whether the checkout had
    uncommitted changes), package versions, Python, the GPU, and the exact command line.

    Every script's JSON carries it (`Record`); `python bench/_common.py --for CMD` prints it for the
    shell scripts of scripts/gpu/. Imports nothing it reports on (startup.py times rlgen's imports
    after this runs). `command`: the command this record describes, if not this process's own.
    """
    gpus = nvidia_smi("--query-gpu=name,memory.total,driver_version")
    return {
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "command": command if command is not None else shlex.join(getattr(sys, "orig_argv", [sys.executable, *sys.argv])),
        "cwd": os.getcwd(),
        "argv": sys.argv,
        "rlgen_commit": rlgen_commit(),
        "python": sys.version.split()[0],
        "executable": sys.executable,
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "packages": {name: package_version(name) for name in PACKAGES},
        "gpu": gpus[0][0] if gpus else None,
        "gpus": gpus,
        "rlgen_env": {key: value for key, value in sorted(os.environ.items()) if key.startswith("RLGEN_")},
        SGLANG_ARGS_ENV: os.environ.get(SGLANG_ARGS_ENV),
    }


def package_version(name: str) -> str | None:
    """The installed distribution's version; for rlgen, the version of the checkout this process
    imports it from (REPO, first on sys.path), read from its source without importing it."""
    from importlib.metadata import PackageNotFoundError, version

    if name == "rlgen" and (REPO / "rlgen" / "__init__.py").is_file():
        found = re.search(r'^__version__ = "([^"]+)"', (REPO / "rlgen" / "__init__.py").read_text(), re.MULTILINE)
        if found:
            return found.group(1)
    try:
        return version(name)
    except PackageNotFoundError:
        return None


def rlgen_commit() -> dict[str, Any]:
    """The commit of the checkout whose rlgen this process imports (REPO, first on sys.path), and
    whether it had uncommitted changes (`git status --porcelain`, untracked files included).

    $RLGEN_COMMIT, when set, says it and wins over git: the GPU machine gets a copy of the working
    tree whose .git need not be the copied checkout's (on 2026-12-01 it held the session's first
    commit, so git there named the wrong one). Set it to `git describe --always --dirty --abbrev=40`,
    run where the tree was copied from (a `-dirty` suffix marks uncommitted changes).
    """
    def git(*cmd: str) -> str | None:
        try:
            done = subprocess.run(["git", "-C", str(REPO), *cmd], capture_output=True, text=True, timeout=20,
                                  check=False)
        except (OSError, subprocess.SubprocessError):
            return None
        return done.stdout if done.returncode == 0 else None

    given = os.environ.get(COMMIT_ENV, "").strip()
    if given:
        dirty = given.endswith("-dirty")
        return {"commit": given.removesuffix("-dirty"), "dirty": dirty, "changes": None, "source": COMMIT_ENV}
    top, head = git("rev-parse", "--show-toplevel"), git("rev-parse", "HEAD")
    if top is not None and head is not None and Path(top.strip()).resolve() == REPO:  # not a repo around a copy
        changes = (git("status", "--porcelain") or "").splitlines()
        return {"commit": head.strip(), "dirty": bool(changes), "changes": changes[:50], "source": "git"}
    return {"commit": None, "dirty": None, "changes": None,
            "source": f"unknown: no git checkout at {REPO} and ${COMMIT_ENV} unset"}


# ---------------------------------------------------------------------------------------------
# SGLang's site flags


def site_flags() -> list[str]:
    """The flags every SGLang launch gets: $RLGEN_SGLANG_ARGS, set to the H200's needs if unset.

    Setting the variable here makes rlgen's Engine (which reads it itself) get exactly the flags
    that raw launches and `sglang.Engine` get from this function.
    """
    os.environ.setdefault(SGLANG_ARGS_ENV, DEFAULT_SITE_ARGS)
    return shlex.split(os.environ[SGLANG_ARGS_ENV])


def flags_as_kwargs(flags: list[str]) -> dict[str, Any]:
    """Server flags as `sglang.Engine(**kwargs)`: `--cuda-graph-max-bs-decode 512` -> cuda_graph_max_bs_decode=512."""
    out: dict[str, Any] = {}
    i = 0
    while i < len(flags):
        key = flags[i].lstrip("-").replace("-", "_")
        if i + 1 < len(flags) and not flags[i + 1].startswith("--"):
            out[key], i = _number_or_text(flags[i + 1]), i + 2
        else:
            out[key], i = True, i + 1
    return out


def server_flags(argv: list[str] | tuple[str, ...]) -> list[str]:
    """The flags of a launched server's argv: after `--model-path X`, without --host/--port."""
    flags = list(argv[argv.index("--model-path") + 2:])
    for name in ("--host", "--port"):
        if name in flags:
            at = flags.index(name)
            del flags[at:at + 2]
    return flags


def _number_or_text(value: str) -> Any:
    for kind in (int, float):
        try:
            return kind(value)
        except ValueError:
            pass
    return value


# ---------------------------------------------------------------------------------------------
# Workloads


@dataclass(frozen=True)
class Workload:
    """Prompts (token ids) plus the options of one generate call, as every method sends them."""

    name: str
    prompts: list[list[int]]
    options: dict[str, Any]          # rlgen.generate sampling options: max_new_tokens, temperature, ignore_eos
    n: int = 1
    logprobs: bool = True            # rlgen's default
    top_logprobs: int = 0            # top-k logprobs at every position (rlgen's top_logprobs=)
    describe: str = ""

    @property
    def n_samples(self) -> int:
        return len(self.prompts) * self.n

    @cached_property  # built once, not inside the timed loops (per-request builds a body per prompt)
    def sampling(self) -> dict[str, Any]:
        """The sampling_params rlgen sends for these options (without `n`)."""
        from rlgen.core._options import SamplingOptions, resolve, to_sglang

        return to_sglang(resolve(SamplingOptions, self.options))

    def payload(self, prompts: list[list[int]] | list[int], *, native_n: bool = False) -> dict[str, Any]:
        """A /generate body as rlgen builds it (n copies of each prompt; logprob flags), without
        rlgen's rids. `native_n=True`: each prompt once, with SGLang's `n` in the sampling params."""
        if native_n and self.n > 1:
            body: dict[str, Any] = {"input_ids": prompts, "sampling_params": {**self.sampling, "n": self.n}}
        else:
            body = {"input_ids": [p for p in prompts for _ in range(self.n)], "sampling_params": self.sampling}
        if self.logprobs or self.top_logprobs:
            body["return_logprob"] = True
            body["top_logprobs_num"] = self.top_logprobs
        return body

    def head(self, count: int) -> Workload:
        """The first `count` prompts: a warm-up that exercises the same path at a small size."""
        return replace(self, prompts=self.prompts[:count])

    def summary(self) -> dict[str, Any]:
        lengths = [len(p) for p in self.prompts]
        return {"name": self.name, "describe": self.describe, "prompts": len(self.prompts), "n": self.n,
                "samples": self.n_samples, "prompt_tokens_min": min(lengths), "prompt_tokens_max": max(lengths),
                "options": self.options, "logprobs": self.logprobs, "sampling_params": self.sampling}


def token_prompts(count: int, length: int, *, seed: int = 0) -> list[list[int]]:
    """`count` prompts of exactly `length` random token ids (fixed seed: identical in every run)."""
    rng = random.Random(seed)
    lo, hi = VOCAB_RANGE
    return [[rng.randrange(lo, hi) for _ in range(length)] for _ in range(count)]


def token_workload(name: str, count: int, prompt_len: int, new_tokens: int, *, n: int = 1,
                   logprobs: bool = True, top_logprobs: int = 0, seed: int = 0) -> Workload:
    """Fixed-length token-id prompts -> exactly `new_tokens` tokens each (ignore_eos)."""
    return Workload(
        name=name, prompts=token_prompts(count, prompt_len, seed=seed),
        options={"max_new_tokens": new_tokens, "temperature": 1.0, "ignore_eos": True}, n=n, logprobs=logprobs,
        top_logprobs=top_logprobs,
        describe=f"{count} prompts x {prompt_len} tokens -> {new_tokens} new, n={n}, ignore_eos, "
                 f"logprobs={'on' if logprobs else 'off'}{f', top-{top_logprobs}' if top_logprobs else ''}",
    )


_COUNTRIES = ["France", "Japan", "Brazil", "Kenya", "Canada", "India", "Norway", "Peru", "Egypt", "Vietnam",
              "Italy", "Chile", "Ghana", "Poland", "Mexico", "Nepal", "Spain", "Turkey", "Australia", "Sweden"]
_TOPICS = ["the ocean", "volcanoes", "honeybees", "the moon", "trains", "chess", "rainforests", "bread",
           "glaciers", "owls", "bicycles", "the internet", "deserts", "music", "coffee", "lightning"]
_TEMPLATES: tuple[Callable[[random.Random], str], ...] = (
    lambda r: f"What is {r.randrange(2, 999)} + {r.randrange(2, 999)}? Answer with the number only.",
    lambda r: f"What is {r.randrange(2, 99)} times {r.randrange(2, 99)}? Show your working briefly.",
    lambda r: f"Is {r.randrange(2, 9999)} a prime number? Explain in one or two sentences.",
    lambda r: f"What is the capital of {r.choice(_COUNTRIES)}?",
    lambda r: f"List three facts about {r.choice(_COUNTRIES)}.",
    lambda r: f"Which is larger, {r.choice(_COUNTRIES)} or {r.choice(_COUNTRIES)}? Answer briefly.",
    lambda r: f"Write one sentence about {r.choice(_TOPICS)}.",
    lambda r: f"Explain {r.choice(_TOPICS)} to a five-year-old.",
    lambda r: f"Write a haiku about {r.choice(_TOPICS)}.",
    lambda r: f"Count from {(a := r.randrange(1, 50))} to {a + r.randrange(3, 12)}, separated by commas.",
)


def chat_prompts(count: int, tokenizer: Any, *, seed: int = 0) -> list[list[int]]:
    """`count` varied one-turn chats from templates, rendered with the model's chat template to ids."""
    rng = random.Random(seed)
    prompts = []
    for i in range(count):
        question = _TEMPLATES[i % len(_TEMPLATES)](rng)
        ids = tokenizer.apply_chat_template([{"role": "user", "content": question}], add_generation_prompt=True,
                                            tokenize=True)
        if isinstance(ids, Mapping):  # transformers >= 5 may return a BatchEncoding
            ids = ids["input_ids"]
        prompts.append([int(t) for t in ids])
    return prompts


def chat_workload(name: str, count: int, new_tokens: int, model: str, *, seed: int = 0) -> Workload:
    """Varied chat prompts, natural stops (EOS), temperature 1, logprobs on."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model)
    return Workload(
        name=name, prompts=chat_prompts(count, tokenizer, seed=seed),
        options={"max_new_tokens": new_tokens, "temperature": 1.0}, logprobs=True,
        describe=f"{count} chat prompts (templates) -> up to {new_tokens} new, natural stops, T=1, logprobs on",
    )


# ---------------------------------------------------------------------------------------------
# The methods: raw HTTP clients and rlgen


def completion_tokens(entries: Sequence[Mapping[str, Any]]) -> int:
    return sum(int(e["meta_info"]["completion_tokens"]) for e in entries)


def _entries(decoded: Any) -> list[dict[str, Any]]:
    return decoded if isinstance(decoded, list) else [decoded]


class Served(NamedTuple):
    """What one timed call returns: generated tokens, and the server's own time for them (None
    where it does not say): the longest sample's `e2e_latency`, which SGLang measures from the
    moment its tokenizer manager takes the request to the moment it has that sample's output.

    wall time - server_s is the time outside the server: building and sending the request, the
    HTTP transport and the server's JSON encoding of the answer, the client's parsing and what it
    builds. For one request (or chunks sent at once) it isolates the client's cost from the
    server's run-to-run spread; for requests sent one after another it does not.
    """

    tokens: int
    server_s: float | None = None


def server_span(latencies: Sequence[Any]) -> float | None:
    kept = [float(v) for v in latencies if v is not None and v == v]
    return max(kept) if kept else None


def served(entries: Sequence[Mapping[str, Any]]) -> Served:
    return Served(completion_tokens(entries), server_span([e["meta_info"].get("e2e_latency") for e in entries]))


def _checked(entries: list[dict[str, Any]], expected: int) -> Served:
    if len(entries) != expected:
        raise RuntimeError(f"the server answered {len(entries)} samples for {expected}")
    return served(entries)


async def post_generate(session: Any, url: str, body: dict[str, Any]) -> Any:
    """One POST /generate of `body` on an aiohttp session (orjson both ways, the cyclic GC paused while
    the answer is decoded, as rlgen's client does); the decoded answer. Raises on an HTTP error."""
    import orjson

    async with session.post(url + "/generate", data=orjson.dumps(body), headers={"Content-Type": "application/json"}) as r:
        raw = await r.read()
        if r.status >= 400:
            raise RuntimeError(f"/generate failed with HTTP {r.status}: {raw[:300]!r}")
    gc.disable()
    try:
        return orjson.loads(raw)
    finally:
        gc.enable()


class RawClient:
    """The ceiling for any client: aiohttp POSTs straight to /generate, orjson to decode, nothing else.

    Runs on its own event loop in the calling thread (never rlgen's background loop), with one
    session and no connection cap, kept for the object's life as rlgen keeps its own. Cyclic GC is
    paused while a body is decoded, as rlgen's client does (else parsing is several times slower).
    """

    def __init__(self, url: str) -> None:
        raise_fd_limit()  # one request per prompt means a socket per prompt
        self.url = url.rstrip("/")
        self._loop = asyncio.new_event_loop()
        self._session: Any = None

    def close(self) -> None:
        if self._session is not None:
            self._loop.run_until_complete(self._session.close())
        self._loop.close()

    def __enter__(self) -> RawClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def _post(self, body: dict[str, Any]) -> list[dict[str, Any]]:
        import aiohttp

        from rlgen.client._http import KEEPALIVE_S  # as rlgen: idle connections go before uvicorn drops them

        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=KEEPALIVE_S),
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=10))
        return _entries(await post_generate(self._session, self.url, body))

    def _gather(self, bodies: list[dict[str, Any]]) -> list[dict[str, Any]]:
        async def all_of() -> list[list[dict[str, Any]]]:
            return await asyncio.gather(*(self._post(b) for b in bodies))

        return [e for part in self._loop.run_until_complete(all_of()) for e in part]

    def one_request(self, wl: Workload) -> Served:
        """Every prompt in ONE batched request."""
        return _checked(self._gather([wl.payload(wl.prompts)]), wl.n_samples)

    def chunked(self, wl: Workload, chunk_size: int = CHUNK_SIZE, *, native_n: bool = False) -> Served:
        """Batched requests of `chunk_size` prompts, all in flight at once."""
        bodies = [wl.payload(wl.prompts[a:a + chunk_size], native_n=native_n)
                  for a in range(0, len(wl.prompts), chunk_size)]
        return _checked(self._gather(bodies), wl.n_samples)

    def chunked_native_n(self, wl: Workload) -> Served:
        """`chunked` with SGLang's own `n` (what rlgen sent before 2026-11-30c; same as chunked at n=1)."""
        return self.chunked(wl, native_n=True)

    def per_request(self, wl: Workload) -> Served:
        """One request per prompt (its n samples in it, SGLang's `n`), all concurrent: AReaL's pattern."""
        return _checked(self._gather([wl.payload(p, native_n=True) for p in wl.prompts]), wl.n_samples)

    def methods(self) -> dict[str, Callable[[Workload], Served]]:
        return {"raw-1req": self.one_request, "raw-chunked": self.chunked, "raw-chunked-n": self.chunked_native_n,
                "per-request": self.per_request}


def raise_fd_limit() -> None:
    """Soft open-files limit up to the hard one (SGLang's server does the same for itself)."""
    try:
        import resource
    except ImportError:  # not on POSIX
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else max(soft, 65536)
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError):
            pass


def rlgen_generate(eng: Any, wl: Workload, **extra: Any) -> Served:
    """rlgen as a user calls it, including the DataFrame and the tensors; `extra`: more generate() options."""
    res = eng.generate(wl.prompts, n=wl.n, logprobs=wl.logprobs, top_logprobs=wl.top_logprobs, progress=False,
                       **wl.options, **extra)
    df = res.df
    tensors = res.tensors()
    if tensors["response_ids"].shape[0] != wl.n_samples:
        raise RuntimeError(f"rlgen returned {tensors['response_ids'].shape[0]} rows for {wl.n_samples}")
    return Served(int(df["completion_tokens"].sum()), server_span(df["request_latency_s"].tolist()))


# ---------------------------------------------------------------------------------------------
# Control requests (plain http.client: no proxy may sit between us and a loopback server)


def http_request(url: str, path: str, body: Any = None, *, timeout: float = 30.0) -> tuple[int, bytes]:
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout)
    try:
        if body is None:
            conn.request("GET", path)
        else:
            conn.request("POST", path, body=json.dumps(body), headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def flush_cache(url: str, tries: int = 3) -> None:
    """Drop the server's prefix cache so no timed run reuses another's prefill; raises if refused."""
    answer: Any = None
    for _ in range(tries):
        try:
            status, body = http_request(url, "/flush_cache", {}, timeout=10)
            if status == 200:
                return
            answer = f"HTTP {status}: {body[:200]!r}"
        except OSError as err:
            answer = err
        time.sleep(0.2)  # SGLang refuses while requests are still finishing
    raise RuntimeError(f"/flush_cache failed {tries} times: {answer}")


# ---------------------------------------------------------------------------------------------
# Timing


def run_interleaved(
    methods: Mapping[str, Callable[[Workload], int | Served]],
    wl: Workload,
    *,
    repeats: int,
    warmup: Workload | None = None,
    before_each: Callable[[], Any] | None = None,
    after_each: Callable[[dict[str, dict[str, Any]]], Any] | None = None,
    label: str = "",
) -> dict[str, dict[str, Any]]:
    """Time each method on `wl`: one warm-up each, then `repeats` rounds, each in a shuffled order.

    Each method returns the number of generated tokens, or a `Served` (tokens and the server's own
    time); a run records seconds, tokens, tokens/s and, where the server said, server_s and
    outside_s (seconds - server_s).
    A method that raises is recorded (error + traceback) and skipped from then on. Returns per
    method: runs, warmup, error, median_tok_s, median_s. `after_each(partial)` gets the results so
    far after every timed run (to save them: a long run cut by a time limit keeps what it did).
    """
    names = list(methods)
    out: dict[str, dict[str, Any]] = {name: {"runs": [], "warmup": None, "error": None} for name in names}

    def attempt(name: str, workload: Workload, phase: str) -> dict[str, Any] | None:
        if out[name]["error"] is not None:
            return None
        if before_each is not None:
            try:
                before_each()
            except Exception as err:  # a failed cache flush is noted, not fatal
                out[name].setdefault("before_each_errors", []).append(f"{type(err).__name__}: {err}")
        gc.collect()
        t0 = time.perf_counter()
        try:
            outcome = methods[name](workload)
        except Exception as err:  # one failing method must not stop the others
            out[name]["error"] = f"{phase}: {type(err).__name__}: {err}"
            out[name]["traceback"] = traceback.format_exc(limit=8)
            log(f"  {label}{name}: FAILED in {phase}: {type(err).__name__}: {str(err)[:300]}")
            return None
        seconds = time.perf_counter() - t0
        got = outcome if isinstance(outcome, Served) else Served(int(outcome))
        run = {"seconds": seconds, "tokens": got.tokens, "tok_s": got.tokens / seconds if seconds > 0 else float("nan")}
        if got.server_s is not None:
            run.update(server_s=got.server_s, outside_s=seconds - got.server_s)
        return run

    for name in names:
        out[name]["warmup"] = attempt(name, warmup or wl, "warm-up")
    warmed = [f"{name} {w['seconds']:.2f} s" for name, w in ((n, out[n]["warmup"]) for n in names) if w]
    log(f"  {label}warmed up ({(warmup or wl).n_samples} samples): {', '.join(warmed) or 'none'}")
    order_rng = random.Random(0)
    for r in range(repeats):
        # A fresh shuffle each round: a rotation would put every method after the same neighbour
        # in every round, and whatever a method leaves behind (server state, garbage) would then
        # always land on the same next method.
        order = names[:]
        order_rng.shuffle(order)
        for position, name in enumerate(order):
            run = attempt(name, wl, f"repeat {r + 1}")
            if run is not None:
                out[name]["runs"].append({**run, "repeat": r, "after": order[position - 1] if position else None})
                log(f"  {label}{name:14s} repeat {r + 1}/{repeats}: {run['tok_s']:12,.0f} tok/s "
                    f"({run['tokens']} tokens in {run['seconds']:.2f} s)")
                if after_each is not None:
                    after_each(out)
    for result in out.values():
        runs = result["runs"]
        result["median_tok_s"] = statistics.median(x["tok_s"] for x in runs) if runs else None
        result["median_s"] = statistics.median(x["seconds"] for x in runs) if runs else None
    return out


def median_or_none(values: Sequence[float | None]) -> float | None:
    kept = [v for v in values if v is not None]
    return statistics.median(kept) if kept else None


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


# ---------------------------------------------------------------------------------------------
# Statistics for a handful of noisy runs (no scipy on the GPU image's path is assumed)


def runs_of(per_method: dict[str, Any], names: list[str], key: str) -> list[float]:
    return [r[key] for name in names for r in (per_method.get(name) or {}).get("runs", []) if r.get(key) is not None]


def compare(per_method: dict[str, Any], ours: str, theirs: list[str], *, key: str = "tok_s") -> dict[str, Any]:
    """median(ours) / median(theirs) of `key` (tokens/s unless told), its 90% bootstrap interval and a
    rank test; and, where the runs say, the same two sides split into the server's time and the time
    outside it."""
    x, y = runs_of(per_method, [ours], key), runs_of(per_method, theirs, key)
    out: dict[str, Any] = {"ours": ours, "theirs": theirs, "key": key, "runs": [len(x), len(y)],
                           "ratio": ratio(median_or_none(x), median_or_none(y)),
                           # fewer than 3 runs a side: no interval to judge on
                           "interval": bootstrap_ratio(x, y) if min(len(x), len(y)) >= 3 else None,
                           "p": rank_test_p(x, y)}
    xs, ys = runs_of(per_method, [ours], "server_s"), runs_of(per_method, theirs, "server_s")
    if xs and ys:
        wall_y = median_or_none(runs_of(per_method, theirs, "seconds"))
        out_x = median_or_none(runs_of(per_method, [ours], "outside_s"))
        out_y = median_or_none(runs_of(per_method, theirs, "outside_s"))
        extra = out_x - out_y  # type: ignore[operator]
        out.update(server_s=[median_or_none(xs), median_or_none(ys)], server_p=rank_test_p(xs, ys),
                   outside_s=[out_x, out_y], extra_outside_s=extra,
                   # the same server time, ours spending `extra` more outside it
                   ratio_from_outside=wall_y / (wall_y + extra) if wall_y else None)  # type: ignore[operator]
    return out


def compare_difference(per_method: dict[str, Any], ours: str, theirs: list[str], *,
                       key: str = "seconds") -> dict[str, Any]:
    """median(ours) - median(theirs) of `key` (seconds unless told), its 90% bootstrap interval and a
    rank test: `compare` for a cost that adds (what a pool or a hung call costs on top of a run)."""
    x, y = runs_of(per_method, [ours], key), runs_of(per_method, theirs, key)
    mx, my = median_or_none(x), median_or_none(y)
    return {"ours": ours, "theirs": theirs, "key": key, "runs": [len(x), len(y)],
            "difference": mx - my if mx is not None and my is not None else None,
            "interval": bootstrap_difference(x, y) if min(len(x), len(y)) >= 3 else None,
            "p": rank_test_p(x, y)}


def rank_test_p(x: Sequence[float], y: Sequence[float]) -> float | None:
    """Two-sided Mann-Whitney U test of "x and y come from one distribution" (normal
    approximation with a tie correction; fair from about 4 runs a side). None if a side is empty."""
    if not x or not y:
        return None
    pooled = sorted((v, side) for side, values in ((0, x), (1, y)) for v in values)
    ranks: list[float] = [0.0] * len(pooled)
    ties = 0.0
    i = 0
    while i < len(pooled):
        j = i
        while j + 1 < len(pooled) and pooled[j + 1][0] == pooled[i][0]:
            j += 1
        for k in range(i, j + 1):
            ranks[k] = (i + j) / 2 + 1
        ties += (j - i + 1) ** 3 - (j - i + 1)
        i = j + 1
    n1, n2 = len(x), len(y)
    u = sum(r for r, (_, side) in zip(ranks, pooled) if side == 0) - n1 * (n1 + 1) / 2
    n = n1 + n2
    var = n1 * n2 / 12 * ((n + 1) - ties / (n * (n - 1)))
    if var <= 0:
        return 1.0
    z = (abs(u - n1 * n2 / 2) - 0.5) / var ** 0.5  # continuity correction
    return min(1.0, math.erfc(max(z, 0.0) / 2 ** 0.5))


def bootstrap_medians(a: Sequence[float], b: Sequence[float], combine: Callable[[float, float], float], *,
                      level: float = 0.9, draws: int = 4000, seed: int = 0) -> tuple[float, float] | None:
    """A percentile bootstrap interval for combine(median(a), median(b)), each side resampled on its own."""
    if not a or not b:
        return None
    rng = random.Random(seed)
    values = sorted(
        combine(statistics.median(rng.choices(a, k=len(a))), statistics.median(rng.choices(b, k=len(b))))
        for _ in range(draws)
    )
    tail = (1 - level) / 2
    return values[int(tail * draws)], values[min(draws - 1, int((1 - tail) * draws))]


def bootstrap_ratio(num: Sequence[float], den: Sequence[float], *, level: float = 0.9, draws: int = 4000,
                    seed: int = 0) -> tuple[float, float] | None:
    """A percentile bootstrap interval for median(num) / median(den), each side resampled on its own."""
    return bootstrap_medians(num, den, operator.truediv, level=level, draws=draws, seed=seed)


def bootstrap_difference(a: Sequence[float], b: Sequence[float], *, level: float = 0.9, draws: int = 4000,
                         seed: int = 0) -> tuple[float, float] | None:
    """A percentile bootstrap interval for median(a) - median(b), each side resampled on its own."""
    return bootstrap_medians(a, b, operator.sub, level=level, draws=draws, seed=seed)


def bootstrap_median(values: Sequence[float], *, level: float = 0.9, draws: int = 4000,
                     seed: int = 0) -> tuple[float, float] | None:
    """A percentile bootstrap interval for median(values) alone; None from fewer than 3 values."""
    if len(values) < 3:
        return None
    return bootstrap_medians(values, [1.0], lambda m, _: m, level=level, draws=draws, seed=seed)


# ---------------------------------------------------------------------------------------------
# nvidia-smi


def nvidia_smi(query: str) -> list[list[str]] | None:
    """Rows of `nvidia-smi <query> --format=csv,noheader,nounits`, or None without nvidia-smi."""
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        out = subprocess.run(["nvidia-smi", query, "--format=csv,noheader,nounits"], capture_output=True,
                             text=True, timeout=20).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return [[part.strip() for part in line.split(",")] for line in out.splitlines() if line.strip()]


def gpu_used_mib() -> int | None:
    """memory.used summed over the visible GPUs (the server uses one; the others do not move).

    Some machines' nvidia-smi prints 0 MiB even while a server holds memory (a container that hides
    other processes' use); there the driver's own count, read by a fresh process through
    torch.cuda.mem_get_info (total - free, which includes that probe's own CUDA context), is used."""
    rows = nvidia_smi("--query-gpu=memory.used")
    if not rows:
        return None
    used = sum(int(r[0]) for r in rows if r[0].isdigit())
    return used if used > 0 else _gpu_used_mib_from_driver()


def _gpu_used_mib_from_driver() -> int | None:
    code = ("import torch\nif torch.cuda.is_available():\n"
            "    print(sum((t - f) >> 20 for f, t in (torch.cuda.mem_get_info(i) for i in range(torch.cuda.device_count()))))")
    try:
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return int(out) if out.isdigit() else None


def gpu_total_mib() -> int | None:
    """memory.total of the first GPU, the one the server runs on."""
    rows = nvidia_smi("--query-gpu=memory.total")
    return int(rows[0][0]) if rows and rows[0][0].isdigit() else None


def wait_gpu_back(baseline_mib: int | None, *, slack_mib: int = 1024, timeout: float = 60.0) -> float | None:
    """Wait until memory.used is back within `slack_mib` of `baseline_mib`; seconds waited (None: no GPU)."""
    if baseline_mib is None:
        return None
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        used = gpu_used_mib()
        if used is None or used <= baseline_mib + slack_mib:
            break
        time.sleep(0.5)
    return time.monotonic() - t0


# ---------------------------------------------------------------------------------------------
# Tables


def fmt(value: Any, spec: str = ",.0f", missing: str = "-") -> str:
    if value is None or (isinstance(value, float) and value != value):
        return missing
    return format(value, spec) if isinstance(value, (int, float)) else str(value)


def print_table(title: str, headers: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    widths = [max(len(str(h)), *(len(str(r[i])) for r in rows)) if rows else len(str(h)) for i, h in enumerate(headers)]
    line = "  ".join(str(h).rjust(w) if i else str(h).ljust(w) for i, (h, w) in enumerate(zip(headers, widths)))
    print(f"\n{title}\n{line}\n{'-' * len(line)}", flush=True)
    for r in rows:
        print("  ".join(str(c).rjust(w) if i else str(c).ljust(w) for i, (c, w) in enumerate(zip(r, widths))), flush=True)


def verdict(ok: bool | None) -> str:
    return "n/a" if ok is None else ("PASS" if ok else "FAIL")


@dataclass
class Targets:
    """Target checks collected while printing, stored in the JSON as they were printed."""

    rows: list[dict[str, Any]] = field(default_factory=list)

    def check_interval(self, name: str, value: float | None, interval: tuple[float, float] | None,
                       bound: float, *, op: str = ">=", unit: str = "x", wrong: str | None = None) -> None:
        """`value >= bound` (or `value < bound`, op="<"), judged on its interval: PASS if all of it is on
        the bound's right side, FAIL if all of it is on the wrong side, NOISE if it straddles the bound
        (the runs cannot tell). `wrong`: what made the measured thing itself wrong (e.g. a row scored
        wrongly): then FAIL, whatever the numbers."""
        if op not in (">=", "<"):
            raise ValueError(f"op must be '>=' or '<', got {op!r}")
        if value is None or interval is None:
            ok, word = None, "n/a"  # not measured, or too few runs for an interval
        else:
            lo, hi = interval
            if op == ">=":
                ok = True if lo >= bound else (False if hi < bound else None)
            else:
                ok = True if hi < bound else (False if lo >= bound else None)
            word = verdict(ok) if ok is not None else "NOISE"
        if wrong is not None:
            ok, word = False, "FAIL"
        self.rows.append({"target": name, "value": value, "interval": interval, "op": op, "bound": bound,
                          "unit": unit, "ok": ok, "verdict": word, "wrong": wrong})
        sep = "" if unit == "x" else " "
        shown = "not measured" if value is None else f"{value:.3f}{sep}{unit}"
        if interval is not None:
            shown += f" [90% interval {interval[0]:.3f}-{interval[1]:.3f}]"
        if wrong is not None:
            shown += f"; wrong: {wrong}"
        print(f"  {word:5s} {name}: {shown} (target {op} {bound:g}{sep}{unit})", flush=True)

    def check(self, name: str, value: float | None, op: str, bound: float, unit: str = "") -> None:
        ok = None if value is None else (value >= bound if op == ">=" else value <= bound)
        self.rows.append({"target": name, "value": value, "op": op, "bound": bound, "ok": ok})
        shown = "not measured" if value is None else fmt(value, ".3f" if unit == "x" else ".1f") + unit
        print(f"  {verdict(ok):4s}  {name}: {shown} (target {op} {bound:g}{unit})", flush=True)


def main() -> None:
    """Print `environment()` as JSON: the record scripts/gpu/*.sh keep beside their results."""
    ap = argparse.ArgumentParser(description=main.__doc__)
    ap.add_argument("--for", dest="command", default=None, metavar="CMD",
                    help="the command line the record describes (default: this one)")
    print(json.dumps(environment(ap.parse_args().command), indent=1))


if __name__ == "__main__":
    main()
