"""Recognising an environment written for another framework, so `Engine.episodes(env=...)` takes it as it is.

Owns `adapt(env)`: an environment of another framework's shape made into the `Environment` its
adapter builds with default options (`from_trl`, `from_skyrl`, ...); anything else is returned
unchanged, for `rlgen.episodes.as_environment` to take or refuse. The shapes are told apart without
importing the frameworks: a SkyRL-gym `BaseTextEnv` subclass (by its classes' names and modules),
a TRL environment class (no `step`, and a `reset` that takes the row's `prompt` by keyword, as
TRL's `reset(**row)` passes it; rlgen's own classes have `step`, and `reset(data)`) or a dict of them,
verl's tools (a `BaseTool` instance, a `FunctionTool`, or a list of them and of `@function_tool`
functions, these found in verl's registry when verl is already imported).
An adapter's options (reward functions, the tool-call parser, what a failing tool does) need the
adapter itself: `env=rlgen.envs.from_trl(MyEnv, reward_funcs=[...])`.

Knows nothing about running episodes, servers or the Engine.
"""

from __future__ import annotations

from typing import Any

from ._skyrl import from_skyrl, looks_like_skyrl
from ._trl import from_trl, looks_like_trl
from ._verifiers import from_verifiers, looks_like_verifiers
from ._verl import from_verl, looks_like_verl

__all__ = ["adapt"]


def adapt(env: Any) -> Any:
    """`env` made into its framework adapter's `Environment` when it has a framework's shape, else `env`."""
    if looks_like_verifiers(env):
        return from_verifiers(env)
    if looks_like_skyrl(env):
        return from_skyrl(env)
    if looks_like_trl(env):
        return from_trl(env)
    if looks_like_verl(env):
        return from_verl(env)
    return env
