"""Figures that show themselves in Jupyter: the matplotlib plumbing shared by every plot of rlgen.

Owns: importing matplotlib with a message that names the extra (`require_matplotlib`), Figure and
Axes classes that render as PNG in a notebook (`figure_classes`), new axes and panel grids, the
user's own axes checked, the figure an axes lives in, and the legend's placement. Knows nothing
about rollouts, rewards or what is plotted: `rollouts._plots` and `rlgen.compare` draw with these.
"""

from __future__ import annotations

import functools
import io
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = ["figure_classes", "legend", "new_axes", "nothing_scored", "panels", "require_matplotlib", "root_figure",
           "user_axes"]

INSTALL = "plotting needs matplotlib: pip install 'rlgen[plots]'"


def require_matplotlib() -> None:
    try:
        import matplotlib  # noqa: F401
    except ImportError as e:
        raise ImportError(INSTALL) from e


def png(fig: Figure) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", bbox_inches="tight")
    return buf.getvalue()


@functools.cache
def figure_classes() -> tuple[type[Figure], type[Axes]]:
    """A Figure and an Axes that show themselves as PNG in Jupyter (plain matplotlib otherwise)."""
    from matplotlib.axes import Axes as _Axes
    from matplotlib.figure import Figure as _Figure

    class Figure(_Figure):  # named as matplotlib's, so reprs read as usual
        def _repr_png_(self) -> bytes:
            return png(self)

    class Axes(_Axes):
        def _repr_png_(self) -> bytes:
            return png(root_figure(self))

    return Figure, Axes


def new_axes(ax: Axes | None) -> Axes:
    if ax is not None:
        return user_axes(ax, 1)[0]
    figure_class, axes_class = figure_classes()
    fig = figure_class(layout="constrained")
    return fig.add_subplot(axes_class=axes_class)


def panels(n: int) -> tuple[Figure, list[Axes]]:
    """A new figure of n panels: one row up to 3, then rows of 2 (4) or 3."""
    import matplotlib as mpl

    figure_class, axes_class = figure_classes()
    ncols = n if n <= 3 else 2 if n == 4 else 3
    nrows = math.ceil(n / ncols)
    width, height = (float(v) for v in mpl.rcParams["figure.figsize"])
    size = (width, height) if n == 1 else (width * (1.5 if ncols == 2 else 2.0), height * 0.75 * nrows)
    fig = figure_class(figsize=size, layout="constrained")
    axes = [fig.add_subplot(nrows, ncols, i + 1, axes_class=axes_class) for i in range(n)]
    return fig, axes


def user_axes(ax: Axes | Sequence[Axes], n: int) -> list[Axes]:
    from matplotlib.axes import Axes as _Axes

    axes = [ax] if isinstance(ax, _Axes) else list(ax) if isinstance(ax, Sequence) else [ax]
    if not all(isinstance(a, _Axes) for a in axes):
        raise TypeError(f"ax must be a matplotlib Axes (or one per panel), got {type(ax).__name__}")
    if len(axes) != n:
        raise ValueError(f"this plot has {n} panel(s) but ax gives {len(axes)} axes")
    return axes


def root_figure(ax: Axes) -> Figure:
    """The figure `ax` is drawn in (through any SubFigures)."""
    from matplotlib.figure import Figure as _Figure

    try:
        fig: Any = ax.get_figure(root=True)
    except TypeError:  # matplotlib < 3.10: no root=; a SubFigure's .figure is the figure it lives in
        fig = ax.get_figure()
        while fig is not None and not isinstance(fig, _Figure):
            fig = fig.figure
    if not isinstance(fig, _Figure):
        raise ValueError("ax is not on a figure")
    return fig


def nothing_scored(ax: Axes) -> None:
    ax.text(0.5, 0.5, "no scored rows", ha="center", va="center", transform=ax.transAxes, color="0.4")


def legend(ax: Axes, *, handles: list[Any] | None = None, title: str | None = None,
            markerscale: float = 1.0) -> None:
    """A legend right of the axes, where it covers no data; inside them ("best" place) when other
    axes share a figure without constrained layout, where it would cover its neighbour."""
    from matplotlib.layout_engine import ConstrainedLayoutEngine

    fig = root_figure(ax)
    room = len(fig.axes) == 1 or isinstance(fig.get_layout_engine(), ConstrainedLayoutEngine)
    kwargs: dict[str, Any] = {"fontsize": "small", "title": title, "title_fontsize": "small",
                              "markerscale": markerscale}
    if room:
        kwargs.update(loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0, frameon=False)
    else:
        kwargs.update(loc="best", framealpha=0.8)
    if handles is not None:
        kwargs["handles"] = handles
    ax.legend(**kwargs)
