"""Multi-turn episodes: `Engine.episodes`.

Owns: `Engine.episodes`' signature and options (declared in `core._options.EpisodeOptions`, checked
before anything is sent), building the environment once, running the episode runner
(`rlgen.episodes.run_episodes`) on the background loop with the Engine's client, tokenizer (or one
with another chat template) and context length, the call's record (as generate's), its progress
line, and Ctrl-C (every episode is kept in `last_episodes`, the unfinished ones aborted on the
server and marked "cancelled"). Knows nothing about how an episode runs or how its prompts and data
are checked (`rlgen.episodes`), nor about server processes, scoring or weights.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from typing_extensions import Unpack

from ..core import _loop, _options
from ..core._options import EpisodeOptions, takes_options
from ..episodes import EpisodeRecord, Episodes, as_environment, episodes_from_records, run_episodes
from ..episodes._runner import episode_prompts
from ._base import EngineBase
from ._startup import pad_id

__all__ = ["EpisodesMixin"]


class EpisodesMixin(EngineBase):
    """Multi-turn episodes of `Engine` (mixed into it)."""

    last_episodes: Episodes | None = None

    if TYPE_CHECKING:
        def _run_record(self, *, started: float, sampling: dict[str, Any], weight_versions: Sequence[Any],
                        cache: dict[str, int] | None) -> dict[str, Any]: ...

    @takes_options(EpisodeOptions)
    def episodes(self, prompts: Any, *, env: Any, **options: Unpack[EpisodeOptions]) -> Episodes:
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

        The options (below) are generate()'s sampling parameters, per assistant turn (`seed=`, or
        its SGLang name `sampling_seed=`: episode j of a prompt draws with seed + j), and the
        episodes' own; every one is checked before anything is sent.

        Raises:
            TypeError / ValueError: bad prompts, env, data or options, or a chat template that does
                not compile (nothing was sent).
            KeyboardInterrupt: Ctrl-C; in-flight requests were aborted on the server, and
                `eng.last_episodes` holds every episode (the unfinished ones "cancelled").
        """
        try:  # checked here, so a mistyped option's traceback is the caller's line and this one
            opts = _options.resolve(EpisodeOptions, options)
        except (TypeError, ValueError) as err:
            raise err.with_traceback(None) from None
        import time

        self._check_ready()
        chats = episode_prompts(prompts)
        template = opts["chat_template"]
        tokenizer = self.tokenizer if template is None else _with_template(self.tokenizer, template)
        environment = as_environment(env, timeout=opts["env_timeout"])  # built once: checked before anything is sent
        sampling = _options.to_sglang(opts)
        n, max_new_tokens = opts["n"], sampling.pop("max_new_tokens")
        records: list[EpisodeRecord] = []
        started = time.time()
        from ..core._progress import ProgressLine

        def result() -> Episodes:
            versions = [t.get("weight_version") for r in records for t in r.assistant_turns]
            record = self._run_record(started=started, sampling={**sampling, "n": n, "max_new_tokens": max_new_tokens,
                                                                 "max_turns": opts["max_turns"]},
                                      weight_versions=versions, cache=None)
            if template is not None:
                record["chat_template"] = template
            return episodes_from_records(records, pad_token_id=pad_id(self.tokenizer), tokenizer=tokenizer,
                                         model=self.model, sampling=record["sampling"], run_record=record,
                                         tools=environment.tools)

        show = self._progress if opts["progress"] is None else opts["progress"]
        with ProgressLine("episodes", total=len(chats) * n, unit="episode", show=show) as line:
            def advance(record: EpisodeRecord) -> None:
                line.advance(1, record.sampled_tokens)

            try:
                _loop.run_sync(run_episodes(self._client, tokenizer, chats, env=environment, n=n,
                                            max_turns=opts["max_turns"], max_new_tokens=max_new_tokens,
                                            sampling=sampling, context_length=self.context_length, data=opts["data"],
                                            max_in_flight=opts["max_in_flight"], records=records,
                                            on_episode=advance, batch_turns=opts["batch_turns"]),
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
    from transformers import AutoTokenizer

    copy = AutoTokenizer.from_pretrained(tokenizer.name_or_path)
    copy.chat_template = template
    return copy
