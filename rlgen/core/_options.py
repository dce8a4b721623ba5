"""The options of rlgen's entry points: one schema each, declared once and shared by every method.

Owns: the name, type, default, one-line doc and check of every option that `Engine.generate`,
`Engine.agenerate` and `Engine.stream` take (SGLang's sampling parameters plus rlgen's own, such
as `n` and `chunk_size`), of `Engine.episodes` (the same sampling parameters, plus its own such as
`max_turns` and `env_timeout`), of `Rollouts.add_rewards`' options, of a weight update's pause
(`PauseOptions`: the pause modes, `PAUSE_MODES`) and of a background job's `result()`
(`JobResultOptions`: `min_done`, `rest`); checking a call's options
before anything runs (TypeError / ValueError that say what to change, "did you mean" for a
misspelt name); the `sampling_params` dict SGLang's `/generate` takes; and the signatures and docs
that `help()`, Jupyter and IDEs show. Knows nothing about prompts, HTTP, results or rewards: only
values.

Each option is one line of a TypedDict below: `name: Annotated[type, Option(default, doc, ...)]`.
Type checkers read the TypedDicts through `**options: Unpack[...]` (keyword completion and
checking in IDEs); at run time the same annotations give the defaults, the checks and the
`__signature__` of each method. Adding an option is one line here.
"""

from __future__ import annotations

import difflib
import inspect
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, TypedDict, TypeVar, get_type_hints

__all__ = [
    "PAUSE_MODES",
    "EpisodeOptions",
    "GenerateOptions",
    "JobResultOptions",
    "LoraOptions",
    "Option",
    "PauseOptions",
    "RescoreOptions",
    "RewardOptions",
    "SamplingOptions",
    "StreamOptions",
    "adapters_per_prompt",
    "cache_mode",
    "check_seconds",
    "defaults",
    "lora_options",
    "resolve",
    "takes_options",
    "to_sglang",
]

Check = Callable[[str, Any], Any]


@dataclass(frozen=True)
class Option:
    """What the schema knows about one option (the metadata of its `Annotated` type)."""

    default: Any
    doc: str
    check: Check | None = None     # validates the value; returns it, normalised (e.g. a str -> a tuple)
    sglang: str | None = None      # its name in SGLang's `sampling_params`; None: not sent there
    always_sent: bool = False      # sent even at its default (else only when it differs)


# -- checks --------------------------------------------------------------------------------------


def _count(least: int) -> Callable[[str, Any], int]:
    def check(name: str, value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{name} must be an int, got {type(value).__name__}")
        if value < least:
            raise ValueError(f"{name} must be an int >= {least}, got {value}")
        return value

    return check


def _optional_count(least: int, none_means: str) -> Check:
    count = _count(least)

    def check(name: str, value: Any) -> int | None:
        if value is None:
            return None
        try:
            return count(name, value)
        except (TypeError, ValueError):
            raise ValueError(f"{name} must be an int >= {least} or None ({none_means}), got {value!r}") from None

    return check


def _number(low: float, high: float | None = None, *, low_open: bool = False, note: str = "") -> Check:
    def check(name: str, value: Any) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError(f"{name} must be a number, got {type(value).__name__}")
        if not math.isfinite(value):
            raise ValueError(f"{name} must be finite, got {value}")
        if (value <= low if low_open else value < low) or (high is not None and value > high):
            if high is None:
                span = f"{'>' if low_open else '>='} {low:g}"
            else:
                span = f"in {'(' if low_open else '['}{low:g}, {high:g}]"
            raise ValueError(f"{name} must be {span}{note}, got {value}")
        return float(value)

    return check


def _top_k(name: str, value: Any) -> int:
    k = _count(-1)(name, value)
    if k == 0:
        raise ValueError(f"{name} must be -1 (whole vocabulary) or at least 1, got 0")
    return k


def _flag(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False, got {value!r}")
    return value


def _optional_flag(name: str, value: Any) -> bool | None:
    return None if value is None else _flag(name, value)


def cache_mode(name: str, value: Any) -> bool | str | None:
    """The completion cache's setting: False (off), True (greedy or seeded calls only) or "always"
    (also unseeded sampling, which then replays its first draw); None: the Engine's setting."""
    if value is None or isinstance(value, bool) or value == "always":
        return value  # type: ignore[no-any-return]
    raise ValueError(f"{name} must be True, False or 'always' (also cache unseeded sampling), got {value!r}")


def _seed(name: str, value: Any) -> int | None:
    return None if value is None else _count(0)(name, value)


def _tuple_of(kind: type) -> Check:
    def check(name: str, value: Any) -> tuple[Any, ...]:
        if value is None:
            return ()
        if isinstance(value, kind) and not isinstance(value, bool):
            return (value,)
        if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)):
            raise TypeError(f"{name} must be a {kind.__name__} or a list of them, got {type(value).__name__}")
        for item in value:
            if isinstance(item, bool) or not isinstance(item, kind):
                raise TypeError(f"{name} must contain only {kind.__name__} values, got {item!r}")
        return tuple(value)

    return check


def _table(name: str, value: Any) -> Any:
    if value is None or hasattr(value, "columns") or isinstance(value, (Mapping, list, tuple)):
        return value  # its rows and columns are checked against the prompts (`client._prompts.prompt_data`)
    raise TypeError(f"{name} must be a DataFrame, a list of dicts or a dict of lists, got {type(value).__name__}")


def _mapping(name: str, value: Any) -> dict[str, Any] | None:
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise TypeError(f"{name} must be a dict, got {type(value).__name__}")
    return dict(value)


def _adapter(name: str, value: Any) -> str | tuple[str | None, ...] | None:
    if value is None:
        return None
    if isinstance(value, str):
        if not value:
            raise ValueError(f"{name} must be an adapter's name (a non-empty string), a list of them, or None (the base model)")
        return value
    if isinstance(value, (list, tuple)):
        for item in value:
            if item is not None and (not isinstance(item, str) or not item):
                raise TypeError(f"{name} must hold adapter names or None (the base model), got {item!r}")
        return tuple(value)
    raise TypeError(f"{name} must be an adapter's name, a list with one per prompt, or None, got {type(value).__name__}")


def adapters_per_prompt(adapter: str | Sequence[str | None] | None, n_prompts: int) -> list[str | None] | None:
    """The adapter of each prompt from a resolved `adapter` option (one name for all, or one per
    prompt); None when every prompt uses the base model."""
    if adapter is None:
        return None
    if isinstance(adapter, str):
        return [adapter] * n_prompts
    if len(adapter) != n_prompts:
        raise ValueError(f"adapter= has {len(adapter)} entries for {n_prompts} prompts: give one per prompt "
                         "(None = the base model), or one name for all")
    listed = list(adapter)
    return listed if any(a is not None for a in listed) else None


# -- the schema ----------------------------------------------------------------------------------


class SamplingOptions(TypedDict, total=False):
    """SGLang's sampling parameters (its names, except `seed` -> `sampling_seed`)."""

    max_new_tokens: Annotated[int, Option(128, "tokens to generate at most", _count(0), "max_new_tokens", True)]
    min_new_tokens: Annotated[int, Option(0, "EOS and stop tokens are masked until this many were generated",
                                          _count(0), "min_new_tokens")]
    temperature: Annotated[float, Option(1.0, "0 = greedy; always sent (SGLang would use the model's default)",
                                         _number(0, note=" (0 = greedy)"), "temperature", True)]
    top_p: Annotated[float, Option(1.0, "nucleus sampling: keep the smallest set of tokens with this much mass",
                                   _number(0, 1, low_open=True, note=" (1 = off)"),
                                   "top_p", True)]
    top_k: Annotated[int, Option(-1, "keep the k most likely tokens; -1 = the whole vocabulary", _top_k, "top_k", True)]
    min_p: Annotated[float, Option(0.0, "drop tokens less likely than min_p x the most likely one", _number(0, 1),
                                   "min_p", True)]
    repetition_penalty: Annotated[float, Option(1.0, "penalise tokens already in the prompt or output; 1 = off",
                                                _number(0, 2, low_open=True, note=" (1 = off)"), "repetition_penalty")]
    stop: Annotated[str | Sequence[str] | None, Option((), "stop strings (trimmed from the text; see no_stop_trim)",
                                                       _tuple_of(str), "stop")]
    stop_token_ids: Annotated[Sequence[int] | None, Option((), "token ids that end a sample", _tuple_of(int),
                                                           "stop_token_ids")]
    ignore_eos: Annotated[bool, Option(False, "keep generating past the EOS token", _flag, "ignore_eos")]
    seed: Annotated[int | None, Option(None, "per-request sampling seed (SGLang honours it in deterministic mode)",
                                       _seed, "sampling_seed")]
    skip_special_tokens: Annotated[bool, Option(True, "leave special tokens out of the completion text", _flag,
                                                "skip_special_tokens")]
    no_stop_trim: Annotated[bool, Option(False, "keep the matched stop string at the end of the text", _flag,
                                         "no_stop_trim")]


# Declared once, taken by stream/generate and by episodes.
_SglangExtras = Annotated[Mapping[str, Any] | None, Option(
    None, "further SGLang sampling parameters, sent as they are (e.g. {'frequency_penalty': 0.5})", _mapping)]


class StreamOptions(SamplingOptions, total=False):
    """`Engine.stream()`'s options: the sampling parameters, plus SGLang's own extras."""

    sampling_params: _SglangExtras
    adapter: Annotated[str | Sequence[str | None] | None, Option(
        None, "the LoRA adapter to sample with (loaded with eng.load_adapter), or one per prompt (None = the base "
        "model): base and adapters share one batch; rows record it in the `adapter` column", _adapter)]


class GenerateOptions(StreamOptions, total=False):
    """`Engine.generate()` / `agenerate()`'s options."""

    n: Annotated[int, Option(1, "samples per prompt", _count(1))]
    logprobs: Annotated[bool, Option(True, "return the logprob of every generated token", _flag)]
    top_logprobs: Annotated[int, Option(0, "also return the k most likely tokens at every position", _count(0))]
    stream: Annotated[bool, Option(False, "stream over SSE, to measure time-to-first-token and inter-token latency",
                                   _flag)]
    chunk_size: Annotated[int | None, Option(
        None, "prompts per batched /generate request; None: enough requests (about 16) that progress advances "
        "as they are answered, at most 256 prompts each (behind a router every request is one prompt, and "
        "chunk_size x max_in_flight prompts are in flight)", _optional_count(1, "automatic"))]
    max_in_flight: Annotated[int | None, Option(
        None, "requests (chunks) in flight at once; None: enough to fill the batch the server runs at once, plus one",
        _optional_count(1, "fill the server's batch"))]
    progress: Annotated[bool | None, Option(
        None, "a progress line, then the call's totals: True, False, None = the Engine's setting (auto: once the "
        "call has taken a second)", _optional_flag)]
    cache: Annotated[bool | str | None, Option(
        None, "the completion cache: True (greedy or seeded calls: a repeated call makes no request), 'always' "
        "(unseeded sampling too: it replays the first draw), False; None = the Engine's cache=", cache_mode)]
    data: Annotated[Any, Option(
        None, "per-prompt data (a DataFrame with a row per prompt, a list of dicts or a dict of lists): its columns "
        "join every sample of that prompt in res.df (e.g. the answer, the task name)", _table)]


def _choice(*allowed: str) -> Check:
    def check(name: str, value: Any) -> str:
        if value not in allowed:
            guess = difflib.get_close_matches(str(value), allowed, n=1)
            hint = f"; did you mean {guess[0]!r}?" if guess else ""
            raise ValueError(f"{name} must be one of {', '.join(map(repr, allowed))}, got {value!r}{hint}")
        return str(value)

    return check


def check_seconds(name: str, value: Any) -> float | None:
    """A timeout option's value: a positive finite number of seconds, or None (no limit); the one
    rule for every timeout rlgen takes (add_rewards' `timeout`, episodes' `env_timeout`,
    `tool_env(timeout=)`)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a positive number of seconds or None (no limit), got {value!r}")
    return float(value)


def _any(name: str, value: Any) -> Any:
    return value  # checked against the reward functions it names (`rewards._scoring`)


class RewardOptions(TypedDict, total=False):
    """`Rollouts.add_rewards()`' options."""

    weights: Annotated[Mapping[str, float] | Sequence[float] | None, Option(
        None, "per function (a dict by name, or a list in order) for the combined `reward`; default 1 each", _any)]
    style: Annotated[str | Mapping[str, str] | None, Option(
        None, "force a call style ('trl', 'verl', 'areal', 'row', 'columns'), for all or by name; default: read "
        "from each function's signature", _any)]
    columns: Annotated[Mapping[str, str] | None, Option(
        None, "where a parameter's values come from, e.g. {'ground_truth': 'answer'}", _mapping)]
    mode: Annotated[str, Option(
        "process", "'process' (worker processes: a timeout kills the call, a crash marks its rows), 'thread' "
        "(cheap functions; a timeout stops waiting only) or 'inline' (here; exceptions raise, for %debug)",
        _choice("process", "thread", "inline"))]
    timeout: Annotated[float | None, Option(30.0, "seconds one call may take (process, thread); None: no limit",
                                            check_seconds)]
    workers: Annotated[int | None, Option(None, "processes or threads; default: the CPUs this process may use",
                                          _optional_count(1, "the CPU count"))]
    batch_size: Annotated[int, Option(64, "rows per call for batch (TRL-style) functions", _count(1))]
    advantage: Annotated[str, Option(
        "grpo", "'grpo' ((r - mean) / (std + eps), std with ddof=1, as TRL), 'drgrpo' (r - mean), 'rloo' "
        "(leave-one-out) or 'batch' (divided by the batch's std)", _choice("grpo", "drgrpo", "rloo", "batch"))]
    eps: Annotated[float, Option(1e-4, "added to the std before dividing", _number(0))]
    progress: Annotated[bool | None, Option(
        None, "a progress line (one score per row and function): True, False, None = once scoring has taken a second",
        _optional_flag)]


def _version_name(name: str, value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not re.match(r"^[A-Za-z][A-Za-z0-9_.-]{0,63}$", value) or value == "logged":
        raise ValueError(f"{name} must name the new reward version: a letter, then up to 63 letters, digits, "
                         f"'_', '.' or '-', and not 'logged' (the rewards the run logged); got {value!r}")
    return value


def _steps(name: str, value: Any) -> Any:
    if value is None or isinstance(value, range) or (isinstance(value, int) and not isinstance(value, bool)):
        return value
    if isinstance(value, Sequence) and not isinstance(value, (str, bytes)) and all(
            isinstance(v, int) and not isinstance(v, bool) for v in value):
        return list(value)
    raise TypeError(f"{name} must be None (every step), a step, a range or a list of steps; got {value!r}"[:300])


class RescoreOptions(RewardOptions, total=False):
    """`RolloutLog.rescore()`' options: add_rewards' options, plus which rows and how many times."""

    version: Annotated[str | None, Option(
        None, "the new reward version's name (default: the functions' names joined by '+')", _version_name)]
    steps: Annotated[Any, Option(None, "a step, a range or a list of steps; None: every step", _steps)]
    repeats: Annotated[int, Option(
        1, "score each row this many times (a stochastic reward, e.g. an LLM judge: its spread per row)", _count(1))]


def _template_text(name: str, value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise TypeError(f"{name} must be a Jinja chat template (a non-empty str), or None for the model's own; "
                        f"got {value!r}"[:300])
    return value


def _per_prompt(name: str, value: Any) -> Any:
    if value is None or isinstance(value, Mapping) or (isinstance(value, Sequence) and not isinstance(value, (str, bytes))):
        return value  # its length and names are checked against the prompts (`episodes._runner.episode_data`)
    raise TypeError(f"{name} must be None, a list with one item per prompt, or a dict of such lists; "
                    f"got {type(value).__name__}")


class EpisodeOptions(SamplingOptions, total=False):
    """`Engine.episodes()`' options: the sampling parameters (per assistant turn), plus its own."""

    sampling_params: _SglangExtras
    sampling_seed: Annotated[int | None, Option(
        None, "seed= under SGLang's name (which episodes() took first); give one of the two", _seed)]
    n: Annotated[int, Option(1, "episodes per prompt", _count(1))]
    max_turns: Annotated[int, Option(4, "the most assistant turns per episode ('max_turns' after)", _count(1))]
    data: Annotated[Any, Option(
        None, "one item per prompt (or a dict of per-prompt lists), given to the environment; a dict's keys "
        "become columns of .df", _per_prompt)]
    env_timeout: Annotated[float | None, Option(
        30.0, "seconds per environment step ('env_timeout' after); None: no limit", check_seconds)]
    chat_template: Annotated[str | None, Option(
        None, "render the turns with this Jinja chat template instead of the model's (e.g. a thinking template "
        "that rewrites history, to see its drift)", _template_text)]
    progress: Annotated[bool | None, Option(
        None, "a progress line: True, False, None = the Engine's setting", _optional_flag)]
    max_in_flight: Annotated[int, Option(256, "the most turns in flight at once (server-side requests)", _count(1))]
    batch_turns: Annotated[bool, Option(
        True, "send the turns that are ready together as one batched /generate "
        "(docs/archive/benchmarks-rounds-2026-12.md, 'Multi-turn episodes (H200, 2026-12-02, issue 25)', run 7); "
        "False: one request per turn, each answered as soon as its sample finishes", _flag)]


# SGLang 0.5.17's `/pause_generation` modes (`PauseGenerationReqInput.mode`), what each does to the
# requests in flight, in the words of docs/generation.md ("Jobs that span a weight update").
PAUSE_MODES = ("abort", "retract", "in_place")


def _pause_mode(name: str, value: Any) -> str | None:
    if value is None:
        return None
    return str(_choice(*PAUSE_MODES)(name, value))


class PauseOptions(TypedDict, total=False):
    """How a weight update treats the generation running on the server (`update_weights`,
    `update_weights_from_disk`, `load_adapter`): declared once, checked before anything is sent."""

    pause: Annotated[str | None, Option(
        None, "pause the server's generation around the update: 'abort' (running requests end and are "
        "continued under the new weights: every token's version is exact, no stale KV), 'retract' (requests go "
        "back to the queue and recompute their KV; the prefix cache keeps old-weight prefixes), 'in_place' "
        "(requests keep their KV, computed by the old weights); None: 'abort' while a job (eng.submit) runs, "
        "else no pause", _pause_mode)]


def _share(name: str, value: Any) -> float | None:
    if value is None:
        return None
    return float(_number(0, 1, low_open=True, note=" (the share of the job's prompt groups that must be done)")(name, value))


class JobResultOptions(TypedDict, total=False):
    """`GenerationJob.result()`'s options: how much of the job to wait for, and what happens to the rest."""

    timeout: Annotated[float | None, Option(
        None, "seconds to wait at most (TimeoutError; the job goes on); None: no limit", check_seconds)]
    min_done: Annotated[float | None, Option(
        None, "return once this share of the job's prompt groups (all n samples of a prompt) is done, in (0, 1] "
        "(slime's rollout_batch_size out of over_sampling_batch_size; APRIL's target); None: wait for all", _share)]
    rest: Annotated[str, Option(
        "keep", "with min_done, the groups not done yet: 'keep' (they run on in the job: a later result() "
        "returns them) or 'recycle' (aborted now, their tokens kept, and handed back in job.partial for "
        "eng.submit(job.partial) to continue: APRIL's recycling, slime's --partial-rollout)",
        _choice("keep", "recycle"))]


# SGLang option names rlgen passes through unchanged via `sampling_params=` (the server validates
# them). Listed so that a misspelt one still gets a "did you mean".
_SGLANG_EXTRA = (
    "frequency_penalty", "presence_penalty", "json_schema", "regex", "ebnf", "structural_tag",
    "stop_regex", "logit_bias", "spaces_between_special_tokens", "custom_params", "stream_interval",
)  # fmt: skip

def _modules(name: str, value: Any) -> tuple[str, ...]:
    if isinstance(value, str):
        value = (value,)
    if not isinstance(value, (list, tuple)) or not value or not all(isinstance(m, str) and m for m in value):
        raise TypeError(f"{name} must be 'all' or a list of module names, e.g. ['q_proj', 'v_proj'], got {value!r}")
    if "all" in value and len(value) > 1:
        raise ValueError(f"{name}: 'all' stands alone (every linear layer SGLang supports), got {list(value)}")
    return tuple(value)


def _paths(name: str, value: Any) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, Mapping) or not all(isinstance(k, str) and k for k in value):
        raise TypeError(f"{name} must be a dict of adapter name -> directory, got {value!r}")
    return {k: str(v) for k, v in value.items()}


class LoraOptions(TypedDict, total=False):
    """`Engine(lora=...)`: SGLang's LoRA serving (`--enable-lora` and its flags)."""

    max_rank: Annotated[int, Option(
        16, "the largest adapter rank the server takes (its LoRA memory grows with it)", _count(1))]
    target_modules: Annotated[str | Sequence[str], Option(
        "all", "the modules adapters may touch: 'all' (every linear layer) or names such as ['q_proj', 'v_proj']",
        _modules)]
    max_loras_per_batch: Annotated[int, Option(
        8, "adapters in one running batch, the base model counted (SGLang's default)", _count(1))]
    adapters: Annotated[Mapping[str, Any] | None, Option(
        None, "adapters loaded at start: {name: PEFT adapter directory}", _paths)]


def lora_options(value: Any) -> dict[str, Any] | None:
    """`Engine(lora=...)` resolved: None/False (no LoRA serving), True (the defaults) or a dict of
    `LoraOptions`."""
    if value is None or value is False:
        return None
    if value is True:
        return resolve(LoraOptions, {})
    if isinstance(value, Mapping):
        return resolve(LoraOptions, value)
    raise TypeError(f"lora must be True, False, None or a dict of {sorted(_fields(LoraOptions))}, got {value!r}")


Schema = type  # one of the TypedDicts above
_SCHEMAS: dict[type, dict[str, tuple[Any, Option]]] = {}


def _fields(schema: Schema) -> dict[str, tuple[Any, Option]]:
    """name -> (annotated type, Option), in declaration order (read once per schema)."""
    found = _SCHEMAS.get(schema)
    if found is None:
        hints = get_type_hints(schema, include_extras=True)
        found = {name: (hint.__origin__, hint.__metadata__[0]) for name, hint in hints.items()}
        _SCHEMAS[schema] = found
    return found


def defaults(schema: Schema) -> dict[str, Any]:
    """Every option of `schema` at its default."""
    return {name: option.default for name, (_, option) in _fields(schema).items()}


def resolve(schema: Schema, options: Mapping[str, Any]) -> dict[str, Any]:
    """`options` checked and completed with the defaults: every name of `schema`, each value valid.

    Raises:
        TypeError: an unknown option (with the closest known name) or a value of the wrong type.
        ValueError: a value out of range, or options that contradict each other.
    """
    fields = _fields(schema)
    for name in options:
        if name not in fields:
            raise TypeError(_unknown_message(name, list(fields)))
    out: dict[str, Any] = {}
    for name, (_, option) in fields.items():
        value = options.get(name, option.default)
        out[name] = option.check(name, value) if option.check is not None else value
    if "min_new_tokens" in out and out["min_new_tokens"] > out["max_new_tokens"]:
        raise ValueError(f"min_new_tokens ({out['min_new_tokens']}) must not exceed max_new_tokens ({out['max_new_tokens']})")
    if out.get("sampling_seed") is not None:  # EpisodeOptions' older name of `seed`: one seed, read as `seed`
        if out["seed"] is not None and out["seed"] != out["sampling_seed"]:
            raise ValueError(f"seed={out['seed']} and sampling_seed={out['sampling_seed']} name one seed; give one")
        out["seed"] = out["sampling_seed"]
    extra = out.get("sampling_params")
    if extra:
        clash = sorted(set(extra) & {o.sglang for _, o in fields.values() if o.sglang})
        if clash:
            raise ValueError(f"{clash} given both as options and in sampling_params; pass each once, as an option")
    return out


def to_sglang(resolved: Mapping[str, Any]) -> dict[str, Any]:
    """SGLang's `sampling_params` for resolved options: always-sent ones, the others where they
    differ from their default, then `sampling_params` as given."""
    params: dict[str, Any] = {}
    for name, (_, option) in _fields(SamplingOptions).items():
        value = resolved[name]
        if option.sglang is not None and (option.always_sent or value != option.default):
            params[option.sglang] = list(value) if isinstance(value, tuple) else value
    params.update(resolved.get("sampling_params") or {})
    return params


def _unknown_message(name: str, known: Sequence[str]) -> str:
    guess = difflib.get_close_matches(name, [*known, *_SGLANG_EXTRA], n=1)
    if name in _SGLANG_EXTRA:
        return f"unknown option {name!r}; pass SGLang-only options as sampling_params={{{name!r}: ...}}"
    if guess and guess[0] in _SGLANG_EXTRA:
        return (f"unknown option {name!r}; did you mean {guess[0]!r}? "
                f"SGLang-only options go in sampling_params={{{guess[0]!r}: ...}}")
    if guess:
        return f"unknown option {name!r}; did you mean {guess[0]!r}?"
    return f"unknown option {name!r}; the options are: {', '.join(known)}"


# -- signatures and docs -------------------------------------------------------------------------

F = TypeVar("F", bound=Callable[..., Any])


def takes_options(schema: Schema) -> Callable[[F], F]:
    """Give a `def f(self, prompts, /, **options: Unpack[schema])` method the signature and docs of
    its options: `inspect.signature` (help(), Jupyter's Shift-Tab, IPython's keyword completion)
    lists each option with its type and default, and the docstring gains an "Options" section."""

    def decorate(func: F) -> F:
        signature = inspect.signature(func)
        positional = [p for p in signature.parameters.values() if p.kind is not inspect.Parameter.VAR_KEYWORD]
        keywords = [
            inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=option.default, annotation=hint)
            for name, (hint, option) in _fields(schema).items()
        ]
        func.__signature__ = signature.replace(parameters=[*positional, *keywords])  # type: ignore[attr-defined]
        lines = [f"    {name}={option.default!r}: {option.doc}" for name, (_, option) in _fields(schema).items()]
        func.__doc__ = (inspect.cleandoc(func.__doc__ or "") + "\n\nOptions (keyword-only):\n" + "\n".join(lines))
        return func

    return decorate
