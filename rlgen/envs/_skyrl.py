"""SkyRL-gym's text environments (`BaseTextEnv`), run unchanged as episodes.

Owns `from_skyrl`: a `BaseTextEnv` subclass made into an `Environment` the episode runner drives as
SkyRL's generator does (read from skyrl-gym 0.4.0, `skyrl_gym/envs/base_text_env.py`, and the
generator's use of it):

- one instance per episode, `cls(env_config, extras)`, `extras` being the prompt's data (a dict: a
  SkyRL dataset row without its prompt, e.g. `{"reward_spec": {"ground_truth": ...}, "extra_info":
  {...}}`); then `init(prompt) -> (prompt, info)`, whose prompt replaces the row's;
- after each assistant turn, `step(text)` with the turn's text as sampled (stop strings included:
  the environment parses tags itself) returns `{observations, reward, done, metadata}`: the
  observations are appended as the template's delta (loss mask 0), the reward is the env turn's
  (`step_rewards`, and the reward named after the class is their sum), `done` ends the episode,
  the metadata is the env turn's `info`; a `postprocessed_action` is kept in `info` but never
  replaces the sampled ids (it would break token-in/token-out, as SkyRL's generator warns);
- `close()` once the episode has ended.

Construction, init, step and close run contained with the timeout: an exception is the episode's
"env_error" with its traceback (an `assert` on a missing ground truth included), the other
episodes go on.

Knows nothing about servers, token ids, chat templates or the Engine; it imports nothing of SkyRL.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence
from typing import Any

from ..episodes._env import (
    ENV_TIMEOUT,
    Environment,
    EnvReply,
    EpisodeEnv,
    Timeout,
    failure_reply,
    normalise_return,
    own_timeout,
)
from ..episodes._tools import Ran, run_contained, within

__all__ = ["from_skyrl", "looks_like_skyrl"]


def looks_like_skyrl(env: Any) -> bool:
    """Whether `env` is a SkyRL-gym text environment class (a subclass of `BaseTextEnv`, told by its
    classes' names and modules, so that SkyRL need not be imported)."""
    return inspect.isclass(env) and any(
        c.__name__ == "BaseTextEnv" and c.__module__.startswith("skyrl_gym") for c in env.__mro__)


class _SkyRLEpisode(EpisodeEnv):
    def __init__(self, cls: type, env_config: Any, timeout: float | None) -> None:
        self.cls, self.env_config, self.timeout = cls, env_config, timeout

    def _failed(self, ran: Ran, what: str) -> EnvReply | None:
        return failure_reply(ran, note=f" ({what})",
                             timed_out=f"{what} did not finish {within(self.timeout)} (env_timeout=)")

    async def reset(self, data: Any, prompt: Sequence[Mapping[str, Any]] | None = None) -> EnvReply:
        extras = dict(data) if isinstance(data, Mapping) else {}
        name = self.cls.__name__

        def make_and_init() -> Any:
            self.obj = self.cls(self.env_config, extras)
            return self.obj.init([dict(m) for m in prompt or []])

        ran = await run_contained(make_and_init, timeout=self.timeout)
        failed = self._failed(ran, f"{name}(env_config, extras) and init(prompt)")
        if failed is not None:
            return failed
        value = ran.value
        chat = value[0] if isinstance(value, tuple) and len(value) == 2 else None
        checked = normalise_return(chat, what=f"{name}.init") if chat else None
        if not isinstance(chat, list) or checked is None or checked.status is not None:
            return EnvReply(status="bad_env_return", seconds=ran.seconds,
                            error=f"{name}.init returned {type(value).__name__}; expected (prompt, info), the "
                                  "prompt a list of message dicts")
        return EnvReply(prompt=[dict(m) for m in chat], seconds=ran.seconds)

    async def step(self, messages: list[dict[str, Any]]) -> EnvReply:
        text = str(messages[-1].get("content") or "") if messages else ""
        name = self.cls.__name__
        ran = await run_contained(self.obj.step, (text,), timeout=self.timeout)
        failed = self._failed(ran, f"{name}.step")
        if failed is not None:
            return failed
        out = ran.value
        if not isinstance(out, Mapping) or "done" not in out:
            return EnvReply(status="bad_env_return", seconds=ran.seconds,
                            error=f"{name}.step returned {type(out).__name__}; expected a BaseTextEnvStepOutput "
                                  "(observations, reward, done, metadata)")
        info = dict(out.get("metadata") or {})
        if out.get("postprocessed_action") is not None:
            info["postprocessed_action"] = out["postprocessed_action"]  # kept, never sent in place of the ids
        observations = list(out.get("observations") or [])
        reply = EnvReply(done=True) if out["done"] or not observations else \
            normalise_return(observations, what=f"{name}.step's observations")
        reward = out.get("reward")
        reply.reward = float(reward) if reward is not None else None
        reply.info, reply.seconds = info, ran.seconds
        if out["done"]:
            reply.messages = []
        return reply

    async def close(self) -> EnvReply:
        if self.obj is None:
            return EnvReply()
        ran = await run_contained(self.obj.close, timeout=self.timeout)
        return self._failed(ran, f"{self.cls.__name__}.close") or EnvReply(seconds=ran.seconds)


def from_skyrl(cls: type, *, env_config: Any = None, timeout: Timeout = ENV_TIMEOUT) -> Environment:
    """A SkyRL-gym `BaseTextEnv` subclass as an environment of `Engine.episodes` (see the module
    docstring); each prompt's `data=` is its `extras`.

    Args:
        cls: the environment class (e.g. `skyrl_gym.envs.gsm8k.multi_turn_env.GSM8kMultiTurnEnv`).
        env_config: its first constructor argument, the same for every episode.
        timeout: seconds for construction with init, each step, and close. Default: the call's
            `env_timeout` (30 s unless the call gives another); given here, it wins over `env_timeout`.

    Raises:
        TypeError: `cls` is not a class with `step`; ValueError: a bad timeout.
    """
    if not inspect.isclass(cls) or not callable(getattr(cls, "step", None)):
        raise TypeError(f"from_skyrl takes a BaseTextEnv subclass, got {cls!r}")
    seconds, given = own_timeout("from_skyrl(timeout=)", timeout)

    def reward(row: Mapping[str, Any]) -> float | None:
        steps = row.get("step_rewards")  # none when no step gave a reward (it failed before one)
        return float(sum(steps)) if steps is not None and not isinstance(steps, float) and len(steps) else None

    reward.__qualname__ = f"{cls.__name__}: the sum of the step rewards"
    def build(seconds: float | None) -> Environment:
        return Environment(lambda: _SkyRLEpisode(cls, env_config, seconds), "framework", None, seconds,
                           reward_funcs={cls.__name__: reward})

    env = build(seconds)
    env.retime = None if given else build
    return env
