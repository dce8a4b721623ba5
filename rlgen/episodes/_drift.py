"""The drift inspector: an episode's token-in/token-out ids against the trainer's re-render of its messages.

Owns: `drift(tokenizer, messages, ids)`, which renders the final message list through the chat
template the way a trainer would (`apply_chat_template`, tokenized), compares it with the ids the
episode actually sent and sampled, and reports the first divergence (token position, the turn it
falls in, a window of ids and token text either side in both sequences) and its cause; the `Drift`
record with its one-line repr and notebook HTML; `drift_summary(drifts)`, episodes counted by cause
with the share of assistant turns whose sampled ids are not what re-tokenizing their text gives.

Causes, for each differing stretch (the first one names the episode's `cause`):
- "same": the ids are the re-render, token for token.
- "boundary": a few tokens the template adds or drops at a turn boundary (the `\\n` after EOS that a
  text delta loses, an EOS a stop string left out, a BOS).
- "retokenized": the same text as different tokens (a sampled `'\\n\\n'` where re-tokenizing gives
  `'\\n','\\n'`): the trainer would train on tokens the model never sampled.
- "rewritten history": the text differs inside an earlier assistant turn (a thinking template that
  drops `<think>...</think>` from assistant turns before the last user turn).
- "other": none of these (e.g. messages that are not the ones the ids were built from).

Knows nothing about servers, HTTP, sampling, rewards or the result object, nor how the ids were
built (`_template` builds them; this module only reads them).
"""

from __future__ import annotations

import bisect
import html
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ._template import BASE_MESSAGES, Messages, eos_id, render_ids, template_name

if TYPE_CHECKING:
    import pandas as pd

CAUSES: tuple[str, ...] = ("same", "boundary", "retokenized", "rewritten history", "other")
_COLORS = {"same": "#2e7d32", "boundary": "#f9a825", "retokenized": "#ef6c00",
           "rewritten history": "#c62828", "other": "#6a1b9a"}


@dataclass(frozen=True)
class Drift:
    """One episode's ids against the re-render of its messages.

    `position` is the first token index where the two differ (None when they are the same);
    `turn` the turn it falls in: the index of the run of equal `roles` when roles were given, else
    the message index in `messages` (counting EOS tokens, one per message: ChatML and its kin);
    `role` that turn's role. `n_render` counts the re-render as compared (without the template's
    tokens after a final assistant EOS, see `drift`). The windows start at `window_start` in both sequences; `*_tokens` are
    each id decoded alone. `causes` lists the cause of every differing stretch, first seen first;
    `assistant_turns` / `retokenized_turns` count the assistant spans in `ids` and those whose ids
    differ from re-tokenizing their decoded text.
    """

    cause: str
    position: int | None
    turn: int | None
    role: str | None
    n_ids: int
    n_render: int
    window_start: int
    ids_window: tuple[int, ...]
    render_window: tuple[int, ...]
    ids_tokens: tuple[str, ...]
    render_tokens: tuple[str, ...]
    causes: tuple[str, ...]
    assistant_turns: int
    retokenized_turns: int
    template: str

    @property
    def same(self) -> bool:
        return self.cause == "same"

    def __repr__(self) -> str:
        if self.position is None:
            where = ""
        else:
            turn = "" if self.turn is None else f", turn={self.turn}" + (f" ({self.role})" if self.role else "")
            where = f", position={self.position}{turn}"
        return (f"Drift(cause={self.cause!r}{where}, ids={self.n_ids}, render={self.n_render}, "
                f"retokenized={self.retokenized_turns}/{self.assistant_turns} assistant turns)")

    def _repr_html_(self) -> str:
        color = _COLORS.get(self.cause, "#555")
        head = (f'<div style="font-family:sans-serif;font-size:13px"><span style="background:{color};color:#fff;'
                f'padding:1px 6px;border-radius:3px">{html.escape(self.cause)}</span> '
                f"{html.escape(repr(self))}</div>")
        if self.position is None:
            return head
        rows = "".join(
            f'<tr><td style="padding:2px 6px;color:#555;white-space:nowrap">{label}</td>'
            f'<td style="padding:2px 6px;font-family:monospace">{self._tokens_html(ids, toks)}</td></tr>'
            for label, ids, toks in (("episode ids", self.ids_window, self.ids_tokens),
                                     ("re-render", self.render_window, self.render_tokens)))
        return f'{head}<table style="border-collapse:collapse;margin-top:4px">{rows}</table>'

    def _tokens_html(self, ids: tuple[int, ...], tokens: tuple[str, ...]) -> str:
        out = []
        for k, (i, t) in enumerate(zip(ids, tokens)):
            at = self.window_start + k == self.position
            style = ("background:#ffcdd2;outline:1px solid #c62828;" if at else "background:#eee;")
            shown = html.escape(t.replace("\n", "↵").replace(" ", "·")) or "&nbsp;"
            out.append(f'<span title="id {i} at {self.window_start + k}" style="{style}margin:0 1px;'
                       f'padding:0 2px;border-radius:2px">{shown}</span>')
        if self.position is not None and self.window_start + len(ids) <= self.position:
            out.append('<span style="color:#c62828">(ends)</span>')
        return "".join(out)


def _runs(labels: Sequence[Any]) -> list[tuple[int, int, Any]]:
    """Maximal runs of equal labels as (start, end, label)."""
    runs: list[tuple[int, int, Any]] = []
    for i, lab in enumerate(labels):
        if runs and runs[-1][2] == lab:
            runs[-1] = (runs[-1][0], i + 1, lab)
        else:
            runs.append((i, i + 1, lab))
    return runs


def _find(seq: Sequence[int], sub: Sequence[int], start: int) -> int:
    n = len(sub)
    for i in range(start, len(seq) - n + 1):
        if list(seq[i:i + n]) == list(sub):
            return i
    return -1


def _generation_prompt(tokenizer: Any, tools: Sequence[Mapping[str, Any]] | None) -> list[int]:
    """The tokens the template adds as the generation prompt (`<|im_start|>assistant\\n` in ChatML);
    [] when the template does not simply append them."""
    without = render_ids(tokenizer, BASE_MESSAGES[:2], add_generation_prompt=False, tools=tools)
    with_ = render_ids(tokenizer, BASE_MESSAGES[:2], add_generation_prompt=True, tools=tools)
    return with_[len(without):] if with_[:len(without)] == without else []


def _assistant_spans(tokenizer: Any, ids: Sequence[int], roles: Sequence[str] | None,
                     tools: Sequence[Mapping[str, Any]] | None, eos: int) -> list[tuple[int, int]]:
    """Where the assistant turns sit in `ids`: the runs labelled "assistant" in `roles`, else each
    stretch after the template's generation prompt up to and with the next EOS."""
    if roles is not None:
        return [(a, b) for a, b, lab in _runs(roles) if lab == "assistant"]
    gp = _generation_prompt(tokenizer, tools)
    spans: list[tuple[int, int]] = []
    at = _find(ids, gp, 0) if gp else -1
    while at >= 0:
        start = at + len(gp)
        end = next((i + 1 for i in range(start, len(ids)) if ids[i] == eos), len(ids))
        spans.append((start, end))
        at = _find(ids, gp, end)
    return spans


def _retokenized(tokenizer: Any, span: Sequence[int], eos: int) -> bool:
    body = list(span[:-1] if span and span[-1] == eos else span)
    text = tokenizer.decode(body, skip_special_tokens=False, clean_up_tokenization_spaces=False)
    return list(tokenizer.encode(text, add_special_tokens=False)) != body


def _align(a: Sequence[int], b: Sequence[int], start: int, k: int = 8) -> list[tuple[str, int, int, int, int]]:
    """The differing stretches of `a` and `b` after `start`, as difflib-style opcodes (tag, i1, i2, j1,
    j2). At each divergence the walk resyncs where the next `k` tokens agree again (or both tails
    do), at the fewest tokens skipped on both sides: linear in the episode for local differences,
    where difflib's SequenceMatcher took seconds on a 6,700-token episode."""
    index: dict[tuple[int, ...], list[int]] = {}
    for j in range(start, len(b) - k + 1):
        index.setdefault(tuple(b[j:j + k]), []).append(j)
    ops: list[tuple[str, int, int, int, int]] = []
    i = j = start
    while i < len(a) or j < len(b):
        if i < len(a) and j < len(b) and a[i] == b[j]:
            i, j = i + 1, j + 1
            continue
        best: tuple[int, int, int] | None = None
        for ai in range(i, len(a) + 1):
            if best is not None and ai - i >= best[0]:
                break
            if len(a) - ai >= k:
                pos = index.get(tuple(a[ai:ai + k]), [])
                x = bisect.bisect_left(pos, j)
                if x == len(pos):
                    continue
                bj = pos[x]
            else:  # near the end: the two tails must agree
                bj = len(b) - (len(a) - ai)
                if bj < j or list(a[ai:]) != list(b[bj:]):
                    continue
            if best is None or ai - i + bj - j < best[0]:
                best = (ai - i + bj - j, ai, bj)
        _, ai, bj = best if best is not None else (0, len(a), len(b))
        ops.append(("replace" if ai > i and bj > j else "delete" if ai > i else "insert", i, ai, j, bj))
        i, j = ai, bj
    return ops


def _classify(tokenizer: Any, op: tuple[str, int, int, int, int], ids: Sequence[int], render: Sequence[int],
              spans: Sequence[tuple[int, int]], boundary_tokens: set[int], eos: int) -> str:
    _, i1, i2, j1, j2 = op
    a, b = list(ids[i1:i2]), list(render[j1:j2])

    def text(x: list[int]) -> str:
        return str(tokenizer.decode(x, skip_special_tokens=False, clean_up_tokenization_spaces=False))

    if a and b and text(a) == text(b):
        return "retokenized"
    chunk = a or b
    seq, k = (ids, i1) if a else (render, j1)
    if (not (a and b) and len(chunk) <= 4 and set(chunk) <= boundary_tokens
            and (k == 0 or seq[k - 1] == eos or eos in chunk or k + len(chunk) == len(seq))):
        return "boundary"
    if any(max(i1, s) < min(max(i2, i1 + 1), e) for s, e in spans[:-1]):  # overlaps an earlier assistant turn
        return "rewritten history"
    return "other"


def _turn(p: int, ids: Sequence[int], messages: Messages, roles: Sequence[str] | None,
          tokenizer: Any, tools: Sequence[Mapping[str, Any]] | None, eos: int) -> tuple[int | None, str | None]:
    if roles is not None:
        if not roles:
            return None, None
        runs = _runs(roles)
        k = next((n for n, (s, e, _) in enumerate(runs) if s <= p < e), len(runs) - 1)
        return k, str(runs[k][2])
    if not messages:
        return None, None
    # EOS tokens the template puts before the first given message (a default system message: 1)
    offset = render_ids(tokenizer, messages[:1], add_generation_prompt=False, tools=tools).count(eos) - 1
    k = list(ids[:p]).count(eos) - offset
    if not 0 <= k < len(messages):
        return None, None
    return k, str(messages[k].get("role"))


def drift(tokenizer: Any, messages: Messages, ids: Sequence[int], *, roles: Sequence[str] | None = None,
          tools: Sequence[Mapping[str, Any]] | None = None, add_generation_prompt: bool = False,
          window: int = 8) -> Drift:
    """Compare an episode's token-in/token-out `ids` with the re-render of its final `messages`.

    The re-render is `apply_chat_template(messages, tools=tools, add_generation_prompt=...)`
    tokenized, as a trainer would build it. When the last message is an assistant's and `ids` end
    with EOS, the template's tokens after that final EOS (ChatML's `\\n`) are left out of the
    comparison: the model never samples them and the episode ends there.

    Args:
        tokenizer: the Hugging Face tokenizer (with its chat template) the episode was built with.
        messages: the episode's final message list (assistant contents as the decoded samples).
        ids: the episode's ids: first prompt, sampled turns, closing EOS and deltas, in order.
        roles: optional, one label per id: "assistant" for the tokens the model sampled, the
            message's role (or any other label) for the rest. Gives exact turns and assistant spans;
            without it, assistant turns are found after the template's generation prompt.
        tools: the tool schemas the episode was rendered with.
        add_generation_prompt: render with the generation prompt (an episode that ends on a delta).
        window: tokens shown either side of the first divergence.
    """
    ids = [int(i) for i in ids]
    if roles is not None and len(roles) != len(ids):
        raise ValueError(f"roles has {len(roles)} labels for {len(ids)} ids: give one label per id")
    eos = eos_id(tokenizer)
    render = render_ids(tokenizer, messages, add_generation_prompt=add_generation_prompt, tools=tools)
    base = render_ids(tokenizer, BASE_MESSAGES, add_generation_prompt=False, tools=tools)
    tail = base[len(base) - base[::-1].index(eos):] if eos in base else []
    if (messages and messages[-1].get("role") == "assistant" and not add_generation_prompt and tail
            and ids and ids[-1] == eos and render[-len(tail) - 1:] == [eos, *tail]):
        render = render[:-len(tail)]
    spans = _assistant_spans(tokenizer, ids, roles, tools, eos)
    retok = sum(_retokenized(tokenizer, ids[s:e], eos) for s, e in spans)
    name = template_name(tokenizer)
    if ids == render:
        return Drift("same", None, None, None, len(ids), len(render), 0, (), (), (), (), ("same",),
                     len(spans), retok, name)
    p = next((i for i, (a, b) in enumerate(zip(ids, render)) if a != b), min(len(ids), len(render)))
    ops = _align(ids, render, p)
    boundary_tokens = {eos, *tail}
    if getattr(tokenizer, "bos_token_id", None) is not None:
        boundary_tokens.add(int(tokenizer.bos_token_id))
    causes: list[str] = []
    for op in ops:
        c = _classify(tokenizer, op, ids, render, spans, boundary_tokens, eos)
        if c not in causes:
            causes.append(c)
    turn, role = _turn(p, ids, messages, roles, tokenizer, tools, eos)
    w0 = max(0, p - window)

    def toks(x: list[int]) -> tuple[str, ...]:
        return tuple(str(tokenizer.decode([i], skip_special_tokens=False)) for i in x)

    iw, rw = ids[w0:p + window], render[w0:p + window]
    return Drift(causes[0], p, turn, role, len(ids), len(render), w0, tuple(iw), tuple(rw), toks(iw), toks(rw),
                 tuple(causes), len(spans), retok, name)


def drift_summary(drifts: Iterable[Drift]) -> pd.DataFrame:
    """Episodes counted by cause: one row per cause (every cause, zeros included) and a last row
    "all". Columns: `episodes` (whose first divergence has that cause), `share` of all episodes,
    `episodes_any` (with that cause at any differing stretch), `assistant_turns`,
    `retokenized_turns` and `retokenized_share` (of those episodes' assistant turns, the share whose
    sampled ids are not what re-tokenizing their text gives)."""
    import pandas as pd

    drifts = list(drifts)
    rows = []
    for cause in (*CAUSES, "all"):
        group = [d for d in drifts if cause in ("all", d.cause)]
        turns = sum(d.assistant_turns for d in group)
        retok = sum(d.retokenized_turns for d in group)
        rows.append({
            "cause": cause, "episodes": len(group), "share": len(group) / len(drifts) if drifts else 0.0,
            "episodes_any": len(group) if cause == "all" else sum(cause in d.causes for d in drifts),
            "assistant_turns": turns, "retokenized_turns": retok,
            "retokenized_share": retok / turns if turns else 0.0,
        })
    return pd.DataFrame(rows).set_index("cause")
