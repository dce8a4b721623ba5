"""Generation throughput: rlgen vs raw batched /generate vs one request per prompt vs sglang.Engine.

Not a test. Starts ONE SGLang server with `rlgen.Engine(model, backend="sglang", progress=False)`
(rlgen's defaults) and then, in this process, `sglang.Engine` (same model and the server's flags, a KV
pool of the same share of the GPU), so that both are up at once. Then, for each workload:

    raw-1req       every prompt in ONE batched POST /generate to rlgen's server (aiohttp, orjson)
    raw-chunked    batched requests of 256 prompts, all in flight at once, same server
    rlgen          eng.generate(...) then res.df and res.tensors() (the whole user-visible cost)
    raw-chunked-n  raw-chunked with SGLang's own `n` in each request instead of n copies of each
                   prompt (rlgen's request until 2026-11-30: SGLang then prefills a batch's
                   prompts one at a time before it samples); the same as raw-chunked when n=1
    per-request    one POST per prompt (its n samples in it), all concurrent (AReaL's pattern)
    sglang.Engine  llm.generate(input_ids=..., ...) in-process, on its own scheduler

Every method sends identical input_ids and the sampling flags rlgen sends (logprobs on: rlgen's
default). Methods are warmed up once (on the first 64 prompts), then interleaved: each repeat
runs every method once, in a shuffled order, after a prefix-cache flush of both servers. Running
sglang.Engine beside the server, interleaved, matters on a shared machine: its speed drifts by
tens of percent within minutes (seen on the H200, 2026-11-30), which a phase-after-phase
comparison would read as a difference between methods.

Workloads:
    a   256 prompts x 64 tokens -> 128 new, ignore_eos            (random token ids, fixed seed)
    b   1024 prompts x 64 tokens, n=4 -> 64 new, ignore_eos
    c   512 chat prompts from templates -> up to 128 new, natural stops, temperature 1
    a5  workload a with top-5 logprobs
    t5  (optional) 4096 prompts x 32 tokens -> 256 new with top-5 logprobs, raw-chunked and
        rlgen only: the batch of the client-overhead target (4096 samples x 256 tokens, top-5) made on
        the GPU, so that rlgen's time outside the server is read against the server's own time
    a0  (optional) workload a with logprobs off, for every method

With --profile-s S (and py-spy on PATH), a last phase samples, for S seconds each, the server's
processes (`py-spy record --subprocesses`) while raw-1req repeats workload a, this process alone
while rlgen repeats it, then this process and its children while sglang.Engine repeats it: where
each spends its time. Stacks go next to
--out (<stem>-logs/profiles/); the top frames are printed.

Metric: generated tokens/s = sum(completion_tokens) / wall time of the call; medians of the
repeats (--repeats sets all). Every run also records the server's own time (the longest sample's
`e2e_latency`) and the rest, the time outside the server. Prints the medians, the ratios, and
the targets judged on 90% bootstrap intervals (PASS / FAIL, or NOISE where the interval straddles
the bound):

    rlgen >= 0.95x raw     rlgen against the raw methods that send its identical requests, pooled;
                           and, free of the server's spread, rlgen's extra time outside the server
    >= 2.5x per-request    on a
    >= 1x sglang.Engine    every workload

`--report-only JSON` prints the report again from a saved run (older runs lack the server times).

    python bench/throughput.py --out throughput.json                   # on the GPU machine
    python bench/throughput.py --out /tmp/t.json --backend cpu --quick # smoke test anywhere
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import subprocess
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import _common as C

# (prompts, prompt tokens, new tokens) per workload, full and --quick.
SIZES: dict[str, dict[str, Any]] = {
    "full": {"a": (256, 64, 128), "b": (1024, 64, 64), "b_n": 4, "c": (512, 128), "t5": (4096, 32, 256)},
    "quick": {"a": (4, 8, 4), "b": (4, 8, 4), "b_n": 2, "c": (4, 8), "t5": (8, 8, 4)},
}
HTTP_METHODS = ("raw-1req", "raw-chunked", "raw-chunked-n", "rlgen", "per-request")
OFFLINE = "sglang.Engine"
METHODS = (*HTTP_METHODS, OFFLINE)
WARMUP_PROMPTS = 64
# a's runs take about 1 s, a5's 3 s, c's 1-2 s, b's 10-20 s, t5's about 90 s (1M tokens)
REPEATS = {"a": 11, "a0": 5, "a5": 7, "b": 3, "c": 7, "t5": 1}
WORKLOAD_METHODS = {"t5": ("raw-chunked", "rlgen")}  # a workload not listed runs every method
ALL_WORKLOADS = ("a", "a0", "a5", "b", "c", "t5")


def build_workloads(names: list[str], model: str, quick: bool) -> list[C.Workload]:
    s = SIZES["quick" if quick else "full"]
    makers = {
        "a": lambda: C.token_workload("a", *s["a"], seed=1),
        "a0": lambda: C.token_workload("a0", *s["a"], logprobs=False, seed=1),
        "a5": lambda: C.token_workload("a5", *s["a"], top_logprobs=5, seed=1),
        "b": lambda: C.token_workload("b", *s["b"], n=s["b_n"], seed=2),
        "c": lambda: C.chat_workload("c", s["c"][0], s["c"][1], model, seed=3),
        "t5": lambda: C.token_workload("t5", *s["t5"], top_logprobs=5, seed=4),
    }
    return [makers[name]() for name in names]


def start_offline_engine(model: str, server_argv: list[str]) -> tuple[object, dict[str, object]]:
    """`sglang.Engine` in this process, beside the running server: the server's flags (rlgen's
    defaults and the site's), and a KV pool like the server's.

    SGLang sizes its pool so that (1 - mem_fraction_static) of the GPU stays free, counting other
    processes' memory as used: beside a server holding share s, the same pool needs s + default.
    """
    import sglang

    from rlgen.server._command import DEFAULT_GPU_MEMORY_FRACTION

    used, total = C.gpu_used_mib(), C.gpu_total_mib()
    held = used / total if used is not None and total else 0.0
    fraction = round(min(0.95, held + DEFAULT_GPU_MEMORY_FRACTION), 3)
    kwargs = {**C.flags_as_kwargs(C.server_flags(server_argv)), "model_path": model,
              "mem_fraction_static": fraction, "log_level": "error"}
    C.log(f"starting sglang.Engine({kwargs}) beside the server (GPU {held:.1%} held before it) ...")
    asyncio.set_event_loop(asyncio.new_event_loop())  # it runs on the main thread's loop
    t0 = time.monotonic()
    llm = sglang.Engine(**kwargs)
    info: dict[str, object] = {"start_s": time.monotonic() - t0, "kwargs": kwargs, "gpu_held_before": held}
    try:
        info["max_total_num_tokens"] = llm.get_server_info().get("max_total_num_tokens")
    except Exception as err:  # informative only
        info["max_total_num_tokens"] = f"unknown ({type(err).__name__})"
    # rlgen freezes the GC of the server it launches (server/_process): this side gets the same
    try:
        llm.freeze_gc()
        info["gc_frozen"] = True
    except Exception as err:  # an SGLang without it: recorded, and the comparison says so
        info["gc_frozen"] = f"no ({type(err).__name__}: {err})"
    C.log(f"sglang.Engine ready in {info['start_s']:.1f} s (KV pool {info['max_total_num_tokens']} tokens; "
          f"GC frozen: {info['gc_frozen']})")
    return llm, info


def offline_generate(llm: object) -> Callable[[C.Workload], C.Served]:
    def generate(wl: C.Workload) -> C.Served:
        body = wl.payload(wl.prompts)
        out = llm.generate(input_ids=body["input_ids"], sampling_params=body["sampling_params"],  # type: ignore[attr-defined]
                           return_logprob=wl.logprobs or bool(wl.top_logprobs), top_logprobs_num=wl.top_logprobs)
        out = out if isinstance(out, list) else [out]
        if len(out) != wl.n_samples:
            raise RuntimeError(f"sglang.Engine answered {len(out)} samples for {wl.n_samples}")
        return C.served(out)

    return generate


def measure(args: argparse.Namespace, model: str, workloads: list[C.Workload], record: C.Record) -> None:
    """rlgen's server, then sglang.Engine beside it; every method on every workload, interleaved."""
    import rlgen

    C.log(f"starting rlgen.Engine({model!r}, backend={args.backend!r}) ...")
    t0 = time.monotonic()
    eng = rlgen.Engine(model, backend=args.backend, progress=False, log_dir=C.logs_dir(args.out, "server"))
    llm = None
    try:
        server_info = eng.server_info
        record["server"] = {"start_s": time.monotonic() - t0, "url": eng.url, "argv": eng.info["command"],
                            "log_path": eng.log_path, "gpu_memory_mib": eng.info.get("gpu_memory_mib"),
                            "max_total_num_tokens": server_info.get("max_total_num_tokens")}
        C.log(f"server ready in {record['server']['start_s']:.1f} s at {eng.url} "
              f"(KV pool {record['server']['max_total_num_tokens']} tokens)")
        if args.backend == "cpu" or args.skip_offline:
            record["offline_skipped"] = "--backend cpu (needs SGLang on a GPU)" if args.backend == "cpu" else "--skip-offline"
            C.log(f"sglang.Engine SKIPPED: {record['offline_skipped']}")
        else:
            try:
                llm, record["offline_engine"] = start_offline_engine(model, eng.info["command"])
            except Exception as err:  # the HTTP methods still run
                record["offline_error"] = f"{type(err).__name__}: {err}"
                C.log(f"sglang.Engine FAILED to start: {record['offline_error']}")
        record.save()

        def flush_all() -> None:
            C.flush_cache(eng.url)
            if llm is not None:
                llm.flush_cache()  # type: ignore[attr-defined]

        with C.RawClient(eng.url) as raw:
            # Importing sglang installs uvloop's loop policy, so the raw client's loop (made after
            # it) is uvloop and rlgen's (made before) asyncio's; against a server that waits 0.55 s
            # and answers 256 x 128 tokens the two raw loops took 562 and 564 ms (CPU machine).
            from rlgen.core import _loop

            record["event_loops"] = {"raw": type(raw._loop).__name__, "rlgen": type(_loop.get_loop()).__name__}
            methods = {**raw.methods(), "rlgen": lambda wl: C.rlgen_generate(eng, wl)}
            if llm is not None:
                methods[OFFLINE] = offline_generate(llm)
            methods = {name: methods[name] for name in METHODS if name in methods}
            def keep(name: str) -> Callable[[dict[str, Any]], None]:
                def save(partial: dict[str, Any]) -> None:  # after every run: a cut-off call keeps its runs
                    record["results"][name] = partial
                    record.save()
                return save

            for wl in workloads:
                C.log(f"workload {wl.name}: {wl.describe}")
                repeats = args.repeats or (min(2, REPEATS[wl.name]) if args.quick else REPEATS[wl.name])
                chosen = {k: v for k, v in methods.items() if k in WORKLOAD_METHODS.get(wl.name, METHODS)}
                record["results"][wl.name] = C.run_interleaved(
                    chosen, wl, repeats=repeats, warmup=wl.head(WARMUP_PROMPTS), before_each=flush_all,
                    after_each=keep(wl.name),
                    label=f"{wl.name}/")
                record.save()
            if args.profile_s > 0:
                wl = workloads[0]
                targets = {"http-server": (eng.info["pid"], True, lambda: methods["raw-1req"](wl)),
                           # this process alone (not sglang.Engine's children): where rlgen's client time goes
                           "rlgen-client": (os.getpid(), False, lambda: methods["rlgen"](wl))}
                if OFFLINE in methods:
                    targets["sglang-engine"] = (os.getpid(), True, lambda: methods[OFFLINE](wl))
                record["profile"] = profile_phase(targets, args.profile_s, C.logs_dir(args.out, "profiles"))
                record.save()
    finally:
        # rlgen's server first: sglang.Engine.shutdown() kills every child process of this
        # process (kill_process_tree(os.getpid())), rlgen's server included.
        C.log("closing the server")
        eng.close()
        if llm is not None:
            C.log("shutting sglang.Engine down")
            llm.shutdown()  # type: ignore[attr-defined]


def profile_phase(targets: dict[str, tuple[int, bool, Callable[[], Any]]], seconds: float,
                  out_dir: Path) -> dict[str, Any]:
    """py-spy on each target's pid (and its children, if asked) for `seconds` while `work()` repeats."""
    out: dict[str, Any] = {}
    if shutil.which("py-spy") is None:
        return {"skipped": "py-spy not on PATH"}
    out_dir.mkdir(parents=True, exist_ok=True)
    for name, (pid, children, work) in targets.items():
        path = out_dir / f"{name}.txt"
        spy = subprocess.Popen(["py-spy", "record", "-p", str(pid), *(["--subprocesses"] if children else []),
                                "--rate", "100", "--format", "raw",
                                "--duration", str(int(seconds)), "--nonblocking", "-o", str(path)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        C.log(f"profiling {name} (pid {pid}) for {seconds:.0f} s ...")
        runs, t_end = 0, time.monotonic() + seconds
        try:
            while time.monotonic() < t_end and spy.poll() is None:
                work()
                runs += 1
        finally:
            try:
                _, err = spy.communicate(timeout=seconds + 60)
            except subprocess.TimeoutExpired:
                spy.kill()
                _, err = spy.communicate()
        out[name] = {"pid": pid, "runs": runs, "rc": spy.returncode, "stderr": (err or "")[-500:], "file": str(path),
                     **(summarise_stacks(path) if path.exists() else {})}
    return out


def summarise_stacks(path: Path, top: int = 12) -> dict[str, Any]:
    """Samples per process, the leaf frames and the functions (inclusive: on the stack) that hold
    the most samples, from py-spy's raw format (`process ...;frame;...;leaf count` with
    --subprocesses, `frame;...;leaf count` without)."""
    per_process: Counter[str] = Counter()
    leaves: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    total = 0
    for line in path.read_text(errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = stack.split(";")
        if not frames[0].startswith("process "):  # recorded without --subprocesses: one process
            frames.insert(0, "process (the one profiled)")
        total += int(count)
        per_process[frames[0][:80]] += int(count)
        leaves[frames[-1][:120]] += int(count)
        process = frames[0].split(":")[0]
        for frame in set(frames[1:]):
            inclusive[f"{process}: {frame[:110]}"] += int(count)
    return {"samples": total, "per_process": per_process.most_common(8), "top_leaf_frames": leaves.most_common(top),
            "top_inclusive": inclusive.most_common(2 * top)}


def identical_raw(summary: dict[str, Any]) -> list[str]:
    """The raw methods that send exactly rlgen's requests for this workload (rlgen's chunks of 256
    prompts, n copies of each): raw-chunked; also raw-chunked-n at n=1 and raw-1req when the
    workload is a single chunk. Their runs are pooled: one estimate of the same thing."""
    same = ["raw-chunked"]
    if summary.get("n", 1) == 1:
        same.append("raw-chunked-n")
    if summary.get("prompts", 0) <= C.CHUNK_SIZE:
        same.append("raw-1req")
    return same


def report(record: C.Record) -> None:
    if "results" not in record.data and "http" in record.data:
        # The first saved run (docs/gpu/2026-11-30b) kept the HTTP methods under "http" and
        # sglang.Engine, run minutes later and not interleaved, under "offline": the latter is no
        # comparison of methods and is left out.
        print("  a run from before the methods were interleaved with sglang.Engine: HTTP methods only", flush=True)
        record["results"] = record["http"]
    results: dict[str, dict[str, Any]] = record["results"]
    summaries: dict[str, dict[str, Any]] = record["workloads"]
    names = [name for name in summaries if name in results]
    if not names:
        print("nothing was measured", flush=True)
        return

    def med(name: str, method: str) -> float | None:  # from the runs: a run cut short has no medians yet
        return C.median_or_none(C.runs_of(results[name], [method], "tok_s"))

    methods = list(METHODS)
    speed_rows, ratio_rows, ratios = [], [], {}
    for name in names:
        m = {method: med(name, method) for method in methods}
        best_raw = max((v for v in (m["raw-1req"], m["raw-chunked"], m["raw-chunked-n"]) if v), default=None)
        ratios[name] = {
            "rlgen/raw-1req": C.ratio(m["rlgen"], m["raw-1req"]),
            "rlgen/raw-chunked": C.ratio(m["rlgen"], m["raw-chunked"]),
            "rlgen/best-raw": C.ratio(m["rlgen"], best_raw),
            "rlgen/per-request": C.ratio(m["rlgen"], m["per-request"]),
            "rlgen/sglang.Engine": C.ratio(m["rlgen"], m[OFFLINE]),
        }
        speed_rows.append([name, *(C.fmt(m[method]) for method in methods)])
        ratio_rows.append([name, *(C.fmt(v, ".3f") for v in ratios[name].values())])
    C.print_table("generated tokens/s, medians (all methods interleaved; sglang.Engine in-process beside the server)",
                  ["workload", *methods], speed_rows)
    C.print_table("ratios of the medians (best-raw: the fastest raw median, a maximum of noisy medians: "
                  "biased upwards)", ["workload", *ratios[names[0]]], ratio_rows)
    for name in names:
        print(f"  {name}: {summaries[name]['describe']}", flush=True)
    print("  every method sends the same input_ids and sampling flags, including return_logprob when rlgen's\n"
          "  default logprobs=True is on (add workload a0 for workload a without logprobs); with n > 1,\n"
          "  raw-chunked-n, per-request and nothing else use SGLang's own n", flush=True)

    time_rows = []
    for name in names:
        for method in methods:
            runs = (results[name].get(method) or {}).get("runs") or []
            if any(r.get("server_s") is not None for r in runs):
                time_rows.append([name, method, str(len(runs)), *(C.fmt(C.median_or_none([r.get(k) for r in runs]), ".3f")
                                                         for k in ("seconds", "server_s", "outside_s"))])
    if time_rows:
        C.print_table("where a call's time goes, medians in s (server: the longest sample's e2e_latency; outside: "
                      "the rest - request, transport, the answer's JSON, the client's work)",
                      ["workload", "method", "runs", "wall", "server", "outside"], time_rows)

    comparisons: dict[str, dict[str, Any]] = {}
    cmp_rows = []
    for name in names:
        per = results[name]
        pairs = {"identical raw": identical_raw(summaries[name]), "per-request": ["per-request"], OFFLINE: [OFFLINE]}
        comparisons[name] = {}
        for label, theirs in pairs.items():
            if not C.runs_of(per, ["rlgen"], "tok_s") or not C.runs_of(per, theirs, "tok_s"):
                continue
            c = comparisons[name][label] = C.compare(per, "rlgen", theirs)
            lo_hi = c["interval"]
            cmp_rows.append([name, f"rlgen / {label}", f"{c['runs'][0]} vs {c['runs'][1]}", C.fmt(c["ratio"], ".3f"),
                             f"{lo_hi[0]:.3f}-{lo_hi[1]:.3f}" if lo_hi else "-", C.fmt(c["p"], ".3f"),
                             C.fmt(1e3 * c["extra_outside_s"] if "extra_outside_s" in c else None, ".1f"),
                             C.fmt(c.get("server_p"), ".3f"), C.fmt(c.get("ratio_from_outside"), ".3f")])
    C.print_table("rlgen against ... (tokens/s; interval: 90% bootstrap of the ratio of medians; p: two-sided rank "
                  "test; extra ms: rlgen's median time outside the server minus theirs; server p: rank test of the "
                  "server times; from outside: the ratio if both had the same server time)",
                  ["workload", "comparison", "runs", "ratio", "interval", "p", "extra ms", "server p", "from outside"],
                  cmp_rows)
    for name in names:
        print(f"  identical raw for {name}: {', '.join(identical_raw(summaries[name]))} (pooled)", flush=True)
    errors = {f"{wl}/{method}": res["error"] for wl, per in results.items()
              for method, res in per.items() if res.get("error")}
    for where, err in errors.items():
        print(f"  ERROR {where}: {err}", flush=True)
    record["ratios"] = ratios
    record["comparisons"] = comparisons
    print_profile(record.data.get("profile") or {})

    print("\ntargets", flush=True)
    targets = C.Targets()
    for name in names:
        same = comparisons[name].get("identical raw")
        if same is None:
            continue
        targets.check_interval(f"{name}: rlgen / identical raw requests", same["ratio"], same["interval"], 0.95)
        if same.get("ratio_from_outside") is not None:
            targets.check(f"{name}: rlgen / identical raw, from the time outside the server",
                          same["ratio_from_outside"], ">=", 0.95, "x")
    per_request = comparisons.get("a", {}).get("per-request")
    if per_request is not None:
        targets.check_interval("a: rlgen / per-request", per_request["ratio"], per_request["interval"], 2.5)
    for name in names:
        offline = comparisons[name].get(OFFLINE)
        if offline is not None:
            targets.check_interval(f"{name}: rlgen / sglang.Engine", offline["ratio"], offline["interval"], 1.0)
    if "t5" in results:
        runs = results["t5"].get("rlgen", {}).get("runs") or []
        share = C.median_or_none([100 * r["outside_s"] / r["server_s"] for r in runs if r.get("server_s")])
        targets.check("t5: rlgen's time outside the server, % of the server's time (bounds the client overhead)",
                      share, "<=", 5.0, "%")
    record["targets"] = targets.rows


def print_profile(profiles: dict[str, Any]) -> None:
    for name, prof in profiles.items():
        if not isinstance(prof, dict):
            print(f"  profile: {name}: {prof}", flush=True)
            continue
        print(f"\nprofile {name}: {prof.get('runs')} runs, {prof.get('samples')} samples, py-spy rc {prof.get('rc')}"
              f"{' ' + prof['stderr'].strip()[-200:] if prof.get('rc') else ''}", flush=True)
        for proc, n in prof.get("per_process", []):
            print(f"    {n:7d}  {proc}", flush=True)
        print("    leaf frames:", flush=True)
        for frame, n in prof.get("top_leaf_frames", []):
            print(f"    {n:7d}  {frame}", flush=True)
        print("    on the stack (inclusive):", flush=True)
        for frame, n in prof.get("top_inclusive", []):
            print(f"    {n:7d}  {frame}", flush=True)


def main() -> None:
    ap = C.base_parser(__doc__)
    ap.add_argument("--workloads", default="a,b,c",  # ~8.5 min on the H200: one 10-minute device call
                    help=f"comma-separated subset of {','.join(ALL_WORKLOADS)} (default a,b,c, the issue's three)")
    ap.add_argument("--skip-offline", action="store_true", help="skip sglang.Engine")
    ap.add_argument("--profile-s", type=float, default=0.0,
                    help="after the timings, py-spy each side for this many seconds on the first workload (0: off)")
    C.add_report_only(ap)
    args = ap.parse_args()
    if C.reported_again(args, report):
        return
    names = C.subset(ap, "--workloads", args.workloads, ALL_WORKLOADS)

    C.site_flags()  # before any launch: rlgen's Engine reads $RLGEN_SGLANG_ARGS itself
    model = C.model_path(args.model)
    record = C.Record(args.out, args, "bench/throughput.py")
    workloads = build_workloads(names, model, args.quick)
    record.data.update(model=model, workloads={wl.name: wl.summary() for wl in workloads}, results={})
    record.save()
    C.measure_and_report(record, lambda: measure(args, model, workloads, record), report)


if __name__ == "__main__":  # required: sglang.Engine spawns workers that re-import __main__
    main()
