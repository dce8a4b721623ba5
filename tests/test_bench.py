"""bench/_common.py, bench/throughput.py's and bench/scale_out.py's judging: the statistics and the bookkeeping the GPU
verdicts rest on (the benchmarks themselves need a GPU and are not tests)."""

from __future__ import annotations

import statistics
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import _common as C
import scale_out
import throughput


def test_the_rank_test_agrees_with_scipys_asymptotic_mann_whitney() -> None:
    # scipy.stats.mannwhitneyu([1..5], [6..10], method="asymptotic").pvalue == 0.012185780355344813
    assert C.rank_test_p([1, 2, 3, 4, 5], [6, 7, 8, 9, 10]) == pytest.approx(0.0121857803553448)
    assert C.rank_test_p([6, 7, 8, 9, 10], [1, 2, 3, 4, 5]) == pytest.approx(0.0121857803553448)


def test_the_rank_test_finds_nothing_between_identical_samples_and_needs_both_sides() -> None:
    assert C.rank_test_p([1.0, 2.0, 3.0], [1.0, 2.0, 3.0]) == 1.0
    assert C.rank_test_p([2.0, 2.0, 2.0], [2.0, 2.0]) == 1.0  # all tied: no variance, no evidence
    assert C.rank_test_p([], [1.0]) is None


def test_the_bootstrap_interval_holds_the_ratio_of_medians_and_is_reproducible() -> None:
    num, den = [1.0, 1.1, 0.9, 1.05, 0.95], [2.0, 2.1, 1.9, 2.05, 1.95]
    lo, hi = C.bootstrap_ratio(num, den)
    assert lo <= statistics.median(num) / statistics.median(den) <= hi
    assert 0.4 < lo < hi < 0.6
    assert C.bootstrap_ratio(num, den) == (lo, hi)
    assert C.bootstrap_ratio([], den) is None


def test_the_ratio_interval_is_what_it_was_before_the_bootstraps_were_folded_into_one() -> None:
    # Values from bootstrap_ratio's own loop before bootstrap_medians existed: saved runs re-report alike.
    assert C.bootstrap_ratio([1.0, 1.1, 0.9, 1.05, 0.95], [2.0, 2.1, 1.9, 2.05, 1.95]) == (0.45238095238095233, 0.55)
    assert C.bootstrap_ratio([3.0, 1.0, 2.0, 5.0], [1.0, 2.0, 2.5]) == (0.6, 3.5)


def test_the_difference_and_single_median_intervals_hold_their_medians() -> None:
    a, b = [3.0, 3.2, 2.9, 3.1, 3.05], [1.0, 1.1, 0.9, 1.05, 0.95]
    lo, hi = C.bootstrap_difference(a, b)
    assert lo <= statistics.median(a) - statistics.median(b) <= hi
    assert 1.7 < lo < hi < 2.4
    assert C.bootstrap_difference([], b) is None
    lo, hi = C.bootstrap_median(b)
    assert min(b) <= lo <= statistics.median(b) <= hi <= max(b)
    assert C.bootstrap_median([1.0, 2.0]) is None  # too few to resample


def test_compare_reads_any_key_and_compare_difference_subtracts_medians() -> None:
    per = {"slow": {"runs": [{"seconds": s} for s in (2.0, 2.2, 1.9)]},
           "fast": {"runs": [{"seconds": s} for s in (1.0, 1.1, 0.9)]}}
    c = C.compare(per, "slow", ["fast"], key="seconds")
    assert c["ratio"] == pytest.approx(2.0) and c["key"] == "seconds" and c["interval"] is not None
    d = C.compare_difference(per, "slow", ["fast"])
    assert d["difference"] == pytest.approx(1.0) and d["runs"] == [3, 3]
    assert d["interval"][0] <= 1.0 <= d["interval"][1]
    assert C.compare_difference({"slow": per["slow"]}, "slow", ["fast"])["difference"] is None


@pytest.mark.parametrize("interval, verdict", [
    ((1.0, 1.4), "PASS"), ((1.6, 2.0), "FAIL"), ((1.2, 1.7), "NOISE"), ((1.5, 1.6), "FAIL"), (None, "n/a"),
])
def test_an_upper_bound_target_passes_below_it_and_fails_at_or_above_it(interval, verdict, capsys) -> None:
    targets = C.Targets()
    targets.check_interval("cost", 1.3, interval, 1.5, op="<", unit="s")
    assert targets.rows[0]["verdict"] == verdict
    out = capsys.readouterr().out
    assert out.split()[0] == verdict and "(target < 1.5 s)" in out


def test_a_wrong_outcome_fails_a_target_whatever_its_numbers(capsys) -> None:
    targets = C.Targets()
    targets.check_interval("hang", 1.1, (1.0, 1.2), 3.0, op="<", unit="s", wrong="row 7 was 'error'")
    assert targets.rows[0]["verdict"] == "FAIL" and targets.rows[0]["ok"] is False
    assert "row 7 was 'error'" in capsys.readouterr().out


@pytest.mark.parametrize("interval, verdict", [
    ((0.96, 1.10), "PASS"), ((0.80, 0.94), "FAIL"), ((0.90, 1.00), "NOISE"), (None, "n/a"),
])
def test_an_interval_target_passes_fails_or_is_called_noise(interval, verdict, capsys) -> None:
    targets = C.Targets()
    targets.check_interval("x", 0.97, interval, 0.95)
    assert targets.rows[0]["verdict"] == verdict
    assert capsys.readouterr().out.split()[0] == verdict


@pytest.mark.parametrize("summary, same", [
    ({"n": 1, "prompts": 256}, ["raw-chunked", "raw-chunked-n", "raw-1req"]),
    ({"n": 1, "prompts": 512}, ["raw-chunked", "raw-chunked-n"]),    # raw-1req: one request of 512
    ({"n": 4, "prompts": 1024}, ["raw-chunked"]),                     # raw-chunked-n: SGLang's own n
])
def test_only_raw_methods_that_send_rlgens_own_requests_are_pooled(summary, same) -> None:
    assert throughput.identical_raw(summary) == same


def test_interleaved_runs_record_the_servers_time_the_order_and_every_run_as_it_ends() -> None:
    wl = C.token_workload("t", 2, 4, 3)
    methods = {
        "with-server-time": lambda w: C.Served(tokens=6, server_s=0.0),
        "tokens-only": lambda w: 6,
        "third": lambda w: C.Served(tokens=6),
    }
    saved: list[int] = []
    out = C.run_interleaved(methods, wl, repeats=4, after_each=lambda partial: saved.append(
        sum(len(r["runs"]) for r in partial.values())))
    assert saved == list(range(1, 13))
    timed = out["with-server-time"]["runs"]
    assert all(r["server_s"] == 0.0 and r["outside_s"] == r["seconds"] for r in timed)
    assert all("server_s" not in r for name in ("tokens-only", "third") for r in out[name]["runs"])
    orders = [[name for name in methods for r in out[name]["runs"] if r["repeat"] == k] for k in range(4)]
    assert all(sorted(o) == sorted(methods) for o in orders)  # every method once per round
    firsts = {name for name in methods for r in out[name]["runs"] if r["after"] is None}
    assert len(firsts) > 1  # shuffled, so not always the same method first


def test_a_server_time_is_the_longest_samples_and_missing_latencies_are_skipped() -> None:
    entries = [{"meta_info": {"completion_tokens": 3, "e2e_latency": 0.5}},
               {"meta_info": {"completion_tokens": 4, "e2e_latency": 0.7}},
               {"meta_info": {"completion_tokens": 1}}]
    assert C.served(entries) == C.Served(tokens=8, server_s=0.7)
    assert C.server_span([float("nan"), None]) is None


def test_compare_pools_their_runs_and_reads_the_extra_time_outside_the_server() -> None:
    def runs(*walls_outside: tuple[float, float]) -> dict:
        return {"runs": [{"tok_s": 100 / wall, "seconds": wall, "server_s": wall - out, "outside_s": out}
                         for wall, out in walls_outside]}

    per = {"ours": runs((1.10, 0.10), (1.20, 0.10), (1.00, 0.10)),
           "a": runs((1.00, 0.05), (0.90, 0.05)), "b": runs((1.00, 0.05))}
    c = C.compare(per, "ours", ["a", "b"])
    assert c["runs"] == [3, 3]
    assert c["ratio"] == pytest.approx((100 / 1.10) / (100 / 1.00))
    assert c["extra_outside_s"] == pytest.approx(0.05)
    assert c["ratio_from_outside"] == pytest.approx(1.00 / 1.05)  # their median wall, plus our extra
    assert C.compare({"ours": runs((1.0, 0.1))}, "ours", ["a"])["interval"] is None


def test_a_saved_run_kept_compressed_reads_as_the_plain_json(tmp_path: Path) -> None:
    import gzip
    import lzma

    saved = Path(__file__).resolve().parents[1] / "docs/gpu/2026-12-01g/scale_out.json"
    (tmp_path / "s.json.xz").write_bytes(lzma.compress(saved.read_bytes()))
    (tmp_path / "s.json.gz").write_bytes(gzip.compress(saved.read_bytes()))
    for name in ("s.json.xz", "s.json.gz"):
        record = C.Record.load(str(tmp_path / name), out=str(tmp_path / "again.json"))
        assert record["methods"] == C.Record.load(str(saved), out=str(tmp_path / "x.json"))["methods"]


def test_the_scale_out_report_judges_the_two_gpu_target_only_with_two_gpus(tmp_path: Path, capsys) -> None:
    import json

    saved = Path(__file__).resolve().parents[1] / "docs/gpu/2026-12-01g/scale_out.json"
    record = C.Record.load(str(saved), out=str(tmp_path / "again.json"))
    scale_out.report(record)
    out = capsys.readouterr().out
    assert "replicas / one: 1.16x [0.98-1.26]" in out and record["targets"] == []  # one GPU: no target
    two = json.loads(saved.read_text())
    two["gpus"] = [0, 1]
    for run in two["methods"]["replicas"]["runs"]:  # as if the second GPU doubled the replicas' rate
        run["tok_s"] *= 2
    (tmp_path / "two.json").write_text(json.dumps(two))
    record = C.Record.load(str(tmp_path / "two.json"), out=str(tmp_path / "again2.json"))
    scale_out.report(record)
    assert [(t["target"], t["verdict"]) for t in record["targets"]] == [("replicas=2 on two GPUs vs one server", "PASS")]


# ---------------------------------------------------------------------------------------------
# bench/episodes.py: matching requests to episodes, the cache and own-time arithmetic, the verdicts,
# and a smoke run on the CPU backend


def _episodes_bench():
    import importlib.util

    path = Path(__file__).resolve().parents[1] / "bench" / "episodes.py"
    spec = importlib.util.spec_from_file_location("bench_episodes", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class _FakeClient:
    """Answers /generate with the output ids given for the request's input length, after 10 ms."""

    def __init__(self, answers: dict[int, list[int]]) -> None:
        self.answers = answers

    async def generate(self, payload: dict) -> dict:
        import asyncio

        await asyncio.sleep(0.01)
        return {"output_ids": self.answers[len(payload["input_ids"])], "meta_info": {"e2e_latency": 0.004}}


def _two_turn_episode(log, *, rlgen_s: bool = False):
    """A record built as the runner builds it, its two requests going through `log`; 30 ms of
    'rlgen's own work' and a 5 ms environment step between them."""
    import asyncio
    import time

    from rlgen.episodes import EpisodeRecord

    rec = EpisodeRecord(0, 0)
    rec.extend([1, 2, 3], role="prompt", turn=0)
    asyncio.run(log.generate({"input_ids": list(rec.ids)}))
    rec.extend([7, 8], role="assistant", turn=0, mask=1)
    rec.turns.append({"role": "assistant", "tokens": 2, "cached_tokens": 0, "prompt_tokens": 3,
                      **({"rlgen_s": 0.002} if rlgen_s else {})})
    time.sleep(0.035)
    rec.turns.append({"role": "env", "latency_s": 0.005})
    rec.extend([2, 9, 9], role="env", turn=0)
    asyncio.run(log.generate({"input_ids": list(rec.ids)}))
    rec.extend([5, 6], role="assistant", turn=1, mask=1)
    rec.turns.append({"role": "assistant", "tokens": 2, "cached_tokens": 5, "prompt_tokens": 8,
                      **({"rlgen_s": 0.003} if rlgen_s else {})})
    rec.turns.append({"role": "env", "latency_s": 0.001})
    rec.status = "done"
    return rec


def test_episodes_bench_matches_each_request_to_its_episode_and_times_the_gap_between_turns() -> None:
    import time

    eb = _episodes_bench()
    log = eb.RequestLog(_FakeClient({3: [7, 8], 8: [5, 6]}))
    t0 = time.perf_counter()
    rec = _two_turn_episode(log)
    (times,) = eb.episode_times([rec], log, t0)
    assert times is not None and len(times["sent"]) == 2 and log.peak == 1
    assert 0.025 < times["between_s"][0] < 0.1  # 35 ms sleep less the 5 ms environment step
    assert times["own_s"] == pytest.approx(times["before_first_s"] + times["between_s"][0])
    assert times["wall_s"] >= times["answered"][1] - 1e-9 and all(x > 0 for x in times["transport_s"])
    # a record whose ids no request sent: not timed
    other = _two_turn_episode(eb.RequestLog(_FakeClient({3: [7, 8], 8: [5, 6]})))
    other.ids[4] = 99
    assert eb.episode_times([other], log, t0) == [None]
    own = eb.own_time([rec], [times])
    assert own["source"] == "requests" and 0 < own["requests"]["pct"] < 100


def test_episodes_bench_cache_shares_and_rlgen_s_when_the_records_have_it() -> None:
    import time

    eb = _episodes_bench()
    log = eb.RequestLog(_FakeClient({3: [7, 8], 8: [5, 6]}))
    t0 = time.perf_counter()
    rec = _two_turn_episode(log, rlgen_s=True)
    cache = eb.cache_shares([rec])
    assert cache["share"] == pytest.approx(5 / 8) and cache["history_share"] == pytest.approx(5 / 5)
    assert cache["per_turn"] == {"2": pytest.approx(5 / 8)}
    details = eb.analyse([rec], log, t0, turns=2, turn_tokens=2)
    assert details["own"]["source"] == "rlgen_s" and details["own"]["rlgen_s"]["own_s"] == pytest.approx(0.005)
    assert details["statuses"] == {"done": 1} and details["short_episodes"] == 0 and details["requests"] == 2
    assert eb.wrong_outcome([details]) is None
    assert "short of the expected tokens" in eb.wrong_outcome([eb.analyse([rec], log, t0, turns=4, turn_tokens=2)])


def _episodes_saved(tmp_path: Path, ratio: float, cached: float, own_pct: float, status: str = "done") -> str:
    import json

    def details(k: int) -> dict:
        return {"statuses": {status: 4}, "short_episodes": 0, "peak_in_flight": 4,
                "cache": {"share": cached + 0.001 * k, "history_share": 0.99, "per_turn": {"2": cached}},
                "own": {"source": "requests", "requests": {"pct": own_pct + 0.01 * k, "between_turns_ms_median": 0.5}}}

    runs = 5
    data = {"workload": {"describe": "test", "max_in_flight": 4}, "results": {
        "episodes": {"runs": [{"tok_s": ratio * (1000 + k), "seconds": 1.0, "tokens": 100, "details": details(k)}
                              for k in range(runs)], "error": None},
        "lockstep": {"runs": [{"tok_s": 1000 + k, "seconds": 1.0, "tokens": 100} for k in range(runs)], "error": None},
        "generate": {"runs": [{"tok_s": 2000 + k, "seconds": 0.5, "tokens": 100} for k in range(runs)], "error": None}}}
    (tmp_path / "saved.json").write_text(json.dumps(data))
    return str(tmp_path / "saved.json")


@pytest.mark.parametrize("ratio, cached, own_pct, status, verdicts", [
    (0.97, 0.95, 1.0, "done", ["PASS", "PASS", "PASS"]),
    (0.5, 0.5, 9.0, "done", ["FAIL", "FAIL", "FAIL"]),
    (0.97, 0.95, 1.0, "max_turns", ["FAIL", "PASS", "PASS"]),  # episodes that did not end as built: wrong
])
def test_episodes_bench_report_judges_the_three_targets(tmp_path: Path, capsys, ratio, cached, own_pct, status,
                                                         verdicts) -> None:
    eb = _episodes_bench()
    record = C.Record.load(_episodes_saved(tmp_path, ratio, cached, own_pct, status), out=str(tmp_path / "again.json"))
    eb.report(record)
    assert [t["verdict"] for t in record["targets"]] == verdicts
    summary = record["summary"]["fixed"]  # a record from before workloads: its one workload, "fixed"
    assert summary["ratio"] == pytest.approx(ratio)  # the headline: episodes / lockstep
    assert summary["ratio_to_generate"] == pytest.approx(ratio / 2, rel=1e-3)
    out = capsys.readouterr().out
    assert "episodes / lockstep" in out and "episodes / generate" in out and "lockstep / generate" in out
    assert "rlgen_s is not in the records" in out


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_episodes_bench_runs_on_the_cpu_backend(isolated: str, model_path: str, tmp_path: Path) -> None:
    import json
    import subprocess

    script = Path(__file__).resolve().parents[1] / "bench" / "episodes.py"
    out = tmp_path / "episodes.json"
    done = subprocess.run([sys.executable, str(script), "--backend", "cpu", "--quick", "--prompts", "1",
                           "--turns", "2", "--turn-tokens", "2", "--repeats", "3", "--model", model_path, "--out", str(out)],
                          capture_output=True, text=True, timeout=280)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    data = json.loads(out.read_text())
    assert data["complete"] and "error" not in data
    results = data["workloads"]["fixed"]["results"]
    episodes, single, lock, generate = (results[m] for m in ("episodes", "episodes-single", "lockstep", "generate"))
    assert len(episodes["runs"]) == len(single["runs"]) == len(lock["runs"]) == len(generate["runs"]) == 3
    assert not episodes["error"] and not single["error"] and not lock["error"] and not generate["error"]
    assert all(r["tokens"] == 8 for r in results["per-episode"]["runs"])
    for run in lock["runs"]:  # one request of both episodes per turn, the same sampled tokens
        assert run["tokens"] == 8 and run["details"]["request_sizes"] == [2, 2]
    for run in episodes["runs"]:  # each turn: both episodes' in one request, or in one each (an episode
        # answered first goes on at once, and a loaded machine may start one past the 5 ms window);
        # the window itself is tested in tests/test_sender.py
        sizes = run["details"]["turn_requests"]
        assert len(sizes) == 2 and all(sorted(s) in ([2], [1, 1]) for s in sizes)
        assert run["details"]["requests"] == sum(len(s) for s in sizes)
    for run in episodes["runs"] + single["runs"]:
        d = run["details"]
        assert d["statuses"] == {"done": 2} and d["short_episodes"] == 0
        assert run["tokens"] == 8 and d["own"]["source"] == "requests" and d["cache"]["share"] > 0
    for run in single["runs"]:  # one request per turn: the request log times each of them
        d = run["details"]
        assert d["requests"] == 4  # 2 episodes x 2 turns
        assert len(d["per_episode"]["own_s"]) == 2 and None not in d["per_episode"]["own_s"]
    assert all(r["tokens"] == 8 for r in generate["runs"])
    assert [t["target"].split(" ")[1] for t in data["targets"]] == ["episodes", "prefix-cache", "rlgen's"]
    assert all(t["interval"] is not None for t in data["targets"])  # three repeats: intervals to judge on
    assert data["environment"]["command"].endswith(str(out)) and data["environment"]["rlgen_commit"]["commit"]
    assert "targets" in done.stdout and "episodes / the hand-written lockstep loop" in done.stdout


# ---------------------------------------------------------------------------------------------
# bench/run_log.py: smoke runs on a log of 6 steps (one round of every scenario, the sizes; the
# breakdowns and the trend's PNGs only in the slow one: matplotlib takes ~1 s a PNG here), and the
# report of the kept full run again


def _run_log(tmp_path: Path, *extra: str) -> tuple[dict, str]:
    import json
    import subprocess

    script = Path(__file__).resolve().parents[1] / "bench" / "run_log.py"
    out = tmp_path / "run_log.json"
    done = subprocess.run([sys.executable, str(script), "--quick", "--dir", str(tmp_path), *extra, "--out", str(out)],
                          capture_output=True, text=True, timeout=110)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    data = json.loads(out.read_text())
    assert data["complete"] and data["log"]["rows"] == 6 * 4 * 4 and data["log"]["parts"] == 6
    assert data["environment"]["command"].endswith(str(out)) and data["environment"]["rlgen_commit"]["commit"]
    per_row = data["sizes"]["per_row"]
    assert per_row["parts"] > per_row["parts_without_logprobs"] > per_row["trl"] > 0
    assert "Bytes per row" in done.stdout and "Targets" in done.stdout
    assert list(tmp_path.iterdir()) == [out]  # the built log removed
    return data, done.stdout


def _one_round_each(per: dict, names: list[str]) -> None:
    assert list(per) == names
    for name in names:
        assert per[name]["warmup"]["wrong"] is None and len(per[name]["runs"]) == 1
        assert per[name]["runs"][0]["wrong"] is None and per[name]["runs"][0]["seconds"] > 0


RESCORED = ["rescore_process", "in_memory_process", "rescore_inline", "in_memory_inline"]


@pytest.mark.timeout(60)
def test_run_log_bench_quick_rescore_checks_every_scenario_and_sizes_the_parts(tmp_path: Path) -> None:
    data, _ = _run_log(tmp_path, "--phases", "rescore")
    _one_round_each(data["phases"]["rescore"], RESCORED)
    assert [t["verdict"] for t in data["targets"]] == ["n/a"] * 2  # one run a side: no interval to judge on


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_run_log_bench_quick_run_times_checks_breaks_down_and_sizes_every_scenario(tmp_path: Path) -> None:
    data, _ = _run_log(tmp_path)
    _one_round_each(data["phases"]["trend"], ["trend_cold", "trend_warm"])
    _one_round_each(data["phases"]["rescore"], RESCORED)
    assert [t["verdict"] for t in data["targets"]] == ["n/a"] * 3
    stages = data["breakdown"]
    assert "plot: render PNG" in stages["trend_cold"][0] and "score (rewards_columns)" in stages["rescore_inline"][0]
    assert stages["version_files"]["files"] == 6


@pytest.mark.timeout(90)
def test_run_log_bench_quick_scale_times_trend_with_and_without_summaries_and_one_step(tmp_path: Path) -> None:
    data, out = _run_log(tmp_path, "--phases", "scale", "--scale-repeats", "1")
    scale = data["scale"]
    assert list(scale) == ["trend_local", "step_local", "step_open_local", "trend_no_summaries_local"]
    assert [r["rows"] for r in (scale["trend_local"][0], scale["trend_no_summaries_local"][0])] == [96, 96]
    assert scale["step_local"][0]["rows"] == 16 and all(r[0]["s"] > 0 and r[0]["peak_rss_mib"] > 0 for r in scale.values())
    assert "Scale: fresh interpreters" in out and " 1/1 " in out


def test_run_log_bench_reports_the_kept_run_again_with_its_verdicts(tmp_path: Path, capsys) -> None:
    import importlib.util

    path = Path(__file__).resolve().parents[1] / "bench" / "run_log.py"
    spec = importlib.util.spec_from_file_location("bench_run_log", path)
    assert spec is not None and spec.loader is not None
    run_log = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = run_log  # its dataclasses look their module up there
    spec.loader.exec_module(run_log)
    saved = Path(__file__).resolve().parents[1] / "docs/bench-cpu/run_log-2026-12-03.json"
    record = C.Record.load(str(saved), out=str(tmp_path / "again.json"))
    run_log.report(record)
    assert [(t["verdict"], t["how"]) for t in record["targets"]] == [
        ("MISS", "interval straddles the bound"), ("MISS", "whole interval beyond"), ("MISS", "whole interval beyond")]
    assert record["targets"][0]["value"] == pytest.approx(2.112, abs=1e-3)
    out = capsys.readouterr().out
    assert "Where trend_cold's time goes" in out and "4.17x" in out


@pytest.mark.timeout(120)
def test_the_episodes_client_bench_runs_against_its_instant_server(model_path: str, tmp_path: Path) -> None:
    import json
    import subprocess

    script = Path(__file__).resolve().parents[1] / "bench" / "episodes_client.py"
    out = tmp_path / "client.json"
    done = subprocess.run([sys.executable, str(script), "--prompts", "2", "--n", "2", "--turns", "2", "--turn-tokens", "4",
                           "--repeats", "3", "--model", model_path, "--out", str(out), "--server-ms", "50"],
                          capture_output=True, text=True, timeout=100)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    data = json.loads(out.read_text())
    for method in ("episodes", "lockstep"):  # 4 episodes x 2 turns x 4 tokens, every run, GC recorded
        runs = data["results"][method]["runs"]
        assert len(runs) == 3 and all(r["tokens"] == 32 and "gc" in r for r in runs)
        assert all(r["seconds"] >= 0.1 for r in runs)  # two requests, each answered after 50 ms
    assert data["complete"] and data["summary"]["difference_s"] is not None
    assert "episodes - lockstep" in done.stdout
    for run in data["results"]["episodes"]["runs"]:  # each call's timeline: two turns, a gap between requests
        line = run["timeline"]  # (rlgen's sender may send a turn's batch in parts, each streamed: fc02ac3)
        assert line["requests"] >= 2 and len(line["between_ms"]) == line["requests"] - 1
        assert max(line["between_ms"]) < 50 and line["before_first_ms"] > 0 and line["after_last_ms"] > 0
    assert set(data["timeline"]) == {"before_first_ms", "between_ms", "after_last_ms"}


@pytest.mark.timeout(60)
def test_the_lockstep_anchor_sends_its_chats_rendered_ids_and_grows_each_history_by_its_turn(model_path: str) -> None:
    import asyncio

    import _instant_server
    import orjson
    from aiohttp import web

    from rlgen.client._tokenizer import load_tokenizer
    from rlgen.episodes import message_delta_ids

    eb = _episodes_bench()
    tok = load_tokenizer(model_path)
    chats = eb.chats(2)
    bodies: list[dict] = []
    app = _instant_server.build(model_path, 0.0)

    @web.middleware
    async def keep(request: web.Request, handler):  # type: ignore[no-untyped-def]
        if request.path == "/generate":
            bodies.append(orjson.loads(await request.read()))
        return await handler(request)

    app.middlewares.append(keep)

    async def run() -> tuple[int, list[int]]:
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        try:
            return await eb.lockstep(f"http://127.0.0.1:{port}", chats, tok, n=2, turns=2, reply=eb.REPLY,
                                     sampling={"max_new_tokens": 3, "ignore_eos": True})
        finally:
            await runner.cleanup()

    sampled, sizes = asyncio.run(run())
    assert sampled == 2 * 2 * 2 * 3 and sizes == [4, 4]
    first = [list(tok.apply_chat_template(c, add_generation_prompt=True, tokenize=True, return_dict=False))
             for c in chats]
    assert bodies[0]["input_ids"] == [first[0], first[0], first[1], first[1]]  # prompt-major ids, n a chat
    delta = message_delta_ids(tok, [{"role": "user", "content": eb.REPLY}])
    for before, after in zip(bodies[0]["input_ids"], bodies[1]["input_ids"]):
        assert after[:len(before)] == before and after[-len(delta):] == delta and len(after) == len(before) + 3 + 1 + len(delta)


def test_the_split_experiment_caps_the_runners_batches_only_while_it_is_open() -> None:
    from rlgen.episodes import _runner

    eb = _episodes_bench()
    original = _runner.Sender
    with eb.split_batches(64):
        assert _runner.Sender(None, max_in_flight=256).max_batch == 64  # type: ignore[arg-type]
        assert _runner.Sender(None, max_in_flight=16).max_batch == 16  # type: ignore[arg-type]
    assert _runner.Sender is original
    with eb.split_batches(None):
        assert _runner.Sender is original


def test_the_episodes_bench_pairs_each_repeats_two_methods_so_a_drift_that_moves_both_cancels() -> None:
    import episodes as E

    # the machine slows down 2x half-way through: both methods alike; episodes is always 0.9x lockstep
    speed = [1.0] * 5 + [0.5] * 5
    results = {"episodes": {"runs": [{"repeat": r, "tok_s": 90.0 * s} for r, s in enumerate(speed)]},
               "lockstep": {"runs": [{"repeat": r, "tok_s": 100.0 * s} for r, s in enumerate(speed)][1:]}}
    paired = E.paired_ratios(results, "episodes", "lockstep")
    assert paired == pytest.approx([0.9] * 9)  # repeat 0 has no lockstep run: left out
    # the medians of all runs do not see the pairing: a 0.9x ratio in both halves reads otherwise
    ratio = C.compare(results, "episodes", ["lockstep"])["ratio"]
    assert ratio == pytest.approx(statistics.median([90.0 * s for s in speed]) / 50.0)


def test_the_episodes_bench_draws_each_steps_latency_from_repeat_episode_and_turn_alone() -> None:
    import asyncio

    eb = _episodes_bench()
    a = eb.StepLatency(4, episodes=8, repeats=3, tail_share=0.05, tail_s=1.0)
    b = eb.StepLatency(4, episodes=8, repeats=3, tail_share=0.05, tail_s=1.0)
    assert a.table == b.table  # seeded: every method, and every process, meets the same latencies
    assert a.table[0] != a.table[1] and sorted(a.table) == [-1, 0, 1, 2]
    steps = [a.draw(r, e, t) for r in range(20) for e in range(64) for t in range(1, 5)]
    tail = sum(x == 1.0 for x in steps) / len(steps)
    assert 0.03 < tail < 0.07 and all(0.0 <= x <= 0.05 for x in steps if x != 1.0)
    uniform = eb.StepLatency(4, episodes=8, repeats=3)
    assert all(0.0 <= x <= 0.05 for rows in uniform.table.values() for row in rows for x in row)
    uniform.begin(1)
    assert uniform.latency(3, 2) == uniform.table[1][3][1] == uniform.draw(1, 3, 2)
    messages = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
    assert asyncio.run(uniform.function(messages, {"episode": 3})) == eb.REPLY
    assert asyncio.run(uniform.function(messages * 4, {"episode": 3})) == "done"  # its 4th assistant turn
    assert sorted(uniform.ended) == [(3, 1), (3, 4)]
    sync = eb.StepLatency(2, episodes=1, repeats=1, sync=True)
    assert not asyncio.iscoroutinefunction(sync.function) and sync.function(messages, {"episode": 0}) == eb.REPLY


def test_the_wait_after_env_runs_from_a_steps_end_to_the_next_requests_arrival() -> None:
    eb = _episodes_bench()
    # two episodes of three turns: episode 0's requests arrive 5 ms after its steps end; episode 1's
    # second request waits 1 s (a barrier), its third is never seen
    arrived = [[10.0, 11.005, 12.005], [10.0, 12.0, None]]
    ended = {(0, 1): 11.0, (0, 2): 12.0, (0, 3): 13.0, (1, 1): 11.0, (1, 2): 12.5}
    w = eb.waits(arrived, ended, source="test")
    assert w["n"] == 3 and w["episodes"] == 2 and w["over_100ms"] == 1
    assert w["max_ms"] == pytest.approx(1000.0) and w["p50_ms"] == pytest.approx(5.0)
    assert w["per_turn"]["2"]["max_ms"] == pytest.approx(1000.0) and w["per_turn"]["3"]["p50_ms"] == pytest.approx(5.0)
    assert w["timeline"]["arrived"][1] == [0.0, 2.0, None] and w["timeline"]["env_end"][0] == [1.0, 2.0, 3.0]
    assert eb.waits([None, []], {}, source="none")["n"] == 0
    by_rid = {"timeline-lockstep-1-0-0": 1.0, "timeline-lockstep-1-0-1": 2.0, "timeline-lockstep-1-1-0": 1.0}
    assert eb.anchor_arrivals("timeline-lockstep-1-", by_rid, 3, 2) == [[1.0, 2.0], [1.0], None]


def test_the_episodes_bench_judges_against_the_better_anchor_and_pairs_it_by_repeat() -> None:
    eb = _episodes_bench()

    def runs(*values: float) -> dict:
        return {"runs": [{"repeat": r, "tok_s": v} for r, v in enumerate(values)]}

    results = {"episodes": runs(105, 110, 100, 108, 103), "lockstep": runs(80, 82, 79, 81, 80),
               "per-episode": runs(100, 98, 99, 101, 97)}
    best = eb.versus_best(results)
    assert best["better"] == "per-episode" and best["ratio"] == pytest.approx(105 / 99)
    lo, hi = best["interval"]
    assert lo <= best["ratio"] <= hi and lo > 0.95
    assert best["paired"] == pytest.approx([105 / 100, 110 / 98, 100 / 99, 108 / 101, 103 / 97])
    del results["per-episode"]
    assert eb.versus_best(results)["better"] == "lockstep"
    assert eb.versus_best({"episodes": runs(1.0)}) is None


@pytest.mark.timeout(60)
def test_the_episodes_bench_runs_every_workload_against_the_instant_server(model_path: str, tmp_path: Path) -> None:
    import json
    import subprocess

    import episodes_client

    eb = _episodes_bench()
    proc, url = episodes_client.start_server(model_path, 0.01)
    try:
        script = Path(__file__).resolve().parents[1] / "bench" / "episodes.py"
        out = tmp_path / "workloads.json"
        done = subprocess.run([sys.executable, str(script), "--server", url, "--model", model_path, "--quick",
                               "--prompts", "2", "--n", "2", "--turns", "3", "--turn-tokens", "2",
                               "--max-new-tokens", "4", "--repeats", "3", "--workload", "fixed,eos,eos-longtail",
                               "--methods", "episodes,lockstep,per-episode", "--tail-share", "0.25", "--tail-s",
                               "0.2", "--out", str(out)], capture_output=True, text=True, timeout=50)
    finally:
        proc.kill()
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    data = json.loads(out.read_text())
    assert data["complete"] and "error" not in data and list(data["workloads"]) == ["fixed", "eos", "eos-longtail"]
    for name, entry in data["workloads"].items():
        assert "error" not in entry, entry.get("error")
        for method in ("episodes", "lockstep", "per-episode"):
            result = entry["results"][method]
            assert not result["error"] and len(result["runs"]) == 3 and all(r["tokens"] > 0 for r in result["runs"])
        statuses = [r["details"]["statuses"] for r in entry["results"]["episodes"]["runs"]]
        assert statuses == [{"done": 4}] * 3
        summary = data["summary"][name]
        for key in ("ratio", "ratio_per_episode", "ratio_best", "paired_ratio", "paired_ratio_per_episode",
                    "paired_ratio_best"):
            assert summary[key] is not None and summary[f"{key}_interval"] is not None, key
        assert summary["better_anchor"] in ("lockstep", "per-episode")
    fixed = data["workloads"]["fixed"]["results"]
    assert all(r["tokens"] == 4 * 3 * 2 for m in ("episodes", "lockstep", "per-episode") for r in fixed[m]["runs"])
    assert "timeline" not in data["workloads"]["fixed"]
    for name in ("eos", "eos-longtail"):  # one timeline run per method: a wait after each of 2 steps of 4 episodes
        timeline = data["workloads"][name]["timeline"]
        assert sorted(timeline) == ["episodes", "lockstep", "per-episode"]
        assert all(runs[0]["waits"]["n"] == 8 for runs in timeline.values())
        assert set(data["summary"][name]["waits"]) == {"episodes", "lockstep", "per-episode"}
    # the long tail's timeline run (repeat 3): lockstep's episodes wait for the turn's slowest step,
    # the per-episode loop's for nothing
    latency = eb.StepLatency(3, episodes=4, repeats=4, tail_share=0.25, tail_s=0.2)
    waits = data["workloads"]["eos-longtail"]["timeline"]
    for k in (1, 2):
        slowest = max(latency.draw(3, e, k) for e in range(4))
        for e in range(4):
            arrived = waits["lockstep"][0]["waits"]["timeline"]["arrived"][e][k]
            ended = waits["lockstep"][0]["waits"]["timeline"]["env_end"][e][k - 1]
            assert arrived - ended >= slowest - latency.draw(3, e, k) - 0.01
    assert waits["per-episode"][0]["waits"]["max_ms"] < 100
    assert [t["target"] for t in data["targets"]][3:] == [
        f"{name}: episodes / the better hand-written loop ({data['summary'][name]['better_anchor']}) (tok/s)"
        for name in ("eos", "eos-longtail")]
    assert data["environment"]["command"].endswith(str(out)) and data["environment"]["rlgen_commit"]["commit"]
    assert data["environment"]["packages"]["aiohttp"] and "wait after env" in done.stdout


@pytest.mark.timeout(120)
def test_the_in_process_episodes_bench_weighs_each_piece_and_puts_it_back(model_path: str, tmp_path: Path) -> None:
    import json
    import subprocess

    import episodes_inprocess as ip

    from rlgen.episodes import _env

    contained = _env.call_contained
    with ip.experiment("episodes-nocontain"):
        assert _env.call_contained is not contained
    assert _env.call_contained is contained  # put back
    script = Path(__file__).resolve().parents[1] / "bench" / "episodes_inprocess.py"
    out = tmp_path / "inprocess.json"
    done = subprocess.run([sys.executable, str(script), "--repeats", "1", "--model", model_path, "--out", str(out)],
                          capture_output=True, text=True, timeout=110)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    data = json.loads(out.read_text())
    assert sorted(data["ms"]) == ["episodes", "episodes-nocontain", "lockstep"]
    assert all(len(v) == 1 and v[0] > 0 for v in data["ms"].values())
    assert set(data["differences"]) == {"episodes - lockstep", "saved by episodes-nocontain"}


# ---------------------------------------------------------------------------------------------
# bench/offpolicy.py: issue 46's performance bench, a smoke run on the CPU backend (4 prompts x 8
# tokens, 2 repeats: too few runs for an interval, so every verdict is n/a) and its report again


def run_offpolicy(args: list[str], model_path: str, out: Path, *, timeout: float) -> tuple[Any, dict[str, Any]]:
    """bench/offpolicy.py on the CPU backend (4 prompts x 8 tokens, --quick) with `args`: the finished
    process (exit 0 asserted) and its JSON."""
    import json
    import subprocess

    script = Path(__file__).resolve().parents[1] / "bench" / "offpolicy.py"
    done = subprocess.run([sys.executable, str(script), *args, "--backend", "cpu", "--quick", "--prompts", "4",
                           "--max-new-tokens", "8", "--model", model_path, "--out", str(out)],
                          capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return done, json.loads(out.read_text())


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_offpolicy_bench_runs_both_phases_on_the_cpu_backend_and_reports_again(isolated: str, model_path: str,
                                                                              tmp_path: Path) -> None:
    import json
    import subprocess

    script = Path(__file__).resolve().parents[1] / "bench" / "offpolicy.py"
    out = tmp_path / "offpolicy.json"
    done, data = run_offpolicy(["--repeats", "2"], model_path, out, timeout=140)
    assert data["complete"] and "error" not in data, data.get("error")
    assert data["sizes"]["stream_interval"] == 3 and data["trainer_model"]["push"] == "tensor"
    span = data["span"]["methods"]
    assert list(span) == ["none", "abort", "retract", "in_place", "push"] and not data["span"]["cut_short"]
    for name, result in span.items():
        assert result["error"] is None and len(result["runs"]) == 2, (name, result.get("error"))
        for run in result["runs"]:
            assert run["wrong"] is None and run["checks"] == [], (name, run)
            assert run["version_after"] == run["version_before"] + (name != "none")
            if name == "push":
                assert run["update_s"] > 0
                continue
            before, by_version = run["version_before"], run["tokens_by_version"]
            assert run["tokens"] == sum(by_version.values()) == 4 * 8  # every token sampled once, with its version
            if name == "none":
                assert by_version == {str(before): 32} and run["update_s"] is None
            else:  # old tokens first, then the new version's to every row's end
                assert set(by_version) == {str(before), str(before + 1)} and run["rows_ending_new"] == 4
                assert run["update_s"] > 0 and run["trigger"]["streamed"] >= 0.3 * 32 and not run["trigger"].get("late")
    assert all(r["n_segments_max"] >= 2 and r["reprefill_tokens"] > 0 for r in span["abort"]["runs"])
    assert all(r["num_retractions_sum"] >= 1 for r in span["retract"]["runs"])
    assert all(r["n_segments_max"] == 1 and r["num_retractions_sum"] == 0 for r in span["in_place"]["runs"])
    assert data["span"]["fastest"]["fastest"] in ("abort", "retract", "in_place")
    trainer = data["trainer"]
    assert trainer["rollouts"]["wrong"] is None and trainer["rollouts"]["scored_tokens"] == 32
    for name in ("sampler_vs_trainer", "forward"):
        assert trainer["methods"][name]["error"] is None and len(trainer["methods"][name]["runs"]) == 2
    assert trainer["mismatch"]["tokens"] == 32 and abs(trainer["mismatch"]["k3_kl"]) < 1e-3  # the same float32 weights
    targets = [t["target"] for t in data["targets"]]
    assert len(targets) == 7 and all(t["verdict"] == "n/a" for t in data["targets"])  # 2 runs: no interval
    assert [t.split(":")[0] for t in targets[:6]] == ["abort", "retract", "in_place"] * 2
    assert targets[6].startswith("sampler_vs_trainer")
    assert data["environment"]["command"].endswith(str(out)) and data["environment"]["rlgen_commit"]["commit"]
    for text in ("span: every run", "Targets, span", "Fastest mode", "Targets, trainer"):
        assert text in done.stdout
    again = subprocess.run([sys.executable, str(script), "--report-only", str(out), "--out", str(tmp_path / "again.json")],
                           capture_output=True, text=True, timeout=60)
    assert again.returncode == 0, again.stderr[-2000:]
    assert json.loads((tmp_path / "again.json").read_text())["targets"] == data["targets"]


# bench/offpolicy.py's phase deterministic on the CPU backend: the off arm runs (4 prompts x 8 tokens,
# sampled twice with one seed), the on arm is skipped (the CPU server has no deterministic mode)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_offpolicy_bench_deterministic_phase_runs_the_off_arm_and_skips_on_on_the_cpu_backend(
        isolated: str, model_path: str, tmp_path: Path) -> None:
    import math

    out = tmp_path / "offpolicy.json"
    done, data = run_offpolicy(["--phases", "deterministic"], model_path, out, timeout=110)
    assert data["complete"] and "error" not in data, data.get("error")
    assert data["phases"] == ["deterministic"] and "span" not in data and "trainer" not in data
    phase = data["deterministic"]
    assert "error" not in phase and phase["cut_short"] is None
    off, on = phase["arms"]["off"], phase["arms"]["on"]
    assert off["status"] == "ran" and off["server_args"] == [] and off["start_s"] > 0, off.get("error")
    m = off["mismatch"]
    assert m["tokens"] == 32 and off["batch"]["tokens"] == 32 and off["batch"]["tok_s"] > 0
    for key in ("abs_log_ratio_mean", "abs_log_ratio_max", "k3_kl", "tis_token_clip_fraction",
                "mis_token_mask_fraction"):
        assert isinstance(m[key], float) and math.isfinite(m[key]) and m[key] >= 0, (key, m[key])
    assert m["abs_log_ratio_mean"] < 1e-3 and m["tis_token_clip_fraction"] == m["mis_token_mask_fraction"] == 0
    rerun = off["rerun"]  # the CPU backend honours sampling_seed: the same ids again
    assert rerun["identical_ids"] is True and rerun["rows"] == rerun["rows_identical"] == 4
    assert rerun["tokens_differing"] == 0 and rerun["logprob_positions_compared"] == 32
    assert 0 <= rerun["max_abs_logprob_diff"] < 1e-3 and rerun["tokens"] == 32
    assert on["status"] == "skipped" and "CPU backend" in on["reason"] and "mismatch" not in on
    assert phase["removed"]["share"] is None and phase["removed"]["off"] == m["abs_log_ratio_mean"]
    assert data["trainer_model"]["device"] == "cpu" and data["targets"] == []
    for text in ("deterministic: sampler vs trainer", "mismatch removed by deterministic mode: n/a",
                 "run to run, off: sampled ids identical"):
        assert text in done.stdout
