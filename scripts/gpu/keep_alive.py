"""On the GPU machine: keep-alive on real SGLang. A first process starts Engine(keep_alive=...) and
dies without closing (as a killed kernel); a fresh second process reattaches (timings), generates,
then detaches with a short keep_alive; the watchdog must stop the server and free its GPU memory.
Prints one JSON line per step; run with $RLGEN_TEST_MODEL and $RLGEN_SGLANG_ARGS set."""

import json
import os
import subprocess
import sys
import time

MODEL = os.environ["RLGEN_TEST_MODEL"]
BACKEND = os.environ.get("RLGEN_KEEP_BACKEND", "sglang")  # "cpu": a smoke run without a GPU
FIRST = f"""
import json, os, rlgen
e = rlgen.Engine({MODEL!r}, backend={BACKEND!r}, progress=False, fast_start=True, keep_alive="5m")
r = e.generate("Hi", max_new_tokens=4, temperature=0)
print(json.dumps({{"step": "first", "pid": e.info["pid"], "start_times": e.start_times,
                   "gpu_mib": e.info["gpu_memory_mib"], "text": r.df.completion[0]}}), flush=True)
os._exit(0)  # no close(), no finalizers: as a killed kernel
"""
SECOND = f"""
import json, rlgen
e = rlgen.Engine({MODEL!r}, backend={BACKEND!r}, progress=False, fast_start=True, keep_alive=3)
r = e.generate("Hi", max_new_tokens=4, temperature=0)
print(json.dumps({{"step": "second", "pid": e.info["pid"], "reattached": e.reattached, "start_times": e.start_times,
                   "text": r.df.completion[0], "kept": e.info["kept"]}}), flush=True)
e.close()  # detach: the idle clock starts, 3 s
"""


def run(code: str) -> dict:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=400, check=False)
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
    if out.returncode != 0 or not lines:
        print(out.stderr[-3000:], flush=True)
        raise SystemExit(f"step failed ({out.returncode})")
    print(lines[-1], flush=True)
    return json.loads(lines[-1])


def gpu_used_mib() -> int | None:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return None
    return int(out.stdout.split()[0])


before = gpu_used_mib()
first = run(FIRST)
second = run(SECOND)
t0 = time.monotonic()
while time.monotonic() - t0 < 60:
    try:
        os.kill(first["pid"], 0)
    except ProcessLookupError:
        break
    time.sleep(0.5)
stopped_after = time.monotonic() - t0
time.sleep(2)
print(json.dumps({"step": "watchdog", "server_gone_after_s": round(stopped_after, 1),
                  "same_pid": second["pid"] == first["pid"], "gpu_used_mib_before": before,
                  "gpu_used_mib_after": gpu_used_mib()}), flush=True)
