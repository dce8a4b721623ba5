"""Start-up cost: seconds to the first generated token, GPU memory held, and throughput, per configuration.

Not a test. Starts each configuration fresh, one after the other (the previous one closed and its
GPU memory back first), and measures:

    ready_s        launch -> healthy (raw) / rlgen.Engine(...) returned (rlgen)
    first_token_s  launch -> a 1-token generation returned: the number a user waits for
    GPU memory     nvidia-smi memory.used (all GPUs) minus its value just before the launch, after
                   the first token and again after the workload (peak of the two); also the
                   per-process view (`--query-compute-apps`, summed over the server's pids), which
                   a container may leave empty
    throughput     workload a (256 prompts x 64 tokens -> 128 new, ignore_eos, logprobs on): rlgen
                   generate (incl. DataFrame and tensors), or one raw batched /generate with the
                   same flags for the raw launch; one warm-up, then 2 repeats, median
    phases         when the server log first shows "Load weight begin", "Load weight end", "KV
                   Cache is allocated", "Capture ... cuda graph begin" (first) / "end" (last) and
                   "The server is fired up and ready to roll!", seconds since launch (the log is
                   tailed every 0.1 s while starting)

Configurations, in this order:
    sglang-defaults   python -m sglang.launch_server --model-path M <site flags> --host --port, in its
                      own session, log to a file, killed by process group afterwards
    rlgen-fast_start  rlgen.Engine(M, backend="sglang", progress=False, fast_start=True)
    rlgen-defaults    the same without fast_start; left running for the side-by-side phase

Fresh kernel: `import rlgen; Engine(fast_start=True); generate(...)` in a new Python process, the
first thing a new notebook kernel does. Unlike the configurations above (which run after this
process imported the client on purpose, to time the server alone), the client's own imports
count here, as they do for a user: seconds from `Engine(` to the first token.

Side by side (the throughput target): SGLang's defaults are started again beside the running
rlgen-defaults server, and workload a runs on both in turn (raw batched request on each, and
rlgen's generate), 11 repeats, interleaved. Throughput measured one start after another is only
indicative: on the lent H200 it drifted by tens of percent within minutes.

The first SGLang start on a fresh machine is much slower (no .pyc, no Triton cache: 134 s vs ~50 s
measured), so by default a throw-away start of the first configuration runs before the timed ones
(`--no-warm-start` to skip it; its numbers are kept under "warm_start"). Targets printed: rlgen
fast_start <= 25 s to the first token; rlgen defaults hold <= 25% of the GPU's memory with
throughput within 10% of SGLang's defaults. Server logs go next to --out (<stem>-logs/).

    python bench/startup.py --out startup.json                     # on the GPU machine
    python bench/startup.py --out /tmp/s.json --backend cpu --quick # smoke test (no raw SGLang launch)
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import _common as C

from rlgen.server._log import LogFollower
from rlgen.server._process_tree import gpu_memory_mib

CONFIGS = ("sglang-defaults", "rlgen-fast_start", "rlgen-defaults")  # rlgen-defaults last: it stays up
SIDE_BY_SIDE_REPEATS = 11  # 5 left the 2026-11-30 comparison undecided (rank test p 0.1-0.2); ~1 s each
# (key, pattern, which occurrence) in the server log, case-insensitive.
MARKERS = (
    ("load_begin", r"load weight begin", "first"),
    ("load_end", r"load weight end", "first"),
    ("kv_alloc", r"kv cache is allocated", "first"),
    ("graph_begin", r"captur\w* .*cuda graph.*\bbegin", "first"),
    ("graph_end", r"captur\w* .*cuda graph.*\bend\b", "last"),
    ("fired_up", r"the server is fired up and ready to roll", "first"),
)
# Start-up segments: each ends at a point and starts at the latest earlier point the run has
# (markers missing from a log, e.g. no CUDA-graph lines, merge into the next segment).
SEGMENTS = (
    ("spawn+imports", "load_begin"),
    ("load weights", "load_end"),
    ("KV cache", "kv_alloc"),
    ("-> graphs", "graph_begin"),
    ("CUDA graphs", "graph_end"),
    ("-> fired up", "fired_up"),
    ("-> ready", "ready"),
    ("-> 1st token", "first_token"),
)
THROUGHPUT_REPEATS = 2


# ---------------------------------------------------------------------------------------------
# Watching the log while a server starts


class LogWatcher(threading.Thread):
    """Tails a log file every `interval` s and notes when each marker's line first (or last) shows."""

    def __init__(self, path: Path, t0: float, interval: float = 0.1) -> None:
        super().__init__(daemon=True)
        self.path, self.t0, self.interval = path, t0, interval
        self.seen: dict[str, dict[str, Any]] = {}
        self._follower = LogFollower(path)
        self._stop_event = threading.Event()
        self._patterns = [(key, re.compile(pat, re.IGNORECASE), which) for key, pat, which in MARKERS]

    def run(self) -> None:
        while not self._stop_event.wait(self.interval):
            self._read()

    def stop(self) -> dict[str, dict[str, Any]]:
        self._stop_event.set()
        self.join(timeout=5)
        self._read()
        return self.seen

    def _read(self) -> None:
        lines = self._follower.new_lines()
        now = time.monotonic() - self.t0
        for line in lines:
            for key, pattern, which in self._patterns:
                if pattern.search(line) and (which == "last" or key not in self.seen):
                    self.seen[key] = {"s": round(now, 2), "line": line.strip()[:240]}


# ---------------------------------------------------------------------------------------------
# The configurations: each starts, generates its first token, runs the workload, and closes


class RawSGLang:
    """`python -m sglang.launch_server` with SGLang's defaults (plus the site flags), as a user runs it."""

    module = "sglang.launch_server"  # rlgen.cpu_server takes the same command line (for testing this class)

    def __init__(self, model: str, log_dir: Path) -> None:
        self.model, self.log_dir, self.log_path = model, log_dir, log_dir / "server.log"
        self.server: Any = None
        self.url = ""

    def start(self) -> None:
        # rlgen's process ownership (own session, parent-death signal, /health_generate wait, log
        # in log_dir) around SGLang's own command line: none of rlgen's Engine defaults apply.
        from rlgen.server._process import launch_server

        cmd = [sys.executable, "-m", self.module, "--model-path", self.model, *C.site_flags()]
        self.server = launch_server(cmd, log_dir=self.log_dir, startup_timeout=600, grace=15.0)
        self.url = self.server.url

    def first_token(self) -> None:
        status, body = C.http_request(self.url, "/generate", {"text": "Hi", "sampling_params": {"max_new_tokens": 1}},
                                      timeout=120)
        if status != 200:
            raise RuntimeError(f"/generate failed with HTTP {status}: {body[:200]!r}")

    def pids(self) -> list[int]:
        return self.server.pids() if self.server is not None else []

    def throughput_method(self) -> tuple[Any, Any]:
        raw = C.RawClient(self.url)
        return raw.one_request, raw.close

    def close(self) -> None:
        """SIGTERM to the server's process group, SIGKILL after 15 s, then a sweep (rlgen's close)."""
        if self.server is not None:
            self.server.close()


class RlgenLaunch:
    """`rlgen.Engine(model, backend=..., progress=False, **kwargs)`, its log in a known directory."""

    def __init__(self, model: str, log_dir: Path, backend: str, **kwargs: Any) -> None:
        self.model, self.log_dir, self.backend, self.kwargs = model, log_dir, backend, kwargs
        self.log_path = log_dir / "server.log"  # where rlgen writes it when given log_dir
        self.eng: Any = None

    def start(self) -> None:
        import rlgen

        self.eng = rlgen.Engine(self.model, backend=self.backend, progress=False, log_dir=self.log_dir, **self.kwargs)

    def first_token(self) -> None:
        self.eng.generate("Hi", max_new_tokens=1)

    def pids(self) -> list[int]:
        return self.eng._server.pids() if self.eng is not None else []

    def throughput_method(self) -> tuple[Any, Any]:
        return (lambda wl: C.rlgen_generate(self.eng, wl)), (lambda: None)

    def close(self) -> None:
        if self.eng is not None:
            self.eng.close()


def make_launch(config: str, model: str, log_dir: Path, backend: str) -> RawSGLang | RlgenLaunch:
    if config == "sglang-defaults":
        return RawSGLang(model, log_dir)
    return RlgenLaunch(model, log_dir, backend, **({"fast_start": True} if config == "rlgen-fast_start" else {}))


# ---------------------------------------------------------------------------------------------
# One measured start


def measure(config: str, args: argparse.Namespace, model: str, log_dir: Path, workload: C.Workload,
            *, keep: list[Any] | None = None) -> dict[str, Any]:
    """Start `config` fresh, time it to the first token, read GPU memory, run the workload, close it.

    With `keep` (a list), a launch that worked is appended to it and left running instead.
    """
    out: dict[str, Any] = {"config": config, "log_path": None, "error": None}
    total = C.gpu_total_mib()
    before = C.gpu_used_mib()
    out.update(gpu_total_mib=total, gpu_used_before_mib=before)
    launch = make_launch(config, model, log_dir, args.backend)
    out["log_path"] = str(launch.log_path)
    launch.log_path.unlink(missing_ok=True)  # a log left by an earlier run must not feed the watcher
    C.log(f"{config}: launching (log {launch.log_path})")
    t0 = time.monotonic()
    watcher = LogWatcher(launch.log_path, t0)
    watcher.start()
    try:
        launch.start()
        out["ready_s"] = time.monotonic() - t0
        launch.first_token()
        out["first_token_s"] = time.monotonic() - t0
        C.log(f"{config}: ready after {out['ready_s']:.1f} s, first token after {out['first_token_s']:.1f} s")
        out["phases"] = watcher.stop()
        out["memory_ready"] = _memory(launch.pids(), before)
        method, done = launch.throughput_method()
        try:
            out["throughput"] = C.run_interleaved({config: method}, workload, repeats=C.repeats_of(args),
                                                  warmup=workload.head(64), label=f"{config}/")[config]
        finally:
            done()
        out["memory_after_workload"] = _memory(launch.pids(), before)
    except Exception as err:  # the other configurations still run
        out["error"] = f"{type(err).__name__}: {err}"
        C.log(f"{config}: FAILED: {out['error']}")
    finally:
        if "phases" not in out:
            out["phases"] = watcher.stop()
    if keep is not None and out["error"] is None:
        keep.append(launch)
    else:
        t_close = time.monotonic()
        try:
            launch.close()
        except Exception as err:
            out["close_error"] = f"{type(err).__name__}: {err}"
        out["close_s"] = time.monotonic() - t_close
        out["gpu_release_wait_s"] = C.wait_gpu_back(before)
    held = [m["delta_mib"] for m in (out.get("memory_ready"), out.get("memory_after_workload")) if m and m["delta_mib"] is not None]
    out["gpu_held_peak_mib"] = max(held) if held else None
    out["gpu_held_pct"] = 100 * out["gpu_held_peak_mib"] / total if held and total else None
    return out


def _memory(pids: list[int], before: int | None) -> dict[str, Any]:
    used = C.gpu_used_mib()
    return {"used_mib": used, "delta_mib": used - before if used is not None and before is not None else None,
            "per_process_mib": gpu_memory_mib(pids), "pids": pids}


# ---------------------------------------------------------------------------------------------
# A fresh kernel: what a notebook user waits for the first time


FRESH_KERNEL = """
import json, sys, time
t0 = time.monotonic()
import rlgen
t_import = time.monotonic()
eng = rlgen.Engine(sys.argv[1], backend=sys.argv[2], progress=False, fast_start=True, log_dir=sys.argv[3])
t_ready = time.monotonic()
eng.generate("Hi", max_new_tokens=1)
t_first = time.monotonic()
eng.close()
print(json.dumps({"import_s": t_import - t0, "engine_s": t_ready - t_import, "first_token_s": t_first - t_import}))
"""


def fresh_kernel(args: argparse.Namespace, model: str) -> dict[str, Any]:
    """`import rlgen; Engine(fast_start=True); generate(...)` in a new Python process, as in a new
    notebook kernel: nothing imported beforehand, so the client's own imports (transformers, the
    tokenizer) count, as they do for a user. Seconds from `Engine(` to the first token."""
    log_dir = C.logs_dir(args.out, "fresh-kernel")
    C.log("fresh kernel: rlgen fast_start in a new Python process ...")
    try:
        proc = subprocess.run([sys.executable, "-c", FRESH_KERNEL, model, args.backend, str(log_dir)],
                              capture_output=True, text=True, timeout=900)
        if proc.returncode != 0:
            return {"error": f"exit {proc.returncode}: {proc.stderr[-500:]}"}
        out = json.loads(proc.stdout.strip().splitlines()[-1])
    except (subprocess.SubprocessError, OSError, ValueError, IndexError) as err:
        return {"error": f"{type(err).__name__}: {err}"}
    C.log(f"fresh kernel: import rlgen {out['import_s']:.1f} s, Engine() {out['engine_s']:.1f} s, "
          f"first token {out['first_token_s']:.1f} s after Engine(")
    return out


# ---------------------------------------------------------------------------------------------
# Throughput side by side: rlgen's defaults against SGLang's, both up at once, interleaved


def side_by_side(rlgen_launch: RlgenLaunch, args: argparse.Namespace, model: str, workload: C.Workload) -> dict[str, Any]:
    """Start SGLang's defaults beside the running rlgen-defaults server and interleave workload a.

    One start after another measures start-up and memory, but not throughput: on a shared machine
    the speed drifts by tens of percent between starts minutes apart (seen on the H200). Here both
    servers take turns within seconds. Beside rlgen's server SGLang's defaults size a smaller KV
    pool than alone (they leave 1 - 0.903 of the GPU free, counting rlgen's share as used); it is
    recorded, and still several times rlgen's.
    """
    out: dict[str, Any] = {"error": None}
    sglang = RawSGLang(model, C.logs_dir(args.out, "side-by-side-sglang-defaults"))
    if args.backend == "cpu":
        sglang.module = "rlgen.cpu_server"  # a smoke test of this phase without a GPU
    C.log("side by side: starting sglang-defaults beside rlgen-defaults")
    try:
        sglang.start()
        out["pools"] = {"rlgen-defaults": rlgen_launch.eng.server_info.get("max_total_num_tokens"),
                        "sglang-defaults": json.loads(C.http_request(sglang.url, "/server_info")[1])
                        .get("max_total_num_tokens")}
        with C.RawClient(sglang.url) as raw_sglang, C.RawClient(rlgen_launch.eng.url) as raw_rlgen:
            methods = {
                "sglang-defaults raw": raw_sglang.one_request,
                "rlgen-defaults raw": raw_rlgen.one_request,
                "rlgen-defaults rlgen": lambda wl: C.rlgen_generate(rlgen_launch.eng, wl),
            }

            def flush_both() -> None:
                C.flush_cache(sglang.url)
                C.flush_cache(rlgen_launch.eng.url)

            repeats = args.repeats or (2 if args.quick else SIDE_BY_SIDE_REPEATS)
            out["results"] = C.run_interleaved(methods, workload, repeats=repeats, warmup=workload.head(64),
                                               before_each=flush_both, label="side-by-side/")
    except Exception as err:  # the rest of the report still prints
        out["error"] = f"{type(err).__name__}: {err}"
        C.log(f"side by side FAILED: {out['error']}")
    finally:
        sglang.close()
    return out


# ---------------------------------------------------------------------------------------------
# Report


def report(record: C.Record, configs: list[str]) -> None:
    runs = {r["config"]: r for r in record["runs"]}
    base = (runs.get("sglang-defaults", {}).get("throughput") or {}).get("median_tok_s")
    rows = []
    for name in configs:
        r = runs.get(name, {})
        tok_s = (r.get("throughput") or {}).get("median_tok_s")
        per_process = (r.get("memory_after_workload") or r.get("memory_ready") or {}).get("per_process_mib")
        rows.append([name, C.fmt(r.get("ready_s"), ".1f"), C.fmt(r.get("first_token_s"), ".1f"),
                     C.fmt(r.get("gpu_held_peak_mib")), C.fmt(r.get("gpu_held_pct"), ".1f"), C.fmt(per_process),
                     C.fmt(tok_s), C.fmt(C.ratio(tok_s, base), ".3f"), r.get("error") or ""])
    warm = record.data.get("warm_start")
    if warm:
        rows.append([_label(warm, warm), C.fmt(warm.get("ready_s"), ".1f"),
                     C.fmt(warm.get("first_token_s"), ".1f"), "", "", "", "", "", warm.get("error") or ""])
    C.print_table("start-up (one fresh start each; memory = nvidia-smi memory.used minus before the launch, peak)",
                  ["config", "ready s", "1st token s", "GPU MiB", "GPU %", "per-proc MiB", "tok/s (a)",
                   "vs sglang", "error"], rows)
    print(f"  the warm-up start was the first server start in this run (Triton cache existed before it: "
          f"{record['triton_cache_existed']}); this process's client imports took "
          f"{C.fmt(record['client_imports_s'], '.1f')} s before any timed start", flush=True)

    timed = [runs[n] for n in configs if n in runs] + ([warm] if warm else [])
    mark_keys = [k for k, _, _ in MARKERS]
    C.print_table("where start-up time goes: seconds since launch when the log first shows each marker",
                  ["config", *mark_keys, "ready", "first_token"],
                  [[_label(r, warm), *(C.fmt((r.get("phases") or {}).get(k, {}).get("s"), ".1f") for k in mark_keys),
                    C.fmt(r.get("ready_s"), ".1f"), C.fmt(r.get("first_token_s"), ".1f")] for r in timed])
    C.print_table("... as segments (s; a missing marker's time is in the next segment)", ["config", *(s[0] for s in SEGMENTS)],
                  [[_label(r, warm), *(C.fmt(v, ".1f") for v in segments(r))] for r in timed])

    side = record.data.get("side_by_side") or {}
    results = side.get("results") or {}
    med = {name: (res or {}).get("median_tok_s") for name, res in results.items()}
    if results:
        C.print_table(f"throughput side by side, workload a, both servers up, interleaved (KV pools in tokens: "
                      f"{side.get('pools')})", ["method", "median tok/s", "vs sglang-defaults raw", "runs"],
                      [[name, C.fmt(v), C.fmt(C.ratio(v, med.get("sglang-defaults raw")), ".3f"),
                        " ".join(C.fmt(r["tok_s"]) for r in results[name]["runs"])] for name, v in med.items()])
    if side.get("error"):
        print(f"  side by side ERROR: {side['error']}", flush=True)

    fresh = record.data.get("fresh_kernel") or {}
    if fresh:
        print(f"\nfresh kernel (new process, nothing imported before): import rlgen {C.fmt(fresh.get('import_s'), '.1f')} s; "
              f"Engine(fast_start=True) {C.fmt(fresh.get('engine_s'), '.1f')} s; first token "
              f"{C.fmt(fresh.get('first_token_s'), '.1f')} s after Engine(  {fresh.get('error') or ''}", flush=True)

    print("\ntargets", flush=True)
    targets = C.Targets()
    fast, dflt = runs.get("rlgen-fast_start", {}), runs.get("rlgen-defaults", {})
    targets.check("rlgen fast_start: seconds to the first token", fast.get("first_token_s"), "<=", 25.0, " s")
    targets.check("rlgen fast_start, fresh kernel: seconds from Engine( to the first token", fresh.get("first_token_s"),
                  "<=", 25.0, " s")
    targets.check("rlgen defaults: % of GPU memory held", dflt.get("gpu_held_pct"), "<=", 25.0, " %")
    side_cmp = C.compare(results, "rlgen-defaults rlgen", ["sglang-defaults raw"])
    targets.check_interval("rlgen defaults: throughput / sglang defaults (side by side)", side_cmp["ratio"],
                           side_cmp["interval"], 0.90)
    if side_cmp["p"] is not None:
        print(f"        (two-sided rank test of the runs: p = {side_cmp['p']:.3f})", flush=True)
    # The same target with the client taken out: identical raw requests to both servers, so the
    # ratio is the memory setting's alone (rlgen's client is judged on its own in throughput.py).
    server_cmp = C.compare(results, "rlgen-defaults raw", ["sglang-defaults raw"])
    targets.check_interval("rlgen defaults' server / sglang defaults' server, identical raw requests",
                           server_cmp["ratio"], server_cmp["interval"], 0.90)
    if side_cmp.get("extra_outside_s") is not None:
        print(f"        (rlgen's client on its server: {side_cmp['extra_outside_s'] * 1e3:.1f} ms more outside the "
              f"server than the raw request; server times {C.fmt(side_cmp['server_s'][0], '.3f')} vs "
              f"{C.fmt(side_cmp['server_s'][1], '.3f')} s, rank test p = {C.fmt(side_cmp['server_p'], '.3f')})",
              flush=True)
    record["targets"] = targets.rows


def _label(run: dict[str, Any], warm: dict[str, Any] | None) -> str:
    return f"{run['config']} (warm-up start)" if run is warm else run["config"]


def segments(run: dict[str, Any]) -> list[float | None]:
    """Seconds spent in each of SEGMENTS (None where its end point is missing)."""
    phases = run.get("phases") or {}
    previous, out = 0.0, []
    for _, point in SEGMENTS:
        at = run.get(f"{point}_s") if point in ("ready", "first_token") else phases.get(point, {}).get("s")
        out.append(None if at is None else at - previous)
        previous = previous if at is None else at
    return out


def import_client(model: str) -> float:
    """Import rlgen and load the tokenizer once, so no timed start pays this process's first imports.

    A fresh notebook pays them once on its first Engine; the time is recorded as client_imports_s.
    """
    t0 = time.monotonic()
    from transformers import AutoTokenizer

    import rlgen  # noqa: F401

    AutoTokenizer.from_pretrained(model)
    seconds = time.monotonic() - t0
    C.log(f"client imports (rlgen, transformers, tokenizer): {seconds:.1f} s, kept out of every timed start")
    return seconds


def main() -> None:
    ap = C.base_parser(__doc__, repeats=THROUGHPUT_REPEATS)
    ap.add_argument("--configs", default=",".join(CONFIGS), help=f"comma-separated subset of {','.join(CONFIGS)}")
    ap.add_argument("--warm-start", action=argparse.BooleanOptionalAction, default=True,
                    help="a throw-away start first, so caches are warm for the timed ones (default on)")
    ap.add_argument("--fresh-kernel", action=argparse.BooleanOptionalAction, default=True,
                    help="also time fast_start from a new Python process, client imports included (default on)")
    ap.add_argument("--side-by-side", action=argparse.BooleanOptionalAction, default=True,
                    help="after the starts, SGLang's defaults beside rlgen's, interleaved on workload a (default on)")
    C.add_report_only(ap)
    args = ap.parse_args()
    if C.reported_again(args, lambda record: report(record, [r["config"] for r in record["runs"]])):
        return
    configs = C.subset(ap, "--configs", args.configs, CONFIGS)

    C.site_flags()  # before any launch: rlgen's Engine reads $RLGEN_SGLANG_ARGS itself
    model = C.model_path(args.model)
    record = C.Record(args.out, args, "bench/startup.py")
    if args.backend == "cpu" and "sglang-defaults" in configs:
        configs.remove("sglang-defaults")
        record["skipped"] = {"sglang-defaults": "--backend cpu: a raw SGLang launch needs SGLang on a GPU"}
        C.log("sglang-defaults SKIPPED: --backend cpu (a raw SGLang launch needs SGLang on a GPU)")
    s = (4, 8, 4) if args.quick else (256, 64, 128)
    workload = C.token_workload("a", *s, seed=1)
    client_imports_s = import_client(model)
    triton_cache = Path.home() / ".triton" / "cache"
    record.data.update(model=model, workload=workload.summary(), runs=[], logs=str(C.logs_dir(args.out, "")),
                       client_imports_s=client_imports_s,
                       triton_cache_existed=triton_cache.is_dir() and any(triton_cache.iterdir()))
    record.save()

    if args.warm_start and configs:
        C.log(f"warm start (throw-away, first start in this run): {configs[0]}")
        record["warm_start"] = measure(configs[0], args, model, C.logs_dir(args.out, f"warm-{configs[0]}"),
                                      workload.head(4))
        record.save()
    if args.fresh_kernel:
        record["fresh_kernel"] = fresh_kernel(args, model)
        record.save()
    kept: list[Any] = []
    for i, config in enumerate(configs):
        keep = kept if config == "rlgen-defaults" and args.side_by_side else None
        run = measure(config, args, model, C.logs_dir(args.out, config), workload, keep=keep)
        run["first_start_in_run"] = i == 0 and not args.warm_start
        record["runs"].append(run)
        record.save()
    for launch in kept:
        try:
            record["side_by_side"] = side_by_side(launch, args, model, workload)
        finally:
            launch.close()
        record.save()
    report(record, configs)
    record.save(complete=True)
    C.log(f"wrote {os.path.abspath(args.out)}")


if __name__ == "__main__":
    main()
