"""Multi-turn episodes: `Engine.episodes`.

Owns: checking a call's prompts (chats, or strings made into one user message each), running the
episode runner (`rlgen.episodes.run_episodes`) on the background loop with the Engine's client,
tokenizer and context length, its progress line, and Ctrl-C (the finished episodes are kept in
`last_episodes`, the rest aborted on the server and marked "cancelled"). Knows nothing about how
an episode runs (`rlgen.episodes`) or about server processes, scoring or weights.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..core import _loop
from ..episodes import EpisodeRecord, EpisodesResult, run_episodes
from ._base import EngineBase
from ._startup import pad_id

__all__ = ["EpisodesMixin", "episode_prompts"]


def episode_prompts(prompts: Any) -> list[list[dict[str, Any]]]:
    """Prompts as chats: one chat (a list of message dicts), a string, or a list of chats / strings
    (a string becomes one user message)."""
    def chat(p: Any, where: str) -> list[dict[str, Any]]:
        if isinstance(p, str):
            return [{"role": "user", "content": p}]
        if isinstance(p, Sequence) and p and all(isinstance(m, Mapping) for m in p):
            for m in p:
                if not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
                    raise ValueError(f"{where}: every message needs a str 'role' and 'content', got {dict(m)!r}")
            return [dict(m) for m in p]
        raise TypeError(f"{where} must be a chat (a list of {{'role', 'content'}} dicts) or a str, "
                        f"got {type(p).__name__}")

    if isinstance(prompts, str) or (isinstance(prompts, Sequence) and prompts and isinstance(prompts[0], Mapping)):
        return [chat(prompts, "prompts")]
    if not isinstance(prompts, Sequence) or not prompts:
        raise TypeError("prompts must be a chat, a str, or a non-empty list of chats / strs")
    return [chat(p, f"prompts[{i}]") for i, p in enumerate(prompts)]


class EpisodesMixin(EngineBase):
    """Multi-turn episodes of `Engine` (mixed into it)."""

    last_episodes: EpisodesResult | None = None

    def episodes(self, prompts: Any, *, env: Any, n: int = 1, max_turns: int = 4, max_new_tokens: int = 128,
                 temperature: float = 1.0, data: Any = None, env_timeout: float | None = 30.0,
                 progress: bool | None = None, max_in_flight: int = 64, **sampling: Any) -> EpisodesResult:
        """Run `n` multi-turn episodes per prompt, concurrently; returns an `EpisodesResult`
        (`.records`, `.df` a row per episode, `.turns` a row per turn, `.tensors()`).

        Each assistant turn is sampled token in, token out: the next request is the previous ids
        plus the chat template's delta for the environment's new messages, sent as `input_ids`.

        Args:
            prompts: a chat, a str, or a list of them (a str is one user message).
            env: a function `env(messages, data)` (sync or async) returning the next message(s)
                (a str, a message dict, a list of them) or None / "done"; a class with
                `reset(data)` / `step(messages)` (one instance per episode) or a factory of such
                objects; or `rlgen.episodes.tool_env(tools)` (or a list of tool functions).
            n: episodes per prompt.
            max_turns: the most assistant turns per episode.
            max_new_tokens: per assistant turn.
            temperature: sampling temperature; `**sampling`: other SGLang sampling_params (top_p,
                stop, ...).
            data: one item per prompt (or a dict of per-prompt columns), given to the environment.
            env_timeout: seconds per environment step ("env_timeout" after).
            progress: show a progress line (None: the Engine's setting).
            max_in_flight: the most /generate requests in flight at once.

        Raises:
            TypeError / ValueError: bad prompts, env or options (nothing was sent).
            KeyboardInterrupt: Ctrl-C; in-flight requests were aborted on the server, and
                `eng.last_episodes` holds the finished episodes (the rest "cancelled").
        """
        self._check_ready()
        chats = episode_prompts(prompts)
        if "max_new_tokens" in sampling or "n" in sampling:
            raise TypeError("pass max_new_tokens= and n= as episodes() arguments")
        params = {"temperature": temperature, **sampling}
        records: list[EpisodeRecord] = []
        from ..core._progress import ProgressLine

        show = self._progress if progress is None else progress
        with ProgressLine("episodes", total=len(chats) * n, unit="episode", show=show) as line:
            def advance(record: EpisodeRecord) -> None:
                line.advance(1, record.sampled_tokens)

            try:
                _loop.run_sync(run_episodes(self._client, self.tokenizer, chats, env=env, n=n, max_turns=max_turns,
                                            max_new_tokens=max_new_tokens, sampling=params,
                                            context_length=self.context_length, data=data, env_timeout=env_timeout,
                                            max_in_flight=max_in_flight, records=records, on_episode=advance),
                               on_wait=line.tick)
            except BaseException:
                self.last_episodes = EpisodesResult(records, pad_id=pad_id(self.tokenizer), tokenizer=self.tokenizer,
                                                    interrupted=True)
                raise
        self.last_episodes = EpisodesResult(records, pad_id=pad_id(self.tokenizer), tokenizer=self.tokenizer)
        return self.last_episodes
