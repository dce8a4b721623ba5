"""The log browser: one step of a log at a time, in the rollout browser, with a step control.

Owns: `LogBrowser`: which step is shown (a plain attribute, settable from code), loading that step's
rows only when it is shown (a log of 100,000 rows is never read whole; the last few steps shown
are kept), the step control (a slider over the logged steps with previous/next buttons) around the
step's `RolloutBrowser`, and the static HTML where widgets cannot render. Knows nothing about
files or reward versions: the log hands it a loader (step -> result) and the steps.
"""

from __future__ import annotations

import html
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from ..rollouts._browser import RolloutBrowser, widget_bundle

if TYPE_CHECKING:
    from ..rollouts._rollouts import Rollouts

__all__ = ["LogBrowser"]

_KEEP = 4  # steps kept loaded (moving back and forth between neighbours reads nothing again)


class LogBrowser:
    """Browse a log a step at a time: `log.browse()` in a notebook.

    `step` is the step shown (set it from code, or with the slider); the step's rows are read when
    it is first shown. Inside, the step's `RolloutBrowser` (filters, groups, token heatmaps):
    `browser()` returns it for setting its selection from code.
    """

    def __init__(self, load: Callable[[int], Rollouts], steps: Sequence[int], *, step: int | None = None,
                 reward: str = "reward", widgets: bool | None = None) -> None:
        if not steps:
            raise ValueError("this log has no steps yet: append a result first (log.append(step, res))")
        if step is not None and step not in steps:
            raise ValueError(f"step {step} is not in this log; its steps: {steps[0]}..{steps[-1]} ({len(steps)})")
        self._load = load
        self.steps = list(steps)
        self.step = steps[0] if step is None else step
        self.reward = reward
        self.widgets = widgets
        self._browsers: OrderedDict[int, RolloutBrowser] = OrderedDict()
        self._widget: Any = None

    def browser(self) -> RolloutBrowser:
        """The shown step's rollout browser (its rows read on first use)."""
        if self.step not in self._browsers:
            self._browsers[self.step] = RolloutBrowser(self._load(self.step), reward=self.reward, widgets=self.widgets)
            while len(self._browsers) > _KEEP:
                self._browsers.popitem(last=False)
        self._browsers.move_to_end(self.step)
        return self._browsers[self.step]

    def _lead(self) -> str:
        at = self.steps.index(self.step)
        return (f"step {self.step} ({at + 1} of {len(self.steps)} logged steps, {self.steps[0]}..{self.steps[-1]})"
                " · another step: b.step = N, or the slider in JupyterLab")

    def html(self) -> str:
        """The shown step as HTML: a line saying which step, then its rollout browser."""
        return (f'<div style="font-family:monospace;color:#555">{html.escape(self._lead())}</div>'
                + self.browser().html())

    def _repr_html_(self) -> str:
        return self.html()

    def _repr_mimebundle_(self, **_: Any) -> dict[str, Any]:
        """The widget where a widget manager runs, else the static HTML (as `RolloutBrowser`)."""
        return widget_bundle(repr(self), self.html(), self.widget if self.browser().use_widgets() else None)

    def __repr__(self) -> str:
        return f"<LogBrowser step {self.step} of {len(self.steps)} logged steps>"

    def widget(self) -> Any:
        """The step slider with previous/next buttons above the step's browser (built once), or None
        where ipywidgets is missing."""
        if self._widget is not None:
            return self._widget
        try:
            import ipywidgets as w
        except ImportError:
            return None
        slider = w.SelectionSlider(options=self.steps, value=self.step, description="step", continuous_update=False,
                                   layout=w.Layout(width="32em"))
        previous, following = (w.Button(description=d, layout=w.Layout(width="7em")) for d in ("◀ step", "step ▶"))
        inner = w.Box(layout=w.Layout(width="auto"))

        def show(step: int) -> None:
            self.step = step
            inner.children = [self.browser().widget() or w.HTML(self.browser().html())]

        def move(by: int) -> Callable[[Any], None]:
            def go(_: Any) -> None:
                at = min(max(self.steps.index(self.step) + by, 0), len(self.steps) - 1)
                slider.value = self.steps[at]  # the slider's observer shows it
            return go

        slider.observe(lambda change: show(int(change["new"])), "value")
        previous.on_click(move(-1))
        following.on_click(move(+1))
        show(self.step)
        self._widget = w.VBox([w.HBox([slider, previous, following], layout=w.Layout(flex_flow="row wrap")), inner],
                              layout=w.Layout(width="auto"))
        return self._widget
