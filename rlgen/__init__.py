"""rlgen: study and debug LLM generation and RL rewards in Jupyter, on an SGLang server the notebook owns.

Usage::

    import rlgen
    with rlgen.Engine() as eng:               # SGLang on the GPU, or the CPU backend without one
        res = eng.generate(["What is 2+2?"], n=4, max_new_tokens=32)
        res.df, res.tensors()
"""

from __future__ import annotations

from ._version import __version__
from .compare._ab import ABReport, ab
from .compare._kl import LogprobShift, compare
from .compare._logprobs import compare_logprobs
from .compare._mismatch import SamplerMismatch, sampler_vs_trainer
from .compare._reward_diff import RewardDiff
from .core._errors import (
    AdapterError,
    EngineClosedError,
    EngineError,
    LogError,
    ModelError,
    RequestError,
    RequestTimeout,
    RlgenError,
    ServerDiedError,
    ServerRequestError,
    ServerStartupError,
    ServerStartupTimeout,
    WeightsError,
    WorkerRequestError,
)
from .core._options import (
    GenerateOptions,
    JobResultOptions,
    LoraOptions,
    PauseOptions,
    RewardOptions,
    SamplingOptions,
    StreamOptions,
)
from .core._types import Chat, ChatMessage, Prompt, Prompts, TokenIds
from .engine._engine import Engine
from .engine._episodes import EpisodesJob, EpisodesProgress
from .engine._jobs import GenerationJob, JobProgress, PartialRollouts
from .engine._lifecycle import EngineState
from .episodes._episodes import Episodes
from .rollout_log._log import RolloutLog
from .rollouts._rollouts import Rollouts
from .server._models import DEFAULT_MODEL, resolve_model
from .server._process import reap
from .server._registry import list_servers

__all__ = [
    "DEFAULT_MODEL",
    "ABReport",
    "AdapterError",
    "Chat",
    "ChatMessage",
    "Engine",
    "EngineClosedError",
    "EngineError",
    "EngineState",
    "Episodes",
    "EpisodesJob",
    "EpisodesProgress",
    "GenerateOptions",
    "GenerationJob",
    "JobProgress",
    "JobResultOptions",
    "LogError",
    "LogprobShift",
    "LoraOptions",
    "ModelError",
    "PartialRollouts",
    "PauseOptions",
    "Prompt",
    "Prompts",
    "RequestError",
    "RequestTimeout",
    "RewardDiff",
    "RewardOptions",
    "RlgenError",
    "RolloutLog",
    "Rollouts",
    "SamplerMismatch",
    "SamplingOptions",
    "ServerDiedError",
    "ServerRequestError",
    "ServerStartupError",
    "ServerStartupTimeout",
    "StreamOptions",
    "TokenIds",
    "WeightsError",
    "WorkerRequestError",
    "__version__",
    "ab",
    "compare",
    "compare_logprobs",
    "list_servers",
    "reap",
    "resolve_model",
    "sampler_vs_trainer",
]

# Show public classes and functions as `rlgen.X` in reprs and tracebacks (as httpx does).
for _obj in (Engine, EngineState, Episodes, Rollouts, RolloutLog, LogError, RewardDiff, compare_logprobs, compare, LogprobShift, ab, ABReport, list_servers,
             SamplerMismatch, sampler_vs_trainer, GenerationJob, PartialRollouts, EpisodesJob,
             reap, resolve_model, RlgenError, AdapterError, EngineError, ModelError, ServerStartupError, ServerStartupTimeout,
             ServerDiedError, EngineClosedError, RequestError, ServerRequestError, RequestTimeout, WeightsError, WorkerRequestError):
    _obj.__module__ = "rlgen"
