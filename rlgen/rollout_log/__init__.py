"""The rollout-log layer: a training run's results by step, re-scored and compared across reward versions.

Owns: the append-only log of parts (`_log.RolloutLog`, over `_store` and `_parts`), reward versions
with their lineage (`_versions`), re-scoring (`_rescore`, through `rlgen.rewards`), the views across
steps (`_views`) and the importers of what training frameworks write (`_import_trl`, `_import_verl`).
Knows nothing about servers or engines: it stores and reads results (`rlgen.rollouts`); the diff of
two versions is `rlgen.compare`'s.
"""

from __future__ import annotations

from ._log import RolloutLog
from ._text_rows import LogImportWarning

__all__ = ["LogImportWarning", "RolloutLog"]
