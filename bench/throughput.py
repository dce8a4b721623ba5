"""Generation throughput: rlgen vs raw batched /generate vs one request per prompt vs sglang.Engine.

Not a test. Phase 1 starts ONE SGLang server with `rlgen.Engine(model, backend="sglang",
progress=False)` (rlgen's defaults) and times, on that same server, for each workload:

    raw-1req      every prompt in ONE batched POST /generate (aiohttp, orjson, nothing else)
    raw-chunked   batched requests of 256 prompts, all in flight at once
    rlgen         eng.generate(...) then res.df and res.tensors() (the whole user-visible cost)
    per-request   one POST per prompt (its n samples in it), all concurrent (AReaL's pattern)

Every method sends identical input_ids and the sampling flags rlgen sends (logprobs on: rlgen's
default). Methods are warmed up once (on the first 64 prompts), then interleaved: each of the
repeats runs every method once, in a rotated order, after a prefix-cache flush. Phase 2, after
eng.close(): `sglang.Engine` in-process (same model, site flags and mem_fraction_static as rlgen's
default gpu_memory_fraction), `llm.generate(input_ids=..., ...)` on the same workloads.

Workloads:
    a   256 prompts x 64 tokens -> 128 new, ignore_eos            (random token ids, fixed seed)
    b   1024 prompts x 64 tokens, n=4 -> 64 new, ignore_eos
    c   512 chat prompts from templates -> up to 128 new, natural stops, temperature 1
    a0  (optional) workload a with logprobs off, for every method

Metric: generated tokens/s = sum(completion_tokens) / wall time of the call; medians of the
repeats. Prints a table of medians and the ratios rlgen/raw, rlgen/per-request,
rlgen/sglang.Engine with the targets (rlgen >= 0.95x raw everywhere, >= 2.5x per-request on a,
not slower than sglang.Engine); writes every run to --out.

    python bench/throughput.py --out throughput.json                   # on the GPU machine
    python bench/throughput.py --out /tmp/t.json --backend cpu --quick # smoke test anywhere
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time

import _common as C

# (prompts, prompt tokens, new tokens) per workload, full and --quick.
SIZES = {
    "full": {"a": (256, 64, 128), "b": (1024, 64, 64), "b_n": 4, "c": (512, 128)},
    "quick": {"a": (4, 8, 4), "b": (4, 8, 4), "b_n": 2, "c": (4, 8)},
}
HTTP_METHODS = ("raw-1req", "raw-chunked", "rlgen", "per-request")
OFFLINE = "sglang.Engine"
WARMUP_PROMPTS = 64


def build_workloads(names: list[str], model: str, quick: bool) -> list[C.Workload]:
    s = SIZES["quick" if quick else "full"]
    makers = {
        "a": lambda: C.token_workload("a", *s["a"], seed=1),
        "a0": lambda: C.token_workload("a0", *s["a"], logprobs=False, seed=1),
        "b": lambda: C.token_workload("b", *s["b"], n=s["b_n"], seed=2),
        "c": lambda: C.chat_workload("c", *s["c"], model, seed=3),
    }
    return [makers[name]() for name in names]


def http_phase(args: argparse.Namespace, model: str, workloads: list[C.Workload], record: C.Record) -> None:
    """Phase 1: one rlgen-launched server; every HTTP method on every workload, interleaved."""
    import rlgen

    C.log(f"phase 1: starting rlgen.Engine({model!r}, backend={args.backend!r}) ...")
    t0 = time.monotonic()
    eng = rlgen.Engine(model, backend=args.backend, progress=False, log_dir=C.logs_dir(args.out, "server"))
    try:
        record["server"] = {"start_s": time.monotonic() - t0, "url": eng.url, "argv": eng._server.argv,
                            "log_path": eng.log_path, "gpu_memory_mib": eng.info.get("gpu_memory_mib")}
        C.log(f"server ready in {record['server']['start_s']:.1f} s at {eng.url}")
        with C.RawClient(eng.url) as raw:
            methods = {**raw.methods(), "rlgen": lambda wl: C.rlgen_generate(eng, wl)}
            methods = {name: methods[name] for name in HTTP_METHODS}
            for wl in workloads:
                C.log(f"workload {wl.name}: {wl.describe}")
                record["http"][wl.name] = C.run_interleaved(
                    methods, wl, repeats=C.repeats_of(args), warmup=wl.head(WARMUP_PROMPTS),
                    before_each=lambda: C.flush_cache(eng.url), label=f"{wl.name}/")
                record.save()
    finally:
        C.log("closing the server")
        eng.close()


def offline_phase(args: argparse.Namespace, model: str, workloads: list[C.Workload], record: C.Record) -> None:
    """Phase 2: sglang.Engine in this process, same workloads, after the HTTP server is gone."""
    import sglang
    from rlgen._launch import DEFAULT_GPU_MEMORY_FRACTION

    kwargs = {"model_path": model, "mem_fraction_static": DEFAULT_GPU_MEMORY_FRACTION, "log_level": "error",
              **C.site_kwargs()}
    C.log(f"phase 2: starting sglang.Engine({kwargs}) ...")
    asyncio.set_event_loop(asyncio.new_event_loop())  # it runs on the main thread's loop
    t0 = time.monotonic()
    llm = sglang.Engine(**kwargs)
    record["offline_engine"] = {"start_s": time.monotonic() - t0, "kwargs": kwargs}
    C.log(f"sglang.Engine ready in {record['offline_engine']['start_s']:.1f} s")

    def flush() -> None:
        llm.flush_cache()  # as the HTTP phase flushes before every run

    def generate(wl: C.Workload) -> int:
        body = wl.payload(wl.prompts)
        out = llm.generate(input_ids=body["input_ids"], sampling_params=body["sampling_params"],
                           return_logprob=wl.logprobs)
        out = out if isinstance(out, list) else [out]
        if len(out) != wl.n_samples:
            raise RuntimeError(f"sglang.Engine answered {len(out)} samples for {wl.n_samples}")
        return C.completion_tokens(out)

    try:
        for wl in workloads:
            C.log(f"workload {wl.name} on {OFFLINE}")
            record["offline"][wl.name] = C.run_interleaved(
                {OFFLINE: generate}, wl, repeats=C.repeats_of(args), warmup=wl.head(WARMUP_PROMPTS),
                before_each=flush, label=f"{wl.name}/")
            record.save()
    finally:
        C.log("shutting sglang.Engine down")
        llm.shutdown()


def report(workloads: list[C.Workload], record: C.Record) -> None:
    def med(wl: C.Workload, method: str) -> float | None:
        where = record["offline"] if method == OFFLINE else record["http"]
        return (where.get(wl.name, {}).get(method) or {}).get("median_tok_s")

    methods = [*HTTP_METHODS, OFFLINE]
    speed_rows, ratio_rows, ratios = [], [], {}
    for wl in workloads:
        m = {name: med(wl, name) for name in methods}
        best_raw = max((v for v in (m["raw-1req"], m["raw-chunked"]) if v), default=None)
        ratios[wl.name] = r = {
            "rlgen/raw-1req": C.ratio(m["rlgen"], m["raw-1req"]),
            "rlgen/raw-chunked": C.ratio(m["rlgen"], m["raw-chunked"]),
            "rlgen/best-raw": C.ratio(m["rlgen"], best_raw),
            "rlgen/per-request": C.ratio(m["rlgen"], m["per-request"]),
            "rlgen/sglang.Engine": C.ratio(m["rlgen"], m[OFFLINE]),
        }
        speed_rows.append([wl.name, *(C.fmt(m[name]) for name in methods)])
        ratio_rows.append([wl.name, *(C.fmt(v, ".3f") for v in r.values())])
    C.print_table("generated tokens/s, medians (HTTP methods interleaved on one server; sglang.Engine after it)",
                  ["workload", *methods], speed_rows)
    C.print_table("ratios of the medians", ["workload", *ratios[workloads[0].name]], ratio_rows)
    for wl in workloads:
        print(f"  {wl.name}: {wl.describe}", flush=True)
    print("  every method sends the same input_ids and sampling flags, including return_logprob when rlgen's\n"
          "  default logprobs=True is on (add workload a0 for workload a without logprobs)", flush=True)
    errors = {f"{wl}/{name}": res["error"] for part in ("http", "offline") for wl, per in record[part].items()
              for name, res in per.items() if res.get("error")}
    for where, err in errors.items():
        print(f"  ERROR {where}: {err}", flush=True)
    record["ratios"] = ratios

    print("\ntargets", flush=True)
    targets = C.Targets()
    for wl in workloads:
        targets.check(f"{wl.name}: rlgen / best raw", ratios[wl.name]["rlgen/best-raw"], ">=", 0.95, "x")
    if "a" in ratios:
        targets.check("a: rlgen / per-request", ratios["a"]["rlgen/per-request"], ">=", 2.5, "x")
    for wl in workloads:
        targets.check(f"{wl.name}: rlgen / sglang.Engine", ratios[wl.name]["rlgen/sglang.Engine"], ">=", 1.0, "x")
    record["targets"] = targets.rows


def main() -> None:
    ap = C.base_parser(__doc__)
    ap.add_argument("--workloads", default="a,b,c", help="comma-separated subset of a,a0,b,c (default a,b,c)")
    ap.add_argument("--skip-offline", action="store_true", help="skip the sglang.Engine phase")
    args = ap.parse_args()
    names = [w.strip() for w in args.workloads.split(",") if w.strip()]
    if not names or set(names) - {"a", "a0", "b", "c"}:
        ap.error("--workloads takes a comma-separated subset of a,a0,b,c")

    C.site_flags()  # before any launch: rlgen's Engine reads $RLGEN_SGLANG_ARGS itself
    model = C.model_path(args.model)
    record = C.Record(args.out, args, "bench/throughput.py")
    workloads = build_workloads(names, model, args.quick)
    record.data.update(model=model, workloads={wl.name: wl.summary() for wl in workloads}, http={}, offline={})
    record.save()
    try:
        http_phase(args, model, workloads, record)
    except Exception as err:  # noqa: BLE001 - still run phase 2 and report what there is
        record["http_error"] = f"{type(err).__name__}: {err}"
        C.log(f"phase 1 FAILED: {record['http_error']}")
    record.save()
    if args.backend == "cpu" or args.skip_offline:
        why = "--backend cpu (needs SGLang on a GPU)" if args.backend == "cpu" else "--skip-offline"
        record["offline_skipped"] = why
        C.log(f"phase 2 (sglang.Engine) SKIPPED: {why}")
    else:
        try:
            offline_phase(args, model, workloads, record)
        except Exception as err:  # noqa: BLE001
            record["offline_error"] = f"{type(err).__name__}: {err}"
            C.log(f"phase 2 FAILED: {record['offline_error']}")
    report(workloads, record)
    record.save(complete=True)
    C.log(f"wrote {os.path.abspath(args.out)}")


if __name__ == "__main__":  # required: sglang.Engine spawns workers that re-import __main__
    main()
