"""The result layer: the `Rollouts` object a generation returns, and its views.

Owns: the rows and their padded tensors (`_rollouts`, with its tensor and reward mixins), building
a result from a server's answers (`_build`, `rollouts._response_arrays`), parquet files (`rollouts._parquet`), token
text (`rollouts._token_text`), the notebook view, the browser and the plots (`rollouts._display`, `rollouts._browser`,
`rollouts._plots`, typed against `_protocol.RolloutsView`), and the prompt groups and rows the reward layer
scores (`_groups`). Knows nothing about servers or HTTP; scoring itself is `rlgen.rewards`'.
"""

from __future__ import annotations

from ._build import rollouts_from_responses
from ._rollouts import Rollouts

__all__ = ["Rollouts", "rollouts_from_responses"]
