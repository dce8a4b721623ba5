"""What rlgen adds to SGLang's own start: a bare launch of Engine(fast_start=True)'s exact command
against Engine(fast_start=True) itself, alternated, broken down by the server log's phases.

Not a test. Each pair starts both, one after the other in a shuffled order (each closed, and its
GPU memory back, before the next):

    bare    python -m sglang.launch_server <the argv Engine(fast_start=True) builds> --host --port,
            through rlgen's launch_server (own session, log file, /health_generate polled every
            0.5 s), then one raw 1-token /generate
    rlgen   rlgen.Engine(model, backend="sglang", fast_start=True, progress=False), then
            eng.generate("Hi", max_new_tokens=1)

and records seconds to ready and to the first token, and when the log shows each phase (spawn and
imports, weights, KV cache, CUDA graphs, fired up). This process imports the client and loads the
tokenizer once before the first start, so no timed start pays this process's first imports (a
fresh kernel's are measured by bench/startup.py's fresh-kernel phase).

Target: rlgen - bare <= 2 s to the first token (median difference, 90% bootstrap interval: PASS if
all of it is below 2 s, FAIL if all above, NOISE otherwise).

    python bench/startup_overhead.py --out startup_overhead.json                 # on the GPU machine
    python bench/startup_overhead.py --out /tmp/o.json --backend cpu --quick     # smoke test anywhere
"""

from __future__ import annotations

import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import _common as C
from startup import SEGMENTS, LogWatcher, import_client, segments

PAIRS = 3


def bare_argv(model: str, backend: str) -> list[str]:
    """The command Engine(model, backend, fast_start=True) runs, before rlgen appends --host/--port."""
    from rlgen.server._command import DEFAULT_GPU_MEMORY_FRACTION, server_argv

    return server_argv(backend, model, gpu_memory_fraction=DEFAULT_GPU_MEMORY_FRACTION, fast_start=True,
                       enable_memory_saver=False, enable_metrics=False, server_args=None)


def start_bare(model: str, backend: str, log_dir: Path) -> tuple[Any, Any]:
    from rlgen.server._process import launch_server

    server = launch_server(bare_argv(model, backend), log_dir=log_dir, startup_timeout=900, grace=15.0)

    def first_token() -> None:
        status, body = C.http_request(server.url, "/generate", {"text": "Hi", "sampling_params": {"max_new_tokens": 1}},
                                      timeout=120)
        if status != 200:
            raise RuntimeError(f"/generate failed with HTTP {status}: {body[:200]!r}")

    return first_token, server.close


def start_rlgen(model: str, backend: str, log_dir: Path) -> tuple[Any, Any]:
    import rlgen

    eng = rlgen.Engine(model, backend=backend, progress=False, fast_start=True, log_dir=log_dir)
    return (lambda: eng.generate("Hi", max_new_tokens=1)), eng.close


def one_start(kind: str, model: str, backend: str, log_dir: Path) -> dict[str, Any]:
    out: dict[str, Any] = {"config": kind, "error": None}
    before = C.gpu_used_mib()
    log_path = log_dir / "server.log"
    log_path.unlink(missing_ok=True)
    t0 = time.monotonic()
    watcher = LogWatcher(log_path, t0)
    watcher.start()
    close = None
    try:
        first_token, close = (start_bare if kind == "bare" else start_rlgen)(model, backend, log_dir)
        out["ready_s"] = time.monotonic() - t0
        first_token()
        out["first_token_s"] = time.monotonic() - t0
        out["seconds"] = out["first_token_s"]  # the key compare_difference reads
    except Exception as err:
        out["error"] = f"{type(err).__name__}: {err}"
    finally:
        out["phases"] = watcher.stop()
        if close is not None:
            close()
        out["gpu_release_wait_s"] = C.wait_gpu_back(before)
    C.log(f"{kind}: ready {out.get('ready_s', float('nan')):.1f} s, first token {out.get('first_token_s', float('nan')):.1f} s"
          + (f", FAILED: {out['error']}" if out["error"] else ""))
    return out


def main() -> None:
    begun = C.begin(__doc__, "bench/startup_overhead.py", report, repeats=PAIRS)
    if begun is None:
        return
    args, model, record = begun
    record.data.update(model=model, bare_argv=bare_argv(model, args.backend), client_imports_s=import_client(model),
                       runs=[])
    record.save()
    rng = random.Random(0)
    for pair in range(C.repeats_of(args)):
        order = ["bare", "rlgen"]
        rng.shuffle(order)
        for kind in order:
            run = one_start(kind, model, args.backend, C.logs_dir(args.out, f"{kind}-{pair}"))
            run["pair"] = pair
            record["runs"].append(run)
            record.save()
    report(record)
    record.save(complete=True)


def report(record: C.Record) -> None:
    runs = [r for r in record["runs"] if r.get("error") is None]
    per = {kind: {"runs": [r for r in runs if r["config"] == kind]} for kind in ("bare", "rlgen")}
    rows = []
    for kind in ("bare", "rlgen"):
        segs = [segments(r) for r in per[kind]["runs"]]
        medians = [statistics.median(v) if (v := [s[i] for s in segs if s[i] is not None]) else None
                   for i in range(len(SEGMENTS))]
        rows.append([kind, str(len(segs)), *("-" if m is None else f"{m:.1f}" for m in medians)])
    C.print_table("Start-up by phase, seconds (medians)", ["config", "runs", *(name for name, _ in SEGMENTS)], rows)
    diff = C.compare_difference(per, "rlgen", ["bare"], key="first_token_s")
    targets = C.Targets()
    targets.check_interval("rlgen - bare, seconds to the first token", diff["difference"], diff["interval"], 2.0,
                           op="<", unit="s")
    record["difference"] = diff
    record["targets"] = targets.rows
    errors = [f"{r['config']} (pair {r.get('pair')}): {r['error']}" for r in record["runs"] if r.get("error")]
    if errors:
        print("failed starts: " + "; ".join(errors), file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
