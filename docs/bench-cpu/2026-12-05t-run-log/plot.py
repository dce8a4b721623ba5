"""The scale plot of this folder's runs: each scale scenario's median seconds (bars: min-max of the
runs) against the log's rows, 100k and 1M. `python docs/bench-cpu/2026-12-05t-run-log/plot.py`."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

HERE = Path(__file__).resolve().parent
RUNS = ["run_log-100k-rescore-scale.json", "run_log-1m-rescore-scale.json"]


def main() -> None:
    by: dict[str, list[tuple[int, float, float, float]]] = {}
    for name in RUNS:
        path = HERE / name
        if not path.exists():
            continue
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
    fig.savefig(HERE / "scale.png", dpi=110)


if __name__ == "__main__":
    main()
