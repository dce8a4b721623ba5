"""A fresh kernel and a kept server: `import rlgen` + a reattaching `Engine(..., keep_alive=...)`, timed and broken down.

Not a test. Launches one kept server (`Engine(model, backend=..., keep_alive=...)` in this process,
which stays attached, so the server outlives every child and is stopped at the end), then runs,
`--repeats` times, each in a fresh interpreter (a new Jupyter kernel's situation):

    import_s       import rlgen
    engine_s       rlgen.Engine(model, backend=..., progress=False, keep_alive=...) returned, reattached
    ready_s        import_s + engine_s: the target, <= 2 s
    tokenizer_s    eng.start_times: the tokenizer's load (in a thread, alongside the attach)
    server_s       eng.start_times: finding and attaching the kept server
    total_s        eng.start_times: the constructor end to end (engine_s less the argument checks)
    first_token_s  then eng.generate("Hi", max_new_tokens=1): the first call's own imports and request
    process_s      the child process from spawn to exit (interpreter start and exit included)

and which heavy modules each child had imported when Engine() returned (torch, torch._dynamo, sympy,
sklearn, transformers.generation, transformers, ...) and which tokenizer class it got. Two modes,
interleaved within each repeat:

    recorded       as a user's kernel finds it: the launching Engine recorded the tokenizer
                   (rlgen.client._tokenizer), so the child loads a LightTokenizer without transformers
    no-record      the tokenizer records removed before the child starts: it goes through
                   AutoTokenizer (and its probes, and writes the record), as every reattach did
                   before the records existed (for comparison)

Medians with 90% bootstrap intervals (`_common.bootstrap_median`); one extra child per mode under
`python -X importtime` gives the top packages by import time (of the whole child: the first
generate's imports, pandas and pyarrow, count there too). Registry, records and server logs
live in a private cache beside --out (`<stem>-logs/cache`), so the user's own kept servers are
never touched; the model path is resolved before (the default model's conversion stays where it is).

    python bench/reattach.py --out reattach.json                          # SGLang, on the GPU machine
    python bench/reattach.py --out /tmp/r.json --backend cpu --repeats 5  # CPU backend, anywhere
"""

from __future__ import annotations

import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from typing import Any

import _common as C

MODES = ("recorded", "no-record")
METRICS = ("ready_s", "import_s", "engine_s", "tokenizer_s", "server_s", "total_s", "first_token_s", "process_s")
WATCH = ("torch", "torch._dynamo", "torch.distributed", "sympy", "sklearn", "scipy", "transformers",
         "transformers.generation", "transformers.models.auto", "tokenizers", "jinja2", "numpy", "pandas", "pyarrow",
         "aiohttp")
HEAVY = ("torch", "torch._dynamo", "sympy", "sklearn", "transformers.generation")
TARGET_S = 2.0
TOP = 12

CHILD = """
import json, sys, time
t0 = time.perf_counter()
import rlgen
t1 = time.perf_counter()
eng = rlgen.Engine({model!r}, progress=False, **{kwargs!r})
t2 = time.perf_counter()
loaded = sorted(m for m in {watch!r} if m in sys.modules)
eng.generate("Hi", max_new_tokens=1)
t3 = time.perf_counter()
print("RESULT " + json.dumps({{"reattached": eng.reattached, "import_s": t1 - t0, "engine_s": t2 - t1,
    "first_token_s": t3 - t2, "start_times": eng.start_times, "loaded": loaded,
    "tokenizer": type(eng.tokenizer).__name__}}))
eng.close()
"""


def engine_kwargs(backend: str) -> dict[str, Any]:
    # fast_start on SGLang: a quicker launch; the reattach is the same (children pass the same options)
    return {"backend": backend, "keep_alive": "15m", **({"fast_start": True} if backend == "sglang" else {})}


def child_env(cache: str) -> dict[str, str]:
    return {**os.environ, "RLGEN_CACHE_DIR": cache,
            "PYTHONPATH": os.pathsep.join(filter(None, [str(C.REPO), os.environ.get("PYTHONPATH")]))}


def one_run(code: str, env: dict[str, str]) -> dict[str, Any]:
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    process_s = time.perf_counter() - t0
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode or not lines:
        return {"error": f"exit {proc.returncode}: {proc.stderr[-1500:]}"}
    out = json.loads(lines[-1][len("RESULT "):])
    st = out.pop("start_times")
    out.update(tokenizer_s=st.get("tokenizer_s"), server_s=st.get("server_s"), total_s=st.get("total_s"),
               ready_s=out["import_s"] + out["engine_s"], process_s=process_s)
    return out


def top_packages(code: str, env: dict[str, str]) -> list[tuple[str, float]]:
    """Self import times summed per top-level package, from one `-X importtime` child."""
    err = subprocess.run([sys.executable, "-X", "importtime", "-c", code], env=env, capture_output=True, text=True,
                         timeout=600).stderr
    per: dict[str, float] = defaultdict(float)
    for line in err.splitlines():
        if line.startswith("import time:") and "self [us]" not in line:
            try:
                self_us, _cumulative, name = (part.strip() for part in line[len("import time:"):].split("|"))
                per[name.split(".")[0]] += int(self_us) / 1e6
            except ValueError:
                continue
    return sorted(per.items(), key=lambda kv: -kv[1])[:TOP]


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    ok = [r for r in runs if "error" not in r]
    out: dict[str, Any] = {"runs": len(runs), "ok": len(ok)}
    for metric in METRICS:
        values = [r[metric] for r in ok if r.get(metric) is not None]
        out[metric] = {"median": statistics.median(values) if values else None,
                       "interval": C.bootstrap_median(values), "values": values}
    out["loaded_in_any_run"] = sorted({m for r in ok for m in r["loaded"]})
    out["heavy_in_any_run"] = [m for m in HEAVY if m in out["loaded_in_any_run"]]
    out["tokenizers"] = sorted({r["tokenizer"] for r in ok})
    out["all_reattached"] = all(r["reattached"] for r in ok) and bool(ok)
    return out


def report(record: C.Record) -> None:
    summary = record["summary"]
    rows = []
    for mode, s in summary.items():
        for metric in METRICS:
            m = s[metric]
            iv = m["interval"]
            rows.append([mode, metric, C.fmt(m["median"], ".3f"),
                         f"{iv[0]:.3f}-{iv[1]:.3f}" if iv else "-", " ".join(f"{v:.2f}" for v in m["values"])])
    C.print_table(f"Fresh interpreter, reattach to a kept {record['backend']} server (seconds; medians, 90% intervals)",
                  ["mode", "metric", "median", "interval", "runs"], rows)
    for mode, s in summary.items():
        print(f"\n{mode}: {s['ok']}/{s['runs']} runs ok, reattached in all: {s['all_reattached']}, "
              f"tokenizer {s['tokenizers']}; heavy modules imported by Engine(): {s['heavy_in_any_run'] or 'none'}; "
              f"loaded: {s['loaded_in_any_run']}", flush=True)
        top = record.data.get("importtime", {}).get(mode)
        if top:
            print("  -X importtime, top packages (self s): " + ", ".join(f"{p} {t:.2f}" for p, t in top), flush=True)
    targets = C.Targets()
    print("\nTargets:", flush=True)
    rec = summary.get("recorded")
    if rec is not None:
        targets.check_interval("import rlgen + reattaching Engine(), fresh interpreter", rec["ready_s"]["median"],
                               rec["ready_s"]["interval"], TARGET_S, op="<", unit="s",
                               wrong=(f"Engine() imported {rec['heavy_in_any_run']}" if rec["heavy_in_any_run"]
                                      else None if rec["all_reattached"] else "a child did not reattach"))
    record["targets"] = targets.rows


def main() -> None:
    ap = C.base_parser(__doc__, repeats=5)
    C.add_report_only(ap)
    ap.add_argument("--modes", default=",".join(MODES), help=f"comma-separated subset of {','.join(MODES)}")
    ap.add_argument("--no-importtime", action="store_true", help="skip the -X importtime child of each mode")
    args = ap.parse_args()
    if C.reported_again(args, report):
        return
    modes = C.subset(ap, "--modes", args.modes, MODES)
    if args.backend == "sglang":
        C.site_flags()
    model = C.model_path(args.model)  # resolved with the user's cache: the default model's conversion stays there
    record = C.Record(args.out, args, "bench/reattach.py")
    cache = C.logs_dir(args.out, "cache")
    shutil.rmtree(cache, ignore_errors=True)
    cache.mkdir(parents=True)
    os.environ["RLGEN_CACHE_DIR"] = str(cache)  # registry, records and logs: private to this run
    env = child_env(str(cache))
    kwargs = engine_kwargs(args.backend)
    record.data.update(model=model, backend=args.backend, engine_kwargs=kwargs, cache=str(cache), runs={}, summary={})
    code = CHILD.format(model=model, kwargs=kwargs, watch=WATCH)

    import rlgen
    from rlgen.client._tokenizer import records_dir

    C.log(f"launching a kept {args.backend} server for {model}")
    t0 = time.monotonic()
    owner = rlgen.Engine(model, progress=False, **kwargs)  # stays attached: the server outlives every child
    record["server"] = {"pid": owner.info["pid"], "launch_s": time.monotonic() - t0, "start_times": owner.start_times,
                        "tokenizer": type(owner.tokenizer).__name__}
    C.log(f"server pid {owner.info['pid']} ready in {record['server']['launch_s']:.1f} s")
    record.save()
    try:
        runs: dict[str, list[dict[str, Any]]] = {mode: [] for mode in modes}
        rng = random.Random(0)
        for i in range(C.repeats_of(args)):
            for mode in rng.sample(modes, len(modes)):  # interleaved, in a shuffled order
                if mode == "no-record":
                    shutil.rmtree(records_dir(), ignore_errors=True)
                run = one_run(code, env)
                runs[mode].append(run)
                shown = run.get("error") or (f"ready {run['ready_s']:.2f} s (import {run['import_s']:.2f}, Engine() "
                                             f"{run['engine_s']:.2f}: tokenizer {run['tokenizer_s']:.2f}, attach "
                                             f"{run['server_s']:.2f}), first token {run['first_token_s']:.2f} s, "
                                             f"{run['tokenizer']}, heavy {[m for m in HEAVY if m in run['loaded']]}")
                C.log(f"repeat {i + 1} {mode}: {shown}")
                record["runs"] = runs
                record.save()
        if not args.no_importtime:
            record["importtime"] = {}
            for mode in modes:
                if mode == "no-record":
                    shutil.rmtree(records_dir(), ignore_errors=True)
                record["importtime"][mode] = top_packages(code, env)
        record["summary"] = {mode: summarize(r) for mode, r in runs.items()}
    finally:
        owner.close(stop=True)
    report(record)
    record.save(complete=True)


if __name__ == "__main__":
    main()
