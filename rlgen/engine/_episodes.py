"""Multi-turn episodes: the body of `Engine.episodes`.

Owns: running a call's episodes with options already checked against `core._options.EpisodeOptions`
(the Engine's method resolves them, so a mistake raises before anything here runs): the prompts as
chats and the environment, each built once and checked before anything is sent; the episode runner
(`rlgen.episodes.run_episodes`) on the background loop with the Engine's connection (client,
tokenizer or one with another chat template, context length); an environment written for another
framework made into its adapter's (`rlgen.envs.adapt`), and that framework's own rewards added once
the episodes have ended; the call's provenance (as generate's), its progress line, and Ctrl-C (every episode is handed to `keep`, the Engine's
`last_episodes`, the unfinished ones aborted on the server and marked "cancelled"). Knows nothing
about how an episode runs or how its prompts and data are checked (`rlgen.episodes`), nor about
server processes, scoring or weights.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from ..core import _loop, _options
from ..core._gc import gc_paused
from ..envs import adapt
from ..episodes import EpisodeRecord, Episodes, as_environment, episodes_from_records, run_episodes
from ..episodes._runner import episode_prompts
from ._connection import Connection
from ._provenance import Provenance

__all__ = ["episodes"]


def episodes(conn: Connection, provenance: Provenance, keep: Callable[[Episodes], None], prompts: Any, *,
             env: Any, opts: Mapping[str, Any]) -> Episodes:
    """`Engine.episodes` over the Engine's connection and provenance, `opts` resolved against
    `EpisodeOptions`; `keep` receives the result, also the partial one of an interrupted call."""
    import time

    conn.check_ready()
    chats = episode_prompts(prompts)
    template = opts["chat_template"]
    tokenizer = conn.tokenizer if template is None else _with_template(conn.tokenizer, template)
    # built once: checked before anything is sent; another framework's environment through its adapter
    environment = as_environment(adapt(env), timeout=opts["env_timeout"])
    sampling = _options.to_sglang(opts)
    n, max_new_tokens = opts["n"], sampling.pop("max_new_tokens")
    records: list[EpisodeRecord] = []
    started = time.time()
    from ..core._progress import ProgressLine

    def result() -> Episodes:
        versions = [t.get("weight_version") for r in records for t in r.assistant_turns]
        record = provenance.of_call(started=started, sampling={**sampling, "n": n, "max_new_tokens": max_new_tokens,
                                                               "max_turns": opts["max_turns"]},
                                    weight_versions=versions, cache=None)
        if template is not None:
            record["chat_template"] = template
        return episodes_from_records(records, pad_token_id=conn.pad_id, tokenizer=tokenizer,
                                     model=provenance.model, sampling=record["sampling"], run_record=record,
                                     tools=environment.tools, framework=environment.kind == "framework")

    # The cyclic GC paused while the episodes run and their result is built (core/_gc: each turn
    # of each episode allocates, and a full collection would walk the notebook's whole heap).
    with ProgressLine("episodes", total=len(chats) * n, unit="episode", show=conn.show(opts["progress"])) as line, \
            gc_paused():
        def advance(record: EpisodeRecord) -> None:
            line.advance(1, record.sampled_tokens)

        try:
            _loop.run_sync(run_episodes(conn.client, tokenizer, chats, env=environment, n=n,
                                        max_turns=opts["max_turns"], max_new_tokens=max_new_tokens,
                                        sampling=sampling, context_length=conn.context_length, data=opts["data"],
                                        max_in_flight=opts["max_in_flight"], records=records,
                                        on_episode=advance, batch_turns=opts["batch_turns"]),
                           on_wait=line.tick)
        except BaseException:
            if records:
                keep(result())
            raise
        done = result()
    if environment.reward_funcs:  # the framework's own rewards, in threads: they may read `environments`
        keep(done)  # kept unscored first: a Ctrl-C while scoring loses no episode
        # one row per call, so that one environment's failing reward is that row's status only
        done = done.add_rewards(dict(environment.reward_funcs), mode="thread", batch_size=1,
                                progress=conn.show(opts["progress"]))
    keep(done)
    return done


def _with_template(tokenizer: Any, template: str) -> Any:
    """A tokenizer like `tokenizer` whose chat template is `template` (loaded anew through
    transformers, so the Engine's own is untouched)."""
    from transformers import AutoTokenizer

    copy = AutoTokenizer.from_pretrained(tokenizer.name_or_path)
    copy.chat_template = template
    return copy
