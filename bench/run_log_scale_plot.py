"""The scale plot of `bench/run_log.py --phases scale` runs: each scale scenario's median seconds
(bars: min-max of the runs) against the log's rows. Not a benchmark: it draws saved JSONs.

    python bench/run_log_scale_plot.py OUT.png RUN.json [RUN.json ...]
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt


def main(out: Path, runs: list[Path]) -> None:
    by: dict[str, list[tuple[int, float, float, float]]] = {}
    for path in runs:
        data = json.loads(path.read_text())
        for scenario, runs in data.get("scale", {}).items():
            if not isinstance(runs, list):
                continue
            seconds = [r["s"] for r in runs if "s" in r]
            if seconds:
                by.setdefault(scenario, []).append((data["log"]["rows"], statistics.median(seconds), min(seconds),
                                                    max(seconds)))
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for scenario, points in sorted(by.items()):
        rows = [p[0] for p in points]
        ax.errorbar(rows, [p[1] for p in points], yerr=[[p[1] - p[2] for p in points], [p[3] - p[1] for p in points]],
                    marker="o", capsize=3, label=scenario)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("rows in the log (300 / 3,000 steps of 336)")
    ax.set_ylabel("seconds, fresh interpreter (median, min-max)")
    ax.set_title("RolloutLog at scale (2-core shared CPU; moto for S3)", fontsize="medium")
    ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(out, dpi=110)


if __name__ == "__main__":
    main(Path(sys.argv[1]), [Path(a) for a in sys.argv[2:]])
