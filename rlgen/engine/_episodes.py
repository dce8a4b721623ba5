"""Multi-turn episodes: `Engine.episodes`.

Owns: checking a call's prompts (chats, or strings made into one user message each), running the
episode runner (`rlgen.episodes.run_episodes`) on the background loop with the Engine's client,
tokenizer (or one with another chat template) and context length, the call's record (as
generate's), its progress line, and Ctrl-C (every episode is kept in `last_episodes`, the
unfinished ones aborted on the server and marked "cancelled"). Knows nothing about how
an episode runs (`rlgen.episodes`) or about server processes, scoring or weights.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ..core import _loop
from ..episodes import EpisodeRecord, Episodes, as_environment, episodes_from_records, run_episodes
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

    last_episodes: Episodes | None = None

    if TYPE_CHECKING:
        def _run_record(self, *, started: float, sampling: dict[str, Any], weight_versions: Sequence[Any],
                        cache: dict[str, int] | None) -> dict[str, Any]: ...

    def episodes(self, prompts: Any, *, env: Any, n: int = 1, max_turns: int = 4, max_new_tokens: int = 128,
                 temperature: float = 1.0, data: Any = None, env_timeout: float | None = 30.0,
                 chat_template: str | None = None, progress: bool | None = None, max_in_flight: int = 256,
                 batch_turns: bool = True, **sampling: Any) -> Episodes:
        """Run `n` multi-turn episodes per prompt, concurrently; returns `Episodes`, a `Rollouts`
        with a row per episode (`.df`; `.turns` a row per turn; `.tensors()` with `loss_mask`,
        `turn_ids` and `roles`; `.check_drift()`; rewards, parquet, the view as for `generate`).

        Each assistant turn is sampled token in, token out: the next request is the previous ids
        plus the chat template's delta for the environment's new messages, sent as `input_ids`, so
        the history is never re-tokenized and the server's prefix cache serves it.

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
            data: one item per prompt (or a dict of per-prompt columns), given to the environment;
                a dict's keys become columns of `.df`.
            env_timeout: seconds per environment step ("env_timeout" after).
            chat_template: render the turns with this Jinja chat template instead of the model's
                (e.g. a thinking template that rewrites history, to see its drift).
            progress: show a progress line (None: the Engine's setting).
            max_in_flight: the most turns in flight at once (server-side requests).
            batch_turns: send the turns that are ready together as one batched /generate; False:
                one request per turn, each answered as soon as its sample finishes. A batch is
                answered when its longest turn finishes, and still it was faster on an H200
                (docs/benchmarks.md, "Multi-turn episodes"): 1.04-1.27x the tokens/s of one
                request per turn with turns of one length, 1.60x with turns ending at EOS.

        Raises:
            TypeError / ValueError: bad prompts, env or options (nothing was sent).
            KeyboardInterrupt: Ctrl-C; in-flight requests were aborted on the server, and
                `eng.last_episodes` holds every episode (the unfinished ones "cancelled").
        """
        import time

        self._check_ready()
        chats = episode_prompts(prompts)
        if "max_new_tokens" in sampling or "n" in sampling:
            raise TypeError("pass max_new_tokens= and n= as episodes() arguments")
        tokenizer = self.tokenizer if chat_template is None else _with_template(self.tokenizer, chat_template)
        params = {"temperature": temperature, **sampling}
        tools = as_environment(env, timeout=env_timeout).tools  # checks env before anything is sent
        records: list[EpisodeRecord] = []
        started = time.time()
        from ..core._progress import ProgressLine

        def result() -> Episodes:
            versions = [t.get("weight_version") for r in records for t in r.assistant_turns]
            record = self._run_record(started=started, sampling={**params, "n": n, "max_new_tokens": max_new_tokens,
                                                                 "max_turns": max_turns},
                                      weight_versions=versions, cache=None)
            if chat_template is not None:
                record["chat_template"] = chat_template
            return episodes_from_records(records, pad_token_id=pad_id(self.tokenizer), tokenizer=tokenizer,
                                         model=self.model, sampling=record["sampling"], run_record=record,
                                         tools=tools)

        show = self._progress if progress is None else progress
        with ProgressLine("episodes", total=len(chats) * n, unit="episode", show=show) as line:
            def advance(record: EpisodeRecord) -> None:
                line.advance(1, record.sampled_tokens)

            try:
                _loop.run_sync(run_episodes(self._client, tokenizer, chats, env=env, n=n, max_turns=max_turns,
                                            max_new_tokens=max_new_tokens, sampling=params,
                                            context_length=self.context_length, data=data, env_timeout=env_timeout,
                                            max_in_flight=max_in_flight, records=records, on_episode=advance,
                                            batch_turns=batch_turns),
                               on_wait=line.tick)
            except BaseException:
                if records:
                    self.last_episodes = result()
                raise
        self.last_episodes = result()
        return self.last_episodes


def _with_template(tokenizer: Any, template: str) -> Any:
    """A tokenizer like `tokenizer` whose chat template is `template` (loaded anew through
    transformers, so the Engine's own is untouched)."""
    if not isinstance(template, str) or not template.strip():
        raise TypeError("chat_template must be a Jinja template string")
    from transformers import AutoTokenizer

    copy = AutoTokenizer.from_pretrained(tokenizer.name_or_path)
    copy.chat_template = template
    return copy
