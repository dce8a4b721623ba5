"""Where batching pays: rlgen throughput vs batch size, next to raw batched /generate, plus the client's cost.

Not a test. Two parts:

1. GPU: one SGLang server started by `rlgen.Engine(model, backend="sglang", progress=False)`. For
   each batch size (1, 8, 64, 256, 1024, 4096 prompts; 64 random prompt tokens -> 128 new tokens,
   ignore_eos, logprobs on as rlgen's default), on that server:

       raw     every prompt in ONE POST /generate (aiohttp + orjson; same flags as rlgen)
       rlgen   eng.generate(...) then res.df and res.tensors()

   warmed up once (on up to 64 prompts), then interleaved in a shuffled order, a prefix-cache flush
   before each run, median of 3 (fewer for a size whose runs would not fit in --budget-s, judged
   from the tokens/s of the size before: the repeats used are recorded and printed). Each run
   also records the server's own time (the longest sample's e2e_latency), so the report splits
   every call at the server: what rlgen adds outside it, measured on real answers.

2. CPU only: the client-side cost of a result of each size, from synthetic /generate bodies
   (bench/client_overhead.py's `make_body`: SGLang's shape, per-token logprobs, 128 tokens per
   sample, a quarter stopping early): orjson parse + Rollouts + DataFrame + tensors, median of 3,
   in ms and microseconds per token, and as a share of rlgen's measured wall time for that size.

The report judges rlgen / raw at each size on its 90% bootstrap interval against 0.95 (PASS /
FAIL, or NOISE where the interval straddles it; no verdict from fewer than 3 runs a side).
`--report-only JSON` prints the report of a saved run again.

    python bench/scaling.py --out scaling.json                       # on the GPU machine
    python bench/scaling.py --out /tmp/sc.json --backend cpu --quick  # smoke test anywhere
    python bench/scaling.py --out /tmp/sc.json --client-only          # part 2 alone (CPU)
    python bench/scaling.py --out /tmp/sc.json --report-only docs/gpu/2026-11-30d/scaling.json
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Any

import _common as C
from client_overhead import make_body, run_variant

SIZES = {"full": ((1, 8, 64, 256, 1024, 4096), 64, 128), "quick": ((1, 2, 4), 8, 4)}
METHODS = ("raw", "rlgen")
CLIENT_REPEATS = 3


def fit_repeats(wanted: int, tokens: int, tok_s: float | None, remaining_s: float) -> int:
    """Repeats of both methods that fit in `remaining_s`, if each run makes `tokens` at `tok_s`."""
    if not tok_s:
        return wanted
    per_repeat = len(METHODS) * tokens / tok_s
    return max(1, min(wanted, int(remaining_s // per_repeat)))


def gpu_curve(args: argparse.Namespace, model: str, record: C.Record) -> None:
    import rlgen

    sizes, prompt_len, new_tokens = SIZES["quick" if args.quick else "full"]
    C.log(f"starting rlgen.Engine({model!r}, backend={args.backend!r}) ...")
    t0 = time.monotonic()
    eng = rlgen.Engine(model, backend=args.backend, progress=False, log_dir=C.logs_dir(args.out, "server"))
    try:
        record["server"] = {"start_s": time.monotonic() - t0, "argv": eng.info["command"], "log_path": eng.log_path}
        C.log(f"server ready in {record['server']['start_s']:.1f} s")
        deadline = time.monotonic() + args.budget_s
        last_tok_s: float | None = None
        with C.RawClient(eng.url) as raw:
            methods = {"raw": raw.one_request, "rlgen": lambda wl: C.rlgen_generate(eng, wl)}
            for size in sizes:
                wl = C.token_workload(f"batch{size}", size, prompt_len, new_tokens, seed=size)
                repeats = fit_repeats(C.repeats_of(args), size * new_tokens, last_tok_s, deadline - time.monotonic())
                C.log(f"batch {size}: {wl.describe}; {repeats} repeats")
                result = C.run_interleaved(methods, wl, repeats=repeats, warmup=wl.head(64),
                                           before_each=lambda: C.flush_cache(eng.url), label=f"batch{size}/")
                record["gpu"][str(size)] = {"workload": wl.summary(), "repeats": repeats, "methods": result}
                record.save()
                last_tok_s = C.median_or_none([m["median_tok_s"] for m in result.values()]) or last_tok_s
    finally:
        C.log("closing the server")
        eng.close()


def client_curve(args: argparse.Namespace, record: C.Record) -> None:
    """Parse + Rollouts + DataFrame + tensors for synthetic bodies of each size (CPU only)."""
    sizes, _, new_tokens = SIZES["quick" if args.quick else "full"]
    run_variant(*make_body(4, 8, 1, 0), 1, True)  # imports pandas/torch outside the timings
    for size in sizes:
        body, prompts = make_body(size, new_tokens, 1, 0, seed=size)
        runs = [run_variant(body, prompts, 1, True) for _ in range(CLIENT_REPEATS)]
        parts = {k: statistics.median(r[k] for r in runs) for k in ("parse", "build", "tensors", "free")}
        total, tokens = sum(parts.values()), runs[0]["tokens"]
        record["client"][str(size)] = {"body_mb": len(body) / 1e6, "tokens": tokens, "runs": runs,
                                       "median_s": parts, "total_s": total, "us_per_token": 1e6 * total / tokens}
        C.log(f"client cost, {size} samples: {1e3 * total:.1f} ms ({1e6 * total / tokens:.2f} us/token)")
    record.save()


def report(record: C.Record) -> None:
    rows = []
    for size, entry in record["gpu"].items():
        m = entry["methods"]
        raw, ours = m["raw"]["median_tok_s"], m["rlgen"]["median_tok_s"]
        client = record["client"].get(size, {})
        share = C.ratio(client.get("total_s"), m["rlgen"]["median_s"])
        rows.append([size, entry["workload"]["samples"], C.fmt(raw), C.fmt(ours), C.fmt(C.ratio(ours, raw), ".3f"),
                     C.fmt(m["rlgen"]["median_s"], ".3f"), C.fmt(1e3 * client["total_s"] if client else None, ".1f"),
                     C.fmt(100 * share if share is not None else None, ".1f"), entry["repeats"],
                     "; ".join(f"{k}: {v['error']}" for k, v in m.items() if v["error"])])
    C.print_table("generated tokens/s vs batch size, medians (raw and rlgen interleaved on one server)",
                  ["batch", "samples", "raw tok/s", "rlgen tok/s", "rlgen/raw", "rlgen s", "client ms",
                   "client % of rlgen", "repeats", "error"], rows)
    comparisons: dict[str, dict[str, Any]] = {}
    targets = C.Targets()
    for size, entry in record["gpu"].items():
        if C.runs_of(entry["methods"], ["rlgen"], "tok_s") and C.runs_of(entry["methods"], ["raw"], "tok_s"):
            comparisons[size] = C.compare(entry["methods"], "rlgen", ["raw"])
    if comparisons:
        C.print_table("rlgen / raw per batch size (tokens/s; interval: 90% bootstrap of the ratio of medians, none from "
                      "fewer than 3 runs a side; p: two-sided rank test)", ["batch", "runs", "ratio", "interval", "p"],
                      [[size, f"{c['runs'][0]} vs {c['runs'][1]}", C.fmt(c["ratio"], ".3f"),
                        f"{c['interval'][0]:.3f}-{c['interval'][1]:.3f}" if c["interval"] else "-", C.fmt(c["p"], ".3f")]
                       for size, c in comparisons.items()])
        print(f"  up to {C.CHUNK_SIZE} prompts rlgen sends the raw method's one request; above, chunks of "
              f"{C.CHUNK_SIZE} at once\n\ntargets", flush=True)
        for size, c in comparisons.items():
            targets.check_interval(f"{size} prompts: rlgen / one raw batched request", c["ratio"], c["interval"], 0.95)
    record["comparisons"] = comparisons
    record["targets"] = targets.rows
    outside_rows = []
    for size, entry in record["gpu"].items():
        c = C.compare(entry["methods"], "rlgen", ["raw"])
        if "server_s" not in c:
            continue  # a run from before the server's time was recorded
        columns = (c["server_s"][1], c["server_s"][0], c["outside_s"][1], c["outside_s"][0], c["extra_outside_s"])
        outside_rows.append([size, *(C.fmt(None if v is None else 1e3 * v, ".1f") for v in columns)])
    if outside_rows:
        C.print_table("the same runs split at the server (medians, ms; server: the longest sample's e2e_latency; "
                      "outside: the rest of the call - request, transport, the answer's JSON, the client's work)",
                      ["batch", "raw server", "rlgen server", "raw outside", "rlgen outside", "rlgen extra"],
                      outside_rows)
    C.print_table(f"client-side cost of one result (synthetic bodies, CPU only; median of {CLIENT_REPEATS})",
                  ["samples", "tokens", "body MB", "parse ms", "build+df ms", "tensors ms", "free ms", "total ms", "us/token"],
                  [[size, int(c["tokens"]), C.fmt(c["body_mb"], ".1f"),
                    *(C.fmt(1e3 * c["median_s"][k], ".1f") for k in ("parse", "build", "tensors", "free")),
                    C.fmt(1e3 * c["total_s"], ".1f"), C.fmt(c["us_per_token"], ".2f")]
                   for size, c in record["client"].items()])


def main() -> None:
    ap = C.base_parser(__doc__)
    ap.add_argument("--budget-s", type=float, default=300.0,
                    help="seconds for the GPU timing loop; a size whose repeats would not fit gets fewer (default 300)")
    ap.add_argument("--skip-client", action="store_true", help="skip the CPU-only client-cost curve")
    ap.add_argument("--client-only", action="store_true", help="only the client-cost curve (no server)")
    C.add_report_only(ap)
    args = ap.parse_args()
    if C.reported_again(args, report):
        return

    C.site_flags()  # before any launch: rlgen's Engine reads $RLGEN_SGLANG_ARGS itself
    model = C.model_path(args.model)
    record = C.Record(args.out, args, "bench/scaling.py")
    record.data.update(model=model, gpu={}, client={})
    record.save()
    try:
        if not args.client_only:
            gpu_curve(args, model, record)
    except Exception as err:  # the client curve and the report still run
        record["gpu_error"] = f"{type(err).__name__}: {err}"
        C.log(f"GPU part FAILED: {record['gpu_error']}")
    record.save()
    if not args.skip_client:
        client_curve(args, record)
    report(record)
    record.save(complete=True)
    C.log(f"wrote {os.path.abspath(args.out)}")


if __name__ == "__main__":
    main()
