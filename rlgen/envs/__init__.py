"""Environments written for other frameworks, run unchanged by `Engine.episodes`: TRL, SkyRL-gym, verl tools, verifiers.

Owns the adapters: each takes what a framework's users write (their class, their tools, their
loaded environment) and gives the `rlgen.episodes.Environment` the episode runner drives, token in
and token out, with the framework's own rewards as reward columns and its failures as statuses:

- `from_trl(EnvClass, reward_funcs=...)`: TRL's `environment_factory` classes (`reset(**row)`,
  `get_reward()`, public methods as tools);
- `from_skyrl(EnvClass, env_config=...)`: SkyRL-gym's `BaseTextEnv` (`init`, `step(text)`, `close`);
- `from_verl(tools, tool_config_path=..., compute_score=...)`: verl's `BaseTool`s and `@function_tool`s
  (create/execute/release per call, step rewards);
- `from_verifiers(vf_env)`: a verifiers v0 environment instance, its own rollout loop with rlgen as
  its model client (`vf.Client`), the rubric's reward and metrics as reward columns;
- `adapt(env)`: what `Engine.episodes` calls on `env=`, recognising those shapes.

What each maps to what, and what is not supported: `docs/environments.md`. Knows nothing about
servers, token ids or the Engine; the frameworks themselves are never imported here.

Usage::

    eng.episodes(prompts, env=IncrementEnv)                        # a TRL environment class, as it is
    eng.episodes(prompts, env=rlgen.envs.from_trl(IncrementEnv, reward_funcs=[my_reward]))
"""

from __future__ import annotations

from ._detect import adapt
from ._skyrl import from_skyrl
from ._trl import from_trl
from ._verifiers import from_verifiers
from ._verl import from_verl

__all__ = ["adapt", "from_skyrl", "from_trl", "from_verifiers", "from_verl"]
