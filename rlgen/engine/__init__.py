"""The top layer: `Engine`, the object a notebook holds.

Owns: `Engine`, a thin face (`engine._engine`) over named parts: the server (`server._handle`),
the connection (`_connection`), the served weights (`_served`), the adapters (`_adapter_choice`),
server control and memory (`_memory`), provenance (`_provenance`); the work in files cut by
concept: construction and lifecycle (`_lifecycle`, `_startup`), generation and scoring
(`_generation`, `_scoring`), weights and adapters (`_weights`, `_adapters`), episodes
(`_episodes`), background jobs across weight updates (`_jobs`, `_job_run`, `_pause`: `GenerationJob`,
`PartialRollouts`, `JobProgress`). Knows nothing below its layers' public functions.
"""

from __future__ import annotations

from ._engine import Engine
from ._episodes import EpisodesJob, EpisodesProgress
from ._jobs import GenerationJob, JobProgress, PartialRollouts
from ._lifecycle import EngineState

__all__ = ["Engine", "EngineState", "EpisodesJob", "EpisodesProgress", "GenerationJob", "JobProgress", "PartialRollouts"]
