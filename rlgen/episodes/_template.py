"""Token-in/token-out turns through a chat template: the first prompt, the delta after a turn, the closing EOS.

Owns: turning chat messages into the token ids of a multi-turn episode without ever re-tokenizing
history. `first_prompt_ids` renders the opening messages (with the generation prompt);
`message_delta_ids` gives the tokens to append after an assistant turn that ended with the model's
EOS: the new environment/tool/user messages and the next generation prompt, cut from a render of a
fixed base conversation *token-wise*, just after the base's last EOS, so that the template's tokens
after EOS (ChatML's `\\n`, which the model never samples) are kept; `closing_ids` gives the EOS to
append (mask 0) when a turn stopped on a stop string or on length. The check that the base render is
a token prefix of the longer render, and `TemplateError` when it is not; `check_template`, whether a
chat template compiles at all (what concerns every episode of a call, checked before it runs). `DeltaRenderer` renders the
base once for many deltas (an episodes call asks for one per environment step), and renders messages
it has rendered before only once (an environment that answers every episode the same way).

Knows nothing about servers, HTTP, requests, sampling, rewards or the result object: it takes a
Hugging Face tokenizer with a chat template and messages, and returns lists of ids.

Why token-wise: the default model's template is plain ChatML, `<|im_start|>{role}\\n{content}<|im_end|>\\n`.
The model stops at `<|im_end|>` (EOS, id 2) and never samples the `\\n` (id 198) after it. A delta
taken as text (render(all) minus render(history), or a base stripped as text) starts at
`<|im_start|>` and loses that `\\n` at every turn boundary; cutting the ids just after the base's
EOS keeps it, and the episode's ids equal the whole-conversation render.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..core._errors import RlgenError

__all__ = ["BASE_MESSAGES", "DELTA_MEMO", "DeltaRenderer", "RenderMemo", "TemplateError", "check_template",
           "closing_ids", "eos_id", "first_prompt_ids", "memo_key", "message_delta_ids", "render_ids",
           "template_name"]

Messages = Sequence[Mapping[str, Any]]

# The fixed base conversation: it ends with an assistant message (whose EOS the cut follows). Its
# assistant text has no `<think>` block, so templates that rewrite earlier assistant turns leave it
# unchanged whether or not a later user message follows.
BASE_MESSAGES: tuple[dict[str, str], ...] = (
    {"role": "system", "content": "S"},
    {"role": "user", "content": "U"},
    {"role": "assistant", "content": "A"},
)


class TemplateError(RlgenError, ValueError):
    """A chat template cannot give token-faithful deltas (e.g. it renders the base conversation
    differently once messages follow it), or the tokenizer has no EOS or no chat template."""


def template_name(tokenizer: Any) -> str:
    """A short name for the tokenizer's chat template: the tokenizer's path or name and a hash of
    the template text (so two templates on one tokenizer are told apart in messages)."""
    template = getattr(tokenizer, "chat_template", None)
    digest = hashlib.sha1(str(template).encode()).hexdigest()[:8] if template else "none"
    return f"{getattr(tokenizer, 'name_or_path', '') or type(tokenizer).__name__} (chat template {digest})"


def eos_id(tokenizer: Any) -> int:
    """The tokenizer's EOS id (the token a turn ends with, `<|im_end|>` = 2 on the default model)."""
    eos = getattr(tokenizer, "eos_token_id", None)
    if isinstance(eos, (list, tuple)):
        eos = eos[0] if eos else None
    if not isinstance(eos, int):
        raise TemplateError(f"tokenizer {template_name(tokenizer)} has no eos_token_id")
    return eos


def render_ids(tokenizer: Any, messages: Messages, *, add_generation_prompt: bool,
               tools: Sequence[Mapping[str, Any]] | None = None) -> list[int]:
    """`tokenizer.apply_chat_template(messages, tokenize=True)` as a plain list of ids, whatever the
    transformers version returns (a list, or a BatchEncoding in transformers 5)."""
    if not getattr(tokenizer, "chat_template", None):
        raise TemplateError(f"tokenizer {template_name(tokenizer)} has no chat template")
    out = tokenizer.apply_chat_template(
        [dict(m) for m in messages], tools=list(tools) if tools is not None else None,
        add_generation_prompt=add_generation_prompt, tokenize=True, return_dict=False,
    )
    if isinstance(out, Mapping):
        out = out["input_ids"]
    if hasattr(out, "tolist"):
        out = out.tolist()
    if out and isinstance(out[0], (list, tuple)):  # a batch of one
        out = out[0]
    return [int(i) for i in out]


def check_template(tokenizer: Any, *, tools: Sequence[Mapping[str, Any]] | None = None) -> None:
    """Raise `TemplateError` when the tokenizer's chat template does not compile (a Jinja syntax
    error), or renders an assistant message without the EOS token after it (no turn's end to cut a
    delta after, nor to close a turn with: `DeltaRenderer`): every episode of a call would fail on
    it, so a call checks it before anything is sent. A template that refuses particular messages
    (`raise_exception`, a role it does not know, the base conversation's system message) is left to
    the episodes that send them ("template_error"), as is a tokenizer without a template."""
    if not getattr(tokenizer, "chat_template", None):
        return
    import jinja2

    try:
        render_ids(tokenizer, [{"role": "user", "content": "Hi."}], add_generation_prompt=True, tools=tools)
        base = render_ids(tokenizer, BASE_MESSAGES, add_generation_prompt=False, tools=tools)
    except jinja2.TemplateSyntaxError as e:
        raise TemplateError(f"the chat template of {template_name(tokenizer)} does not compile: {e} (line "
                            f"{e.lineno}); fix the Jinja syntax (chat_template=)") from None
    except Exception:  # it compiled, and refused this probe: the episodes' messages will tell
        return
    eos = eos_id(tokenizer)
    if eos not in base:
        name = getattr(tokenizer, "eos_token", None) or f"id {eos}"
        raise TemplateError(
            f"the chat template of {template_name(tokenizer)} puts no EOS token ({name!r}, id {eos}) after an "
            "assistant message, so an episode cannot tell where a turn ends nor append the environment's "
            "messages token for token; end each assistant message with the EOS token in the template (e.g. "
            "`{{ message['content'] + eos_token }}`), or pass chat_template= one that does")


def first_prompt_ids(tokenizer: Any, messages: Messages, *,
                     tools: Sequence[Mapping[str, Any]] | None = None) -> list[int]:
    """The ids of the episode's first request: `messages` rendered with the generation prompt.

    Args:
        tokenizer: a Hugging Face tokenizer with a chat template.
        messages: the opening messages (system, user, maybe demo exchanges).
        tools: tool schemas passed to the template (ignored by templates without tool support).
    """
    return render_ids(tokenizer, messages, add_generation_prompt=True, tools=tools)


def _last_index(ids: Sequence[int], value: int) -> int:
    for i in range(len(ids) - 1, -1, -1):
        if ids[i] == value:
            return i
    return -1


def message_delta_ids(tokenizer: Any, new_messages: Messages, *,
                      tools: Sequence[Mapping[str, Any]] | None = None) -> list[int]:
    """The ids to append after an assistant turn that ended with the model's EOS: `new_messages`
    (tool results, user or environment messages) and the next generation prompt.

    Computed by rendering `BASE_MESSAGES + new_messages` with the generation prompt and cutting the
    ids just after the base's last EOS, so the template's tokens between EOS and the next message
    (ChatML's `\\n`) are part of the delta. The base's own render must be a token prefix of that
    render up to its last EOS; `TemplateError` says so, naming the template, when it is not (a
    template that renders the last assistant turn differently from earlier ones).

    A turn that did not end with EOS (stop string, length) needs `closing_ids` first.

    Args:
        tokenizer: a Hugging Face tokenizer with a chat template.
        new_messages: the messages that follow the assistant turn (not an assistant turn itself first).
        tools: tool schemas, as given to `first_prompt_ids`.
    """
    if not new_messages:
        raise ValueError("message_delta_ids needs at least one new message")
    return DeltaRenderer(tokenizer, tools=tools)(new_messages)


# The most distinct message lists a `DeltaRenderer` keeps the delta of (first come, first kept).
DELTA_MEMO = 1024


def memo_key(messages: Messages) -> tuple[Any, ...] | None:
    """A hashable key equal for equal messages whose values are all str, int, float, bool or None
    (key order ignored, a value's type kept: True is not 1); None for any other message (not memoised)."""
    key: list[tuple[tuple[str, str, Any], ...]] = []
    for m in messages:
        if type(m) is dict and len(m) == 2 and type(m.get("role")) is str and type(m.get("content")) is str:
            key.append((("content", "str", m["content"]), ("role", "str", m["role"])))  # the usual message
            continue
        if not all(isinstance(k, str) and (v is None or isinstance(v, (str, int, float, bool))) for k, v in m.items()):
            return None
        key.append(tuple(sorted((k, type(v).__name__, v) for k, v in m.items())))
    return tuple(key)


class RenderMemo:
    """Renders of message lists of plain values (`memo_key`), kept (at most `DELTA_MEMO`, first come,
    first kept) and handed out as a fresh list each time; other lists are rendered every time."""

    def __init__(self) -> None:
        self._kept: dict[tuple[Any, ...], list[int]] = {}

    def __call__(self, messages: Messages, render: Callable[[], list[int]]) -> list[int]:
        key = memo_key(messages)
        if key is not None and key in self._kept:
            return list(self._kept[key])
        ids = render()
        if key is not None and len(self._kept) < DELTA_MEMO:
            self._kept[key] = list(ids)
        return ids


class DeltaRenderer:
    """`message_delta_ids` for many deltas of one tokenizer and one tool list: the base
    conversation is rendered (and its cut found) once, so each delta costs one render, not two;
    and the delta of messages of plain values (str, numbers, None) it rendered before is given
    again without a render (a fresh list each time; at most `DELTA_MEMO` kept). Knows nothing more
    than `message_delta_ids`; raises what it raises, the base's own `TemplateError` already at
    construction."""

    def __init__(self, tokenizer: Any, *, tools: Sequence[Mapping[str, Any]] | None = None) -> None:
        self.tokenizer, self.tools = tokenizer, tools
        self._memo = RenderMemo()
        self.eos = eos_id(tokenizer)
        self.base = render_ids(tokenizer, BASE_MESSAGES, add_generation_prompt=False, tools=tools)
        self.cut = _last_index(self.base, self.eos) + 1
        if self.cut == 0:
            raise TemplateError(
                f"chat template of {template_name(tokenizer)} does not end an assistant message with the "
                f"EOS token (id {self.eos}): there is no EOS in the render of {list(BASE_MESSAGES)}, so no "
                "token-wise delta can be cut after it")

    def __call__(self, new_messages: Messages) -> list[int]:
        if not new_messages:
            raise ValueError("message_delta_ids needs at least one new message")
        return self._memo(new_messages, lambda: self._render(new_messages))

    def _render(self, new_messages: Messages) -> list[int]:
        base, cut, tokenizer = self.base, self.cut, self.tokenizer
        full = render_ids(tokenizer, [*BASE_MESSAGES, *new_messages], add_generation_prompt=True, tools=self.tools)
        if full[:cut] != base[:cut]:
            at = next(i for i, (a, b) in enumerate(zip(base[:cut], full)) if a != b) if len(full) >= cut else len(full)
            raise TemplateError(
                f"chat template of {template_name(tokenizer)} is not append-only: the base conversation "
                f"renders differently once messages follow it (first differing token at {at} of {cut}: "
                f"{tokenizer.decode(base[at:cut])!r} alone vs {tokenizer.decode(full[at:cut])!r} followed). "
                "Token-faithful deltas need the base's render, up to its last EOS, to be a token prefix")
        return full[cut:]


def closing_ids(tokenizer: Any, last_turn_ids: Sequence[int]) -> list[int]:
    """What to append after a sampled assistant turn before `message_delta_ids` applies: `[]` when
    the turn ended with EOS, else `[eos]` (it stopped on a stop string or on length). The appended
    EOS was not sampled: give it mask 0 (and logprob 0). `tokenizer` may be its EOS id itself."""
    eos = tokenizer if isinstance(tokenizer, int) else eos_id(tokenizer)
    return [] if last_turn_ids and last_turn_ids[-1] == eos else [eos]
