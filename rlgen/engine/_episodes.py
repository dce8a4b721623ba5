"""Multi-turn episodes: `Engine.episodes`.

Owns: checking a call's prompts (chats, or strings made into one user message each), running the
episode runner (`rlgen.episodes.run_episodes`) on the background loop with the Engine's
connection (client, tokenizer or one with another chat template, context length), the call's
provenance (as generate's), its progress line, and Ctrl-C (every episode is handed to `keep`, the
Engine's `last_episodes`, the unfinished ones aborted on the server and marked "cancelled").
Knows nothing about how an episode runs (`rlgen.episodes`) or about server processes, scoring or
weights.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..core import _loop
from ..episodes import EpisodeRecord, Episodes, as_environment, episodes_from_records, run_episodes
from ._connection import Connection
from ._provenance import Provenance

__all__ = ["episode_prompts", "episodes"]


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


def episodes(conn: Connection, provenance: Provenance, keep: Callable[[Episodes], None], prompts: Any, *,
             env: Any, n: int = 1, max_turns: int = 4, max_new_tokens: int = 128, temperature: float = 1.0,
             data: Any = None, env_timeout: float | None = 30.0, chat_template: str | None = None,
             progress: bool | None = None, max_in_flight: int = 256, batch_turns: bool = True,
             **sampling: Any) -> Episodes:
    """`Engine.episodes` over the Engine's connection and provenance; `keep` receives the result, also
    the partial one of an interrupted call (the Engine's `last_episodes`)."""
    import time

    conn.check_ready()
    chats = episode_prompts(prompts)
    if "max_new_tokens" in sampling or "n" in sampling:
        raise TypeError("pass max_new_tokens= and n= as episodes() arguments")
    tokenizer = conn.tokenizer if chat_template is None else _with_template(conn.tokenizer, chat_template)
    params = {"temperature": temperature, **sampling}
    tools = as_environment(env, timeout=env_timeout).tools  # checks env before anything is sent
    records: list[EpisodeRecord] = []
    started = time.time()
    from ..core._progress import ProgressLine

    def result() -> Episodes:
        versions = [t.get("weight_version") for r in records for t in r.assistant_turns]
        record = provenance.of_call(started=started, sampling={**params, "n": n, "max_new_tokens": max_new_tokens,
                                                               "max_turns": max_turns},
                                    weight_versions=versions, cache=None)
        if chat_template is not None:
            record["chat_template"] = chat_template
        return episodes_from_records(records, pad_token_id=conn.pad_id, tokenizer=tokenizer,
                                     model=provenance.model, sampling=record["sampling"], run_record=record,
                                     tools=tools)

    show = conn.show(progress)
    with ProgressLine("episodes", total=len(chats) * n, unit="episode", show=show) as line:
        def advance(record: EpisodeRecord) -> None:
            line.advance(1, record.sampled_tokens)

        try:
            _loop.run_sync(run_episodes(conn.client, tokenizer, chats, env=env, n=n, max_turns=max_turns,
                                        max_new_tokens=max_new_tokens, sampling=params,
                                        context_length=conn.context_length, data=data, env_timeout=env_timeout,
                                        max_in_flight=max_in_flight, records=records, on_episode=advance,
                                        batch_turns=batch_turns),
                           on_wait=line.tick)
        except BaseException:
            if records:
                keep(result())
            raise
    done = result()
    keep(done)
    return done


def _with_template(tokenizer: Any, template: str) -> Any:
    """A tokenizer like `tokenizer` whose chat template is `template` (loaded anew through
    transformers, so the Engine's own is untouched)."""
    if not isinstance(template, str) or not template.strip():
        raise TypeError("chat_template must be a Jinja template string")
    from transformers import AutoTokenizer

    copy = AutoTokenizer.from_pretrained(tokenizer.name_or_path)
    copy.chat_template = template
    return copy
