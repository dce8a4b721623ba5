"""Test helpers for rlgen.episodes: the default tokenizer, a Qwen3-style thinking template built
locally on it, and a token-in/token-out episode built from messages."""

from __future__ import annotations

import json
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rlgen.episodes import closing_ids, first_prompt_ids, message_delta_ids

NL = 198  # '\n' on the default tokenizer
EOS = 2   # <|im_end|>

# ChatML, plus what Qwen3's template does to history: an assistant message before the last user
# message loses everything up to its `</think>` (and the newlines after it). Written for these tests.
THINK_TEMPLATE = r"""{%- set ns = namespace(last_user=-1) -%}
{%- for m in messages -%}{%- if m['role'] == 'user' -%}{%- set ns.last_user = loop.index0 -%}{%- endif -%}{%- endfor -%}
{%- for m in messages -%}
{%- set content = m['content'] -%}
{%- if m['role'] == 'assistant' and loop.index0 < ns.last_user and '</think>' in content -%}
{%- set content = content.split('</think>')[-1].lstrip('\n') -%}
{%- endif -%}
{{- '<|im_start|>' + m['role'] + '\n' + content + '<|im_end|>\n' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\n' -}}{%- endif -%}"""


def default_tokenizer() -> Any:
    from transformers import AutoTokenizer

    import rlgen

    return AutoTokenizer.from_pretrained(rlgen.resolve_model(None).path)


def tokenizer_with_template(directory: Path, template: str) -> Any:
    """The default model's tokenizer files copied into `directory`, with `template` as its chat template."""
    from transformers import AutoTokenizer

    import rlgen

    src = Path(rlgen.resolve_model(None).path)
    directory.mkdir(parents=True, exist_ok=True)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(src / name, directory / name)
    config = json.loads((directory / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    (directory / "chat_template.jinja").write_text(template)
    tok = AutoTokenizer.from_pretrained(str(directory))
    assert tok.chat_template == template
    return tok


def sampled(tok: Any, text: str, *, eos: bool = True) -> list[int]:
    """A sampled assistant turn as the model would give it: the text's tokens, then EOS."""
    return [*tok.encode(text, add_special_tokens=False), *([tok.eos_token_id] if eos else [])]


def build_episode(tok: Any, messages: Sequence[Mapping[str, Any]], turns: Sequence[Sequence[int]] | None = None,
                  tools: Sequence[Mapping[str, Any]] | None = None,
                  ) -> tuple[list[int], list[str], list[int], list[list[int]]]:
    """Token-in/token-out: the first prompt, each assistant turn's ids (`turns[k]`, else its text's
    tokens + EOS), a closing EOS where a turn has none, the delta of the messages that follow.
    Returns (ids, roles per id, mask per id, the prompt sent before each assistant turn)."""
    first = next(i for i, m in enumerate(messages) if m["role"] == "assistant")
    ids = first_prompt_ids(tok, messages[:first], tools=tools)
    roles = [str(messages[first - 1]["role"])] * len(ids)
    mask = [0] * len(ids)
    prompts: list[list[int]] = []
    k, i = 0, first
    while i < len(messages):
        assert messages[i]["role"] == "assistant"
        prompts.append(list(ids))
        turn = list(turns[k]) if turns is not None else sampled(tok, messages[i]["content"])
        ids += turn
        roles += ["assistant"] * len(turn)
        mask += [1] * len(turn)
        k, i = k + 1, i + 1
        new = []
        while i < len(messages) and messages[i]["role"] != "assistant":
            new.append(messages[i])
            i += 1
        if new:
            close = closing_ids(tok, turn)
            delta = message_delta_ids(tok, new, tools=tools)
            ids += close + delta
            roles += ["assistant"] * len(close) + [str(new[-1]["role"])] * len(delta)
            mask += [0] * (len(close) + len(delta))
    return ids, roles, mask, prompts
