"""Where SGLang's start-up goes before it loads anything: Python imports, per process.

Not a test. On the lent H200, 55-59 s of every SGLang start passed before "Load weight begin"
(bench/startup.py): the launcher process imports, then spawns the scheduler process, which imports
again. This script times, each in a fresh interpreter and `--repeats` times (default 1; median):

    launcher    import sglang.srt.entrypoints.http_server   (what `python -m sglang.launch_server` needs)
    scheduler   import sglang.srt.managers.scheduler        (what the spawned scheduler process needs)
    torch       import torch                                (the floor under both)
    rlgen       import rlgen; from transformers import AutoTokenizer  (the notebook's own side)

and, from one extra `python -X importtime` run of each, the top-level packages that took the most
cumulative time. The numbers say how much a faster launcher could ever save: rlgen passes flags
to SGLang and cannot change what SGLang imports.

    python bench/imports.py --out imports.json
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from collections import defaultdict

import _common as C

TARGETS = {
    "torch": "import torch",
    "launcher": "import sglang.srt.entrypoints.http_server",
    "scheduler": "import sglang.srt.managers.scheduler",
    "rlgen": "import rlgen; from transformers import AutoTokenizer",
}
TOP = 12


def time_import(statement: str) -> float:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", statement], check=True, capture_output=True, timeout=600)
    return time.perf_counter() - t0


def top_packages(statement: str) -> list[tuple[str, float]]:
    """Cumulative import seconds per top-level package, from `-X importtime` (self times summed)."""
    err = subprocess.run([sys.executable, "-X", "importtime", "-c", statement], capture_output=True, text=True,
                         timeout=600, check=True).stderr
    per_package: dict[str, float] = defaultdict(float)
    for line in err.splitlines():
        if not line.startswith("import time:") or "self [us]" in line:
            continue
        try:
            self_us, _cumulative, name = (part.strip() for part in line[len("import time:"):].split("|"))
            per_package[name.split(".")[0]] += int(self_us) / 1e6
        except ValueError:
            continue
    return sorted(per_package.items(), key=lambda kv: -kv[1])[:TOP]


def main() -> None:
    ap = C.base_parser(__doc__, repeats=1)  # each SGLang import is ~25 s on the H200; -X importtime adds one more run
    args = ap.parse_args()
    record = C.Record(args.out, args, "bench/imports.py")
    targets = {"torch": TARGETS["torch"], "rlgen": TARGETS["rlgen"]} if args.backend == "cpu" else TARGETS
    record.data.update(seconds={}, top={})
    for name, statement in targets.items():
        try:
            runs = [time_import(statement) for _ in range(C.repeats_of(args))]
            record["seconds"][name] = {"runs": runs, "median": statistics.median(runs)}
            record["top"][name] = top_packages(statement)
            C.log(f"{name}: {statement!r}: median {statistics.median(runs):.1f} s of {[round(r, 1) for r in runs]}")
        except (subprocess.SubprocessError, OSError) as err:
            record["seconds"][name] = {"error": f"{type(err).__name__}: {err}"}
            C.log(f"{name}: FAILED: {err}")
        record.save()
    C.print_table("seconds to import, fresh interpreter each time (median)", ["what", "statement", "median s", "runs"],
                  [[name, targets[name], C.fmt(v.get("median"), ".1f"), " ".join(f"{r:.1f}" for r in v.get("runs", []))
                    or v.get("error", "")] for name, v in record["seconds"].items()])
    for name, top in record["top"].items():
        print(f"\n{name}: top packages by import time (self times summed, s): "
              + ", ".join(f"{pkg} {s:.1f}" for pkg, s in top), flush=True)
    record.save(complete=True)


if __name__ == "__main__":
    main()
