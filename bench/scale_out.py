"""Scale-out: rlgen's `Engine(replicas=2)` behind an sglang-router against one server (and against
SGLang's own `--dp-size 2` where there are two GPUs), on the same workload, side by side.

Not a test. Every configuration is started once and they all stay up together (small model: each
takes rlgen's default 20% of a GPU); then `C.run_interleaved` times one `eng.generate()` of the
workload on each, in a fresh shuffled order every repeat, after a prefix-cache flush of every
server involved. Configurations:

    one            Engine(model): one server on the first GPU of --gpus; rlgen batches prompts
                   (256 per /generate, several requests in flight)
    one-per-req    the same server, generate(chunk_size=1): one prompt per request, the way rlgen
                   must talk to a router; it separates the cost of the router's dialect from the
                   gain of a second server
    replicas       Engine(model, replicas=2, gpus=--gpus): two servers and an sglang-router
                   (--gpus 0: both servers on GPU 0)
    dp             Engine(model, dp_size=2): SGLang's data parallelism (needs two GPUs in --gpus)

Ratios against `one` are medians of tokens/s with 90% bootstrap intervals; the issue's target
(replicas >= 1.8x one server on two GPUs) is judged on its interval (PASS, FAIL, or NOISE). After
the runs, the router's Prometheus /metrics say how it spread the requests over its workers.

    python bench/scale_out.py --out scale_out.json --gpus 0            # one GPU: two servers on it
    python bench/scale_out.py --out scale_out.json --gpus 0,1          # two GPUs
    python bench/scale_out.py --out /tmp/s.json --backend cpu --quick  # smoke test anywhere
"""

from __future__ import annotations

import argparse
import contextlib
import re
import time
import urllib.request
from typing import Any

import _common as C

SIZES = {"full": (2048, 64, 128), "quick": (8, 8, 4)}
TARGET_TWO_GPUS = 1.8
REPEATS = 5


def parser() -> argparse.ArgumentParser:
    ap = C.base_parser(__doc__, repeats=REPEATS)
    C.add_report_only(ap)
    ap.add_argument("--gpus", default="0", help="GPU indices for the replicas (comma-separated; default 0)")
    ap.add_argument("--configs", default=None,
                    help="comma-separated subset of one,one-per-req,replicas,dp (default: all that fit --gpus)")
    return ap


def start(name: str, model: str, args: argparse.Namespace, gpus: list[int]) -> Any:
    import rlgen

    common: dict[str, Any] = {"backend": args.backend, "progress": False, "fast_start": True}
    on_gpus = args.backend == "sglang"
    if name == "one":
        return rlgen.Engine(model, env={"CUDA_VISIBLE_DEVICES": str(gpus[0])} if on_gpus else None, **common)
    if name == "replicas":
        return rlgen.Engine(model, replicas=2, gpus=gpus if on_gpus else None, **common)
    if name == "dp":
        visible = ",".join(map(str, sorted(set(gpus))))
        return rlgen.Engine(model, dp_size=2, env={"CUDA_VISIBLE_DEVICES": visible} if on_gpus else None, **common)
    raise ValueError(name)


def server_urls(eng: Any) -> list[str]:
    """The URLs whose prefix caches a run may use: the server, or every worker behind the router."""
    router = eng.info["router"]
    return [w["url"] for w in router["workers"]] if router else [eng.url]


def router_metrics(eng: Any) -> dict[str, Any]:
    """The router's Prometheus counters of requests per worker (whatever lines name a worker URL)."""
    port = eng.info["router"].get("prometheus_port")
    if not port:
        return {"error": "no prometheus port known"}
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    lines = [line for line in text.splitlines() if not line.startswith("#") and re.search(r'worker="[^"]+"', line)]
    return {"lines": lines[:200], "total_lines": len(text.splitlines())}


def main() -> None:
    ap = parser()
    args = ap.parse_args()
    if C.reported_again(args, report):
        return
    if args.backend == "sglang":
        C.site_flags()
    model = C.model_path(args.model)
    record = C.Record(args.out, args, "bench/scale_out.py")
    gpus = [int(g) for g in args.gpus.split(",") if g.strip()]
    allowed = ["one", "one-per-req", "replicas"] + (["dp"] if len(set(gpus)) >= 2 else [])
    names = C.subset(ap, "--configs", args.configs, allowed) if args.configs else allowed
    count, prompt_len, new_tokens = SIZES["quick" if args.quick else "full"]
    wl = C.token_workload("scale-out", count, prompt_len, new_tokens)
    record.data.update(model=model, gpus=gpus, configs=names, workload=wl.summary(),
                       gpu_used_mib_before=C.gpu_used_mib() if args.backend == "sglang" else None)
    C.raise_fd_limit()
    engines: dict[str, Any] = {}
    with contextlib.ExitStack() as stack:
        for name in [n for n in names if n != "one-per-req"]:
            t0 = time.monotonic()
            engines[name] = stack.enter_context(start(name, model, args, gpus))
            record.data.setdefault("start_s", {})[name] = time.monotonic() - t0
            record.data.setdefault("info", {})[name] = {k: engines[name].info.get(k) for k in
                                                   ("command", "gpu_memory_per_gpu", "memory_usage", "router")}
            C.log(f"{name} ready in {time.monotonic() - t0:.0f} s")
            record.save()
        if "one-per-req" in names:
            engines["one-per-req"] = engines.get("one") or stack.enter_context(start("one", model, args, gpus))
        urls = sorted({url for eng in engines.values() for url in server_urls(eng)})

        def flush_all() -> None:
            for url in urls:
                C.flush_cache(url)

        methods = {name: (lambda w, e=engines[name], extra=({"chunk_size": 1} if name == "one-per-req" else {}):
                          C.rlgen_generate(e, w, **extra)) for name in names}
        record["methods"] = C.run_interleaved(methods, wl, repeats=C.repeats_of(args), warmup=wl.head(64),
                                              before_each=flush_all,
                                              after_each=lambda partial: (record.__setitem__("methods", partial),
                                                                          record.save()))
        if "replicas" in engines:
            try:
                record["router_metrics"] = router_metrics(engines["replicas"])
            except Exception as err:  # the metrics are a note, not a result
                record["router_metrics"] = {"error": f"{type(err).__name__}: {err}"}
        record.save()
    if args.backend == "sglang":
        record["gpu_used_mib_after_close"] = C.gpu_used_mib()
    report(record)
    record.save(complete=True)


def report(record: C.Record) -> None:
    methods = record["methods"]
    wl = record["workload"]
    rows = []
    for name, m in methods.items():
        runs = [r["tok_s"] for r in m["runs"]]
        interval = C.bootstrap_median(runs)
        rows.append([name, str(len(runs)), C.fmt(m.get("median_tok_s")),
                     "-" if interval is None else f"{interval[0]:,.0f}-{interval[1]:,.0f}",
                     C.fmt(record.data.get("start_s", {}).get(name), ".0f"), m.get("error") or ""])
    C.print_table(f"{wl['describe']}; GPUs {record['gpus']} (tokens/s, medians, 90% bootstrap interval)",
                  ["config", "runs", "tok/s", "interval", "start s", "error"], rows)
    targets = C.Targets()
    two_gpus = len(set(record["gpus"])) >= 2
    print("\nRatios of tokens/s against one server (median ratio, 90% bootstrap interval):", flush=True)
    for name in methods:
        if name == "one" or "one" not in methods:
            continue
        cmp = C.compare(methods, name, ["one"])
        record.data.setdefault("ratios", {})[name] = cmp
        shown = "-" if cmp["ratio"] is None else f"{cmp['ratio']:.2f}x"
        interval = "" if cmp["interval"] is None else f" [{cmp['interval'][0]:.2f}-{cmp['interval'][1]:.2f}]"
        print(f"  {name} / one: {shown}{interval} (runs {cmp['runs'][0]} vs {cmp['runs'][1]})", flush=True)
        if name == "replicas" and two_gpus:
            targets.check_interval("replicas=2 on two GPUs vs one server", cmp["ratio"], cmp["interval"],
                                   TARGET_TWO_GPUS)
    if "replicas" in methods and "dp" in methods:
        cmp = C.compare(methods, "replicas", ["dp"])
        record.data.setdefault("ratios", {})["replicas/dp"] = cmp
        if cmp["ratio"] is not None:
            interval = "" if cmp["interval"] is None else f" [{cmp['interval'][0]:.2f}-{cmp['interval'][1]:.2f}]"
            print(f"  replicas / dp: {cmp['ratio']:.2f}x{interval}", flush=True)
    record["targets"] = targets.rows
    metrics = record.data.get("router_metrics") or {}
    if metrics.get("lines"):
        print("\nThe router's per-worker counters (Prometheus):", flush=True)
        for line in metrics["lines"][:20]:
            print(f"  {line}", flush=True)
    elif metrics:
        print(f"\nrouter metrics: {metrics.get('error')}", flush=True)


if __name__ == "__main__":
    main()
