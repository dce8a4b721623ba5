"""`res.plot`: the five reward plots over real scored Rollouts (Agg, no display), their errors, that
`import rlgen` stays free of matplotlib, and that a Jupyter kernel shows each plot exactly once."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

matplotlib = pytest.importorskip("matplotlib")
matplotlib.use("Agg")

from matplotlib.axes import Axes  # noqa: E402
from matplotlib.collections import LineCollection, PathCollection  # noqa: E402
from matplotlib.colors import to_rgba  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.patches import Rectangle  # noqa: E402

from rlgen.rollouts import Rollouts, rollouts_from_responses  # noqa: E402
from rlgen.rollouts._plots import FINISH_COLORS, ZERO_STD_COLOR, RolloutPlots  # noqa: E402

N_PROMPTS, N = 16, 8
MAX_TOKENS = 512


def realistic_rollouts(n_prompts: int = N_PROMPTS, n: int = N, seed: int = 0) -> Rollouts:
    """Prompts of every difficulty: some always solved, some never (zero-variance groups), some
    truncated samples, a few failed requests, and rewards that are sometimes not scored."""
    rng = np.random.default_rng(seed)
    entries: list[dict | None] = []
    solved, fmt = [], []
    for p in range(n_prompts):
        skill = 1.0 if p < 3 else 0.0 if p < 5 else rng.uniform(0.15, 0.85)
        for s in range(n):
            if (p, s) in ((7, 3), (12, 5)):
                entries.append(None)  # a failed request: finish_reason "error"
                solved.append(None)
                fmt.append(0.0)
                continue
            truncated = p >= 5 and rng.random() < 0.15
            tokens = MAX_TOKENS if truncated else int(rng.integers(40, 420))
            entries.append({"text": f"sample {p}/{s}", "output_ids": list(range(1, tokens + 1)),
                            "meta_info": {"finish_reason": {"type": "length" if truncated else "stop"},
                                          "completion_tokens": tokens}})
            ok = rng.random() < skill and not truncated
            solved.append(None if truncated and rng.random() < 0.5 else float(ok))
            fmt.append(0.0 if truncated else float(rng.choice([0.5, 1.0], p=[0.3, 0.7])))
    res = rollouts_from_responses(entries, prompt_ids=[[1, 2, 3]] * n_prompts, n=n, pad_token_id=0)
    return res.with_columns({"solved": solved, "fmt": fmt})


def correct(solved: float) -> float | None:
    return None if math.isnan(solved) else solved  # None: no answer found, status "none"


def formatting(fmt: float, completion: str) -> float:
    if completion == "sample 9/1":
        raise RuntimeError("cannot parse")
    return fmt


def brevity(completion_tokens: int) -> float:
    return 1.0 - completion_tokens / MAX_TOKENS


@pytest.fixture(scope="module")
def res() -> Rollouts:
    return realistic_rollouts().add_rewards({"correct": correct, "format": formatting, "brevity": brevity},
                                            weights={"brevity": 0.2}, mode="thread", workers=1)


@pytest.fixture(scope="module")
def scored() -> Rollouts:
    """Only `correct`: a 0/1 reward whose groups are often all-equal."""
    return realistic_rollouts().add_rewards({"correct": correct}, mode="inline")


def bars(ax: Axes) -> list[Rectangle]:
    return [p for c in ax.containers for p in c.patches]


def points(ax: Axes) -> int:
    return sum(len(c.get_offsets()) for c in ax.collections if isinstance(c, PathCollection))


# -- what each plot draws --------------------------------------------------------------------------
def test_rewards_draws_one_panel_per_function_with_bars_stacked_by_finish_reason(res: Rollouts) -> None:
    fig = res.plot.rewards()
    assert type(fig).__mro__[1] is Figure and len(fig.axes) == 3
    correct_ax, format_ax, brevity_ax = fig.axes
    df = res.df
    for ax, column in zip(fig.axes, ["reward_correct", "reward_format", "reward_brevity"]):
        assert sum(p.get_height() for p in bars(ax)) == df[column].notna().sum()
    # 0/1 and 0/0.5/1 rewards: one bar per value and finish reason present there; brevity: histogram bins
    per_value = df.dropna(subset=["reward_correct"]).groupby(["reward_correct", "finish_reason"]).size()
    assert len(bars(correct_ax)) == len(per_value)
    assert [t.get_text() for t in format_ax.get_xticklabels()] == ["0", "0.5", "1"]
    assert len({round(p.get_width(), 9) for p in bars(brevity_ax)}) == 1 and len(bars(brevity_ax)) > 3
    stop = to_rgba(FINISH_COLORS["stop"])
    assert sum(p.get_height() for p in bars(format_ax) if p.get_facecolor() == stop) == \
        df.loc[df.finish_reason.eq("stop") & df.reward_format.notna()].shape[0]
    assert [t.get_text().split(" ")[0] for t in fig.legends[0].get_texts()] == ["stop", "length", "error"]


def test_rows_not_scored_are_counted_in_each_panel_title_by_status(res: Rollouts) -> None:
    fig = res.plot.rewards(["correct", "reward_format", "reward"])
    titles = [ax.get_title() for ax in fig.axes]
    n_none = int((res.df.reward_correct_status == "none").sum())
    assert n_none > 0
    assert f"{len(res.df) - n_none} rows scored, {n_none} not scored ({n_none} none)" in titles[0]
    assert "1 not scored (1 error)" in titles[1]
    assert titles[2].startswith("reward (combined)") and "not scored" not in titles[2]


def test_rewards_can_split_by_nothing_or_use_given_bins_and_axes(res: Rollouts) -> None:
    fig = res.plot.rewards("brevity", by=None, bins=5)
    (ax,) = fig.axes
    assert len(bars(ax)) == 5 and not fig.legends
    mine = Figure()
    left, right = mine.subplots(1, 2)
    assert res.plot.rewards(["correct", "format"], ax=[left, right]) is mine
    assert bars(left) and bars(right) and right.get_legend() is not None
    with pytest.raises(ValueError, match="2 panel"):
        res.plot.rewards(["correct", "format"], ax=left)


def test_reward_vs_length_draws_each_scored_row_coloured_by_finish_reason_with_the_correlation(res: Rollouts) -> None:
    ax = res.plot.reward_vs_length()
    assert isinstance(ax, Axes)
    df = res.df
    by_colour = {tuple(c.get_facecolor()[0][:3]): len(c.get_offsets()) for c in ax.collections}
    for reason, n in df.finish_reason.value_counts().items():
        assert by_colour[to_rgba(FINISH_COLORS[reason])[:3]] == n
    x, y = df.completion_tokens.to_numpy(float), df.reward.to_numpy(float)
    assert f"r = {np.corrcoef(x, y)[0, 1]:.2f}" in ax.get_title()
    assert ax.get_xlabel() == "completion tokens"


def test_a_discrete_reward_is_jittered_a_little_and_nan_rows_are_left_out(scored: Rollouts) -> None:
    ax = scored.plot.reward_vs_length("reward_correct")
    y = np.concatenate([c.get_offsets()[:, 1] for c in ax.collections])
    n_scored = int(scored.df.reward_correct.notna().sum())
    assert len(y) == points(ax) == n_scored
    assert len(np.unique(y)) > 2 and np.abs(y - np.round(y)).max() < 0.1
    assert "(jittered)" in ax.get_ylabel() and f"{len(scored.df) - n_scored} not scored" in ax.get_title()


def test_groups_marks_and_counts_the_zero_variance_groups(scored: Rollouts) -> None:
    ax = scored.plot.groups("reward_correct")
    df = scored.df
    values = df.groupby("prompt_index").reward_correct.agg(lambda r: r.dropna().nunique())
    n_zero = int((values == 1).sum())
    assert n_zero == 7  # prompts 0-2 always solved, 3-4 never, and two where every scored sample agrees
    assert f"{n_zero} of {N_PROMPTS} groups have zero variance" in ax.get_title()
    zero_means = [c for c in ax.collections if c.get_label().startswith("zero-variance")]
    assert len(zero_means[0].get_offsets()) == n_zero
    assert to_rgba(zero_means[0].get_facecolor()[0]) == to_rgba(ZERO_STD_COLOR)
    assert sum(isinstance(p, Rectangle) for p in ax.patches) == n_zero  # the purple bands
    (ranges,) = [c for c in ax.collections if isinstance(c, LineCollection)]
    assert len(ranges.get_segments()) == N_PROMPTS - n_zero


def test_groups_draws_every_scored_sample_beside_its_group_sorted_by_mean(res: Rollouts) -> None:
    ax = res.plot.groups()
    samples = [c for c in ax.collections if isinstance(c, PathCollection) and "(" in c.get_label()
               and not c.get_label().startswith(("zero", "group"))]
    assert sum(len(c.get_offsets()) for c in samples) == res.df.reward.notna().sum()
    (means,) = [c for c in ax.collections if c.get_label().startswith("group mean")]
    y = means.get_offsets()[:, 1]
    assert (np.diff(y) >= 0).all() and len(y) == N_PROMPTS
    by_prompt = res.df.groupby("prompt_index").reward.mean().sort_values(kind="stable")
    assert [t.get_text() for t in ax.get_xticklabels()] == [str(p) for p in by_prompt.index]
    unsorted = res.plot.groups(sort=False)
    assert [t.get_text() for t in unsorted.get_xticklabels()] == [str(p) for p in range(N_PROMPTS)]


def test_many_groups_are_labelled_by_rank() -> None:
    big = realistic_rollouts(n_prompts=60, n=4, seed=2).add_rewards({"correct": correct}, mode="inline")
    ax = big.plot.groups()
    assert len(ax.get_xticks()) < 15 and "ranked" in ax.get_xlabel()


def test_advantages_shows_every_scored_row_and_the_zeros_of_zero_variance_groups(scored: Rollouts) -> None:
    ax = scored.plot.advantages()
    df = scored.df
    assert sum(p.get_height() for p in bars(ax)) == df.advantage.notna().sum()
    purple = [p for p in bars(ax) if p.get_facecolor() == to_rgba(ZERO_STD_COLOR)]
    n_zero_rows = int((df.group_zero_std & df.advantage.notna()).sum())
    assert len(purple) == 1 and purple[0].get_height() == n_zero_rows
    left, right = purple[0].get_x(), purple[0].get_x() + purple[0].get_width()
    assert left < 0 < right and abs(left + right) < 1e-9  # the zero bin is centred on 0
    assert f"{n_zero_rows} rows of 7 zero-variance groups are exactly 0" in ax.get_title()
    assert f"{df.advantage.isna().sum()} not scored" in ax.get_title()


def test_advantages_without_zero_variance_groups_says_so(res: Rollouts) -> None:
    ax = res.plot.advantages(by=None, bins=8)
    assert "no zero-variance groups" in ax.get_title()
    assert len(bars(ax)) <= 9 and sum(p.get_height() for p in bars(ax)) == len(res.df)


def test_pass_at_k_plots_res_pass_at_k_for_every_k_on_a_log2_axis(scored: Rollouts) -> None:
    ax = scored.plot.pass_at_k()
    (line,) = ax.get_lines()
    ks = list(range(1, N + 1))
    assert list(line.get_xdata()) == ks
    np.testing.assert_allclose(line.get_ydata(), scored.pass_at_k(ks).to_numpy())
    assert ax.get_xscale() == "log" and ax.xaxis.get_transform().base == 2
    assert "reward ≥ 1" in ax.get_title() and f"{N_PROMPTS} prompts × {N} samples" in ax.get_title()
    two = scored.plot.pass_at_k([1, 4], correct="reward_correct", threshold=0.5)
    assert list(two.get_lines()[0].get_xdata()) == [1, 4]
    with pytest.raises(ValueError, match="more than the 8 samples"):
        scored.plot.pass_at_k(16)


def test_finish_reasons_have_the_same_colour_in_every_plot(res: Rollouts) -> None:
    length = to_rgba(FINISH_COLORS["length"])
    hist = res.plot.rewards("brevity")
    scatter = res.plot.reward_vs_length()
    groups = res.plot.groups()
    assert any(p.get_facecolor() == length for p in bars(hist.axes[0]))
    for ax in (scatter, groups):
        (dots,) = [c for c in ax.collections if c.get_label().startswith("length")]
        assert to_rgba(dots.get_facecolor()[0])[:3] == length[:3]


# -- errors ----------------------------------------------------------------------------------------
def test_a_misspelt_column_says_did_you_mean(res: Rollouts) -> None:
    with pytest.raises(ValueError, match="did you mean 'reward_correct'"):
        res.plot.reward_vs_length("reward_corect")
    with pytest.raises(ValueError, match="did you mean 'correct'"):
        res.plot.rewards(["corect"])
    with pytest.raises(ValueError, match="did you mean 'reward'"):
        res.plot.pass_at_k(correct="rewad")
    with pytest.raises(ValueError, match="did you mean 'finish_reason'"):
        res.plot.rewards(by="finish")


def test_plots_before_add_rewards_say_to_add_rewards_first() -> None:
    bare = realistic_rollouts(n_prompts=2, n=2)
    for draw in (bare.plot.rewards, bare.plot.groups, bare.plot.advantages, bare.plot.reward_vs_length,
                 bare.plot.pass_at_k):
        with pytest.raises(ValueError, match=r"add rewards first: res\.add_rewards\(\.\.\.\)"):
            draw()


def test_a_column_with_many_values_cannot_split_the_bars(res: Rollouts) -> None:
    with pytest.raises(ValueError, match="distinct values"):
        res.plot.rewards(by="completion_tokens")


def test_without_matplotlib_a_plot_says_how_to_install_it(res: Rollouts, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(ImportError, match=r"pip install 'rlgen\[plots\]'"):
        res.plot.groups()


def test_import_rlgen_and_res_plot_do_not_import_matplotlib() -> None:
    code = ("import sys, rlgen; from rlgen.rollouts._plots import RolloutPlots; "
            "assert 'matplotlib' not in sys.modules, 'matplotlib imported'; print(repr(RolloutPlots(None)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "rewards, reward_vs_length, groups, advantages, pass_at_k" in out.stdout


# -- display ---------------------------------------------------------------------------------------
def test_plots_show_themselves_as_png_and_leave_no_pyplot_figure_open(res: Rollouts) -> None:
    import matplotlib.pyplot as plt

    assert isinstance(res.plot, RolloutPlots) and res.plot._res is res
    before = plt.get_fignums()
    drawn = [res.plot.rewards(), res.plot.reward_vs_length(), res.plot.groups(), res.plot.advantages(),
             res.plot.pass_at_k()]
    assert plt.get_fignums() == before
    assert isinstance(drawn[0], Figure) and all(isinstance(a, Axes) for a in drawn[1:])
    for shown in drawn:
        assert shown._repr_png_().startswith(b"\x89PNG")


def test_ax_draws_into_the_given_axes(res: Rollouts) -> None:
    fig = Figure()
    left, right = fig.subplots(1, 2)
    assert res.plot.groups(ax=left) is left and res.plot.advantages(ax=right) is right
    assert left.collections and bars(right) and len(fig.axes) == 2
    with pytest.raises(TypeError, match="matplotlib Axes"):
        res.plot.groups(ax=fig)


def test_the_legend_stays_outside_the_axes_only_where_the_figure_has_room_for_it(res: Rollouts) -> None:
    crowded = Figure().subplots(1, 2)[0]
    roomy = Figure(layout="constrained").subplots(1, 2)[0]
    for ax, outside in ((crowded, False), (roomy, True), (res.plot.groups(), True)):
        if not ax.get_legend():
            res.plot.groups(ax=ax)
        assert bool(ax.get_legend().get_bbox_to_anchor().x0 > ax.bbox.x1) is outside


JUPYTER_CELLS = {
    "axes": "res.plot.groups()",
    "figure": "res.plot.rewards()",
    "assigned": "ax = res.plot.groups()",
    "pyplot": "import matplotlib.pyplot as plt\n%matplotlib inline",
    "axes after pyplot": "res.plot.groups()",
    "figure after pyplot": "res.plot.rewards()",
    "into plt.subplots": "fig, axs = plt.subplots(1, 2)\nres.plot.groups(ax=axs[0])\nres.plot.advantages(ax=axs[1])",
    "open figures": "print(plt.get_fignums())",
}


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_in_a_jupyter_kernel_each_plot_shows_exactly_once() -> None:
    jupyter_client = pytest.importorskip("jupyter_client")
    here = Path(__file__).resolve().parent
    km = jupyter_client.KernelManager(kernel_name="python3")
    env = {k: v for k, v in os.environ.items() if k != "MPLBACKEND"}  # the kernel picks its own (inline)
    # The repo and the tests first, then whatever the caller's path holds (where ipykernel may live).
    path = os.pathsep.join(p for p in (str(here.parent), str(here), env.get("PYTHONPATH", "")) if p)
    km.start_kernel(env={**env, "PYTHONPATH": path})
    kc = km.client()
    kc.start_channels()
    try:
        kc.wait_for_ready(timeout=60)
        setup = ("import rlgen\nfrom test_plots import realistic_rollouts, correct\n"
                 "res = realistic_rollouts().add_rewards({'correct': correct}, mode='inline')\n"
                 "print(rlgen.__file__)")
        outputs, status = run_cell(kc, setup)
        assert status == "ok" and outputs[-1]["text/plain"].startswith(str(here.parent)), outputs
        images = {}
        for name, code in JUPYTER_CELLS.items():
            outputs, status = run_cell(kc, code)
            assert status == "ok", (name, outputs)
            images[name] = sum("image/png" in data for data in outputs)
            if name == "open figures":
                assert outputs == [{"text/plain": "[]\n"}], outputs
        assert images == {"axes": 1, "figure": 1, "assigned": 0, "pyplot": 0, "axes after pyplot": 1,
                          "figure after pyplot": 1, "into plt.subplots": 1, "open figures": 0}
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def run_cell(kc, code: str, timeout: float = 120) -> tuple[list[dict], str]:
    """The cell's display data (stream text as text/plain) and its status."""
    msg_id = kc.execute(code)
    outputs: list[dict] = []
    deadline = time.monotonic() + timeout
    while True:
        msg = kc.get_iopub_msg(timeout=max(1.0, deadline - time.monotonic()))
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        kind, content = msg["msg_type"], msg["content"]
        if kind in ("display_data", "execute_result"):
            outputs.append(content["data"])
        elif kind == "stream":
            outputs.append({"text/plain": content["text"]})
        elif kind == "error":
            outputs.append({"error": "\n".join(content["traceback"])})
        elif kind == "status" and content["execution_state"] == "idle":
            break
    reply = kc.get_shell_msg(timeout=10)
    return outputs, reply["content"]["status"]
