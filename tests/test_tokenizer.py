"""rlgen.client._tokenizer: the tokenizer AutoTokenizer gives, loaded without transformers once it is proven.

Identity first: on the default model and on tool-calling chat templates, the `LightTokenizer` (served
from the recorded state, without transformers) gives the same token ids, decoding, special tokens
and rendered chats (text and ids) as `AutoTokenizer.from_pretrained`. Then the records: the first
load writes them, a later one in a fresh interpreter imports neither torch nor transformers, a
changed file or a failed probe sends the load back through transformers. Nothing is downloaded:
the default model is the local conversion, the tool checkouts are its tokenizer with other templates.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from rlgen.client import _tokenizer, _tokenizer_snapshot
from rlgen.client._light_tokenizer import LightTokenizer
from rlgen.client._tokenizer import load_tokenizer, record_of

REPO = Path(__file__).resolve().parents[1]
TEXTS = [
    "Hello world", "\n\n", "a\n\nb\n\n\nc", " leading and trailing ", "\t\ttabs  and   spaces",
    "The capital of France\n\nis Paris. Le café 日本 🙂!", "👩‍👩‍👧 ñ ü Ω العربية हिन्दी 한국어 ЖЖ",
    "<|im_start|>user\nhi<|im_end|>", "<|endoftext|><|im_end|> special tokens mid-text <|im_start|>",
    "def f(x):\n    return {'a': [1, 2, 3]}  # code\n", "1234567890 3.14159 1e-9 0x1F", "",
]
CHATS = [
    [{"role": "user", "content": "What is 2+2?"}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi 日本 🙂\n\nthere"}],
    [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}, {"role": "user", "content": "c"},
     {"role": "assistant", "content": "d\n\n"}, {"role": "user", "content": "<|im_end|> as text"}],
]
TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "The weather in a city, e.g. Zürich or 東京.",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "description": "The city"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, "required": ["city"]}}},
    {"type": "function", "function": {"name": "add", "description": "a + b",
                                      "parameters": {"type": "object", "properties": {
                                          "a": {"type": "number"}, "b": {"type": "number"}}}}},
]
TOOL_CHAT = [
    {"role": "system", "content": "Use tools when they help."},
    {"role": "user", "content": "Weather in Zürich, and 2+3?"},
    {"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Zürich"}}},
        {"type": "function", "function": {"name": "add", "arguments": {"a": 2, "b": 3}}}]},
    {"role": "tool", "content": "{\"temp\": 21}"},
    {"role": "tool", "content": "5"},
    {"role": "assistant", "content": "21 °C, and 5."},
    {"role": "user", "content": "Thanks!"},
]
# A tool-calling template in the style of Qwen2.5's: tools as JSON (tojson), tool calls, tool
# results grouped (loop.previtem / nextitem), a namespace, a loop control and raise_exception.
TOOL_TEMPLATE = """{%- if tools %}
{{- '<|im_start|>system\\n' }}
{%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] }}{%- else %}{{- 'You are helpful.' }}{%- endif %}
{{- "\\n\\n# Tools\\n\\n<tools>" }}
{%- for tool in tools %}{{- "\\n" }}{{- tool | tojson }}{%- endfor %}
{{- "\\n</tools><|im_end|>\\n" }}
{%- elif messages[0]['role'] == 'system' %}
{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}
{%- endif %}
{%- set ns = namespace(turns=0) %}
{%- for message in messages %}
{%- if message.role == 'system' and loop.first %}{% continue %}{% endif %}
{%- if message.role not in ['user', 'assistant', 'tool'] %}{{ raise_exception('unknown role ' + message.role) }}{% endif %}
{%- set ns.turns = ns.turns + 1 %}
{%- if message.role == 'user' or (message.role == 'assistant' and not message.tool_calls) %}
{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}
{%- elif message.role == 'assistant' %}
{{- '<|im_start|>assistant' }}{%- if message.content %}{{- '\\n' + message.content }}{%- endif %}
{%- for tool_call in message.tool_calls %}
{%- set call = tool_call.function if tool_call.function is defined else tool_call %}
{{- '\\n<tool_call>\\n{"name": "' + call.name + '", "arguments": ' + call.arguments | tojson + '}\\n</tool_call>' }}
{%- endfor %}
{{- '<|im_end|>\\n' }}
{%- else %}
{%- if loop.index0 == 0 or loop.previtem.role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}
{{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' }}
{%- if loop.last or loop.nextitem.role != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}
{{- '' if ns.turns else '' }}"""


@pytest.fixture
def records(tmp_path, monkeypatch):
    """A private record store for one test."""
    monkeypatch.setenv("RLGEN_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache" / "tokenizers"


def tokenizer_copy(model_path: str, where: Path, template: str | None = None, extra: dict[str, str] | None = None) -> str:
    """The default model's tokenizer files (no weights) in `where`, with another chat template."""
    where.mkdir(parents=True)
    for name in os.listdir(model_path):
        if not name.endswith(".safetensors"):
            shutil.copy(Path(model_path) / name, where / name)
    if template is not None:
        (where / "chat_template.jinja").write_text(template)
    for name, text in (extra or {}).items():
        (where / name).parent.mkdir(parents=True, exist_ok=True)
        (where / name).write_text(text)
    return str(where)


def light_pair(path: str) -> tuple[object, LightTokenizer]:
    """AutoTokenizer's tokenizer of `path`, and the LightTokenizer a second `load_tokenizer` serves
    from the record (no transformers object behind it)."""
    from transformers import AutoTokenizer

    first = load_tokenizer(path)
    assert isinstance(first, LightTokenizer), record_of(path)
    light = load_tokenizer(path)
    assert isinstance(light, LightTokenizer) and light._hf is None
    return AutoTokenizer.from_pretrained(path), light


def assert_same_chats(hf, light, chats, **options) -> None:
    for gen in (True, False):
        text = light.apply_chat_template(chats, add_generation_prompt=gen, tokenize=False, **options)
        assert text == hf.apply_chat_template(chats, add_generation_prompt=gen, tokenize=False, **options)
        ids = light.apply_chat_template(chats, add_generation_prompt=gen, tokenize=True, return_dict=False, **options)
        assert ids == hf.apply_chat_template(chats, add_generation_prompt=gen, tokenize=True, return_dict=True,
                                             **options)["input_ids"]
        for chat, one_text, one_ids in zip(chats, text, ids):  # one chat alone gives the same as in a batch
            assert light.apply_chat_template(chat, add_generation_prompt=gen, tokenize=False, **options) == one_text
            assert light.apply_chat_template(chat, add_generation_prompt=gen, tokenize=True, return_dict=False,
                                             **options) == one_ids


def test_the_default_model_gives_the_same_ids_text_and_special_tokens_as_autotokenizer(records, model_path, tok):
    hf, light = light_pair(model_path)
    assert type(hf) is type(tok) and hf.get_vocab() == tok.get_vocab()
    assert len(light) == len(hf) and light.vocab_size == hf.vocab_size and light.get_vocab() == hf.get_vocab()
    for name in ("bos", "eos", "unk", "pad", "sep", "cls", "mask"):
        assert getattr(light, f"{name}_token") == getattr(hf, f"{name}_token"), name
        assert getattr(light, f"{name}_token_id") == getattr(hf, f"{name}_token_id"), name
    assert (light.eos_token_id, light.pad_token_id) == (2, 2)  # <|im_end|>, as SGLang and the CPU backend stop on
    assert light.special_tokens_map == hf.special_tokens_map and light.all_special_ids == hf.all_special_ids
    assert light.chat_template == hf.chat_template and light.model_max_length == hf.model_max_length
    assert light.name_or_path == hf.name_or_path == model_path
    for special in (True, False):
        batch = light(TEXTS, add_special_tokens=special)
        assert dict(batch) == dict(hf(TEXTS, add_special_tokens=special)) and batch.input_ids == batch["input_ids"]
        for text in TEXTS:
            assert dict(light(text, add_special_tokens=special)) == dict(hf(text, add_special_tokens=special)), text
            assert light.encode(text, add_special_tokens=special) == hf.encode(text, add_special_tokens=special)
    assert light("\n\n")["input_ids"] == hf("\n\n")["input_ids"] and len(light("\n\n")["input_ids"]) >= 1
    ids = hf(TEXTS, add_special_tokens=True)["input_ids"] + [[1, 2, 0, 5, 49151]]
    for row in ids:
        for skip in (False, True):
            for clean in (False, None):
                assert light.decode(row, skip_special_tokens=skip, clean_up_tokenization_spaces=clean) == \
                    hf.decode(row, skip_special_tokens=skip, clean_up_tokenization_spaces=clean), row
        assert light.convert_ids_to_tokens(row) == hf.convert_ids_to_tokens(row)
        assert light.convert_ids_to_tokens(row, skip_special_tokens=True) == \
            hf.convert_ids_to_tokens(row, skip_special_tokens=True)
        assert light.convert_tokens_to_ids(light.convert_ids_to_tokens(row)) == row
    assert light.batch_decode(ids, skip_special_tokens=True) == hf.batch_decode(ids, skip_special_tokens=True)
    # lists of ints go to the Rust backend in one call; tuples, arrays and numpy ints one by one: the same text
    assert light.batch_decode(ids) == hf.batch_decode(ids) == [hf.decode(row) for row in ids]
    import numpy as np
    mixed = [tuple(ids[0]), np.array(ids[1]), [np.int64(i) for i in ids[-1]]]
    assert light.batch_decode(mixed) == [hf.decode(list(map(int, row))) for row in mixed]
    for text in TEXTS:
        assert light.tokenize(text) == hf.tokenize(text)
    assert light.decode(2) == hf.decode(2) and light.convert_tokens_to_ids("not-a-token") == hf.unk_token_id


def test_the_default_template_renders_the_same_chats_as_autotokenizer(records, model_path):
    hf, light = light_pair(model_path)
    assert_same_chats(hf, light, CHATS)
    assert_same_chats(hf, light, CHATS, tools=TOOLS)  # the default template has no tools: both ignore them
    assert light.apply_chat_template(CHATS[0], tokenize=False, add_generation_prompt=True).endswith(
        "<|im_start|>assistant\n")
    assert light._hf is None, "a plain chat went to transformers"


@pytest.mark.parametrize("layout", ["jinja file", "named templates"])
def test_tool_calling_templates_render_the_same_tools_calls_and_results_as_autotokenizer(records, model_path,
                                                                                      tmp_path, layout):
    if layout == "jinja file":  # the tool template is the checkout's only one
        path = tokenizer_copy(model_path, tmp_path / "tools", TOOL_TEMPLATE)
    else:  # a default template and a named "tool_use" one, which transformers picks when tools are given
        path = tokenizer_copy(model_path, tmp_path / "named", None,
                              {"additional_chat_templates/tool_use.jinja": TOOL_TEMPLATE})
    hf, light = light_pair(path)
    assert light.chat_template == hf.chat_template
    assert isinstance(hf.chat_template, dict if layout == "named templates" else str)
    rendered = light.apply_chat_template(TOOL_CHAT, tools=TOOLS, add_generation_prompt=True, tokenize=False)
    assert '"name": "get_weather"' in rendered and "<tool_response>\n5\n</tool_response><|im_end|>" in rendered
    assert "Zürich" in rendered and "東京" in rendered  # tojson keeps non-ASCII, as transformers' does
    assert_same_chats(hf, light, [TOOL_CHAT, CHATS[1]], tools=TOOLS)
    assert_same_chats(hf, light, [CHATS[0], CHATS[2]])
    with pytest.raises(Exception, match="unknown role"):
        hf.apply_chat_template([{"role": "critic", "content": "x"}], tools=TOOLS, tokenize=False)
    with pytest.raises(Exception, match="unknown role"):
        light.apply_chat_template([{"role": "critic", "content": "x"}], tools=TOOLS, tokenize=False)
    assert light._hf is None


def test_the_sandbox_and_its_additions_are_the_ones_the_installed_transformers_has(records, model_path, tmp_path):
    path = tokenizer_copy(model_path, tmp_path / "sandbox",
                          "{% set ns = namespace(_secret=1) %}{{ messages[0].content }}")
    hf, light = light_pair(path)

    def outcome(tokenizer, **options):
        try:
            return tokenizer.apply_chat_template(CHATS[1], tokenize=False, **options)
        except Exception as err:
            return type(err).__name__

    # transformers 5.24 refuses an underscore name on a namespace (SecurityError); 5.17 rendered it:
    # the light one does what the transformers that made its snapshot does.
    assert outcome(light) == outcome(hf)
    for probe in ("{{ messages.__class__.__mro__ }}",
                  "{{ dict(a=1) }}{{ {'k': 'ü 日本', 'n': none} | tojson }}{{ messages | tojson(indent=2) }}{{ bos_token }}",
                  "{% for m in messages %}{% if loop.index > 1 %}{% break %}{% endif %}{{ m.content }}{% endfor %}"
                  "{% generation %}x{% endgeneration %}",
                  "{{ raise_exception('no') }}", "{{ strftime_now('%Y') | length }}"):
        assert outcome(light, chat_template=probe) == outcome(hf, chat_template=probe), probe
    assert outcome(hf, chat_template="{{ messages.__class__.__mro__ }}") == "SecurityError"


def test_what_the_light_path_does_not_handle_goes_to_transformers_with_the_same_answer(records, model_path, tmp_path):
    hf, light = light_pair(model_path)
    out = light.apply_chat_template(CHATS[0], add_generation_prompt=True, tokenize=True, return_dict=True)
    assert dict(out) == dict(hf.apply_chat_template(CHATS[0], add_generation_prompt=True, tokenize=True,
                                                     return_dict=True))
    assert light._hf is not None  # loaded on first use, once
    with_none = [{"role": "user", "content": "hi", "name": None}]
    assert light.apply_chat_template(with_none, tokenize=False) == hf.apply_chat_template(with_none, tokenize=False)
    assert light("hi", return_tensors="np")["input_ids"].tolist() == hf("hi", return_tensors="np")["input_ids"].tolist()
    assert light.pad(light(["a", "a b c"]))["input_ids"] == hf.pad(hf(["a", "a b c"]))["input_ids"]
    light.save_pretrained(tmp_path / "saved")  # an attribute it lacks: transformers' own
    from transformers import AutoTokenizer

    assert AutoTokenizer.from_pretrained(tmp_path / "saved")("a\n\nb")["input_ids"] == light("a\n\nb")["input_ids"]
    with pytest.raises(AttributeError, match="read-only"):
        light.pad_token = "<|endoftext|>"
    again = pickle.loads(pickle.dumps(light))
    assert isinstance(again, LightTokenizer) and again(TEXTS)["input_ids"] == hf(TEXTS)["input_ids"]


def test_a_fresh_interpreter_loads_the_recorded_tokenizer_without_torch_or_transformers(records, model_path):
    code = (
        "import sys, time\nt = time.perf_counter()\n"
        "from rlgen.client._tokenizer import load_tokenizer\n"
        f"tok = load_tokenizer({model_path!r})\n"
        "print(type(tok).__name__, round(time.perf_counter() - t, 2))\n"
        "print(sorted(m for m in ('torch', 'transformers', 'sympy', 'transformers.generation') if m in sys.modules))\n"
        "print(tok.apply_chat_template([{'role': 'user', 'content': 'hi'}], add_generation_prompt=True, tokenize=True,"
        " return_dict=False))\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    run = lambda: subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300,
                                 check=True).stdout.splitlines()
    first = run()  # through AutoTokenizer: writes the record
    assert first[0].startswith("LightTokenizer")  # AutoTokenizer's imports (torch, ...) are paid this once
    second = run()
    assert second[0].startswith("LightTokenizer") and second[1] == "[]", second
    assert second[2] == first[2]
    print(f"first load {first[0].split()[1]} s (AutoTokenizer, probes, record); later loads {second[0].split()[1]} s")


def test_a_changed_file_other_versions_or_a_failed_probe_go_back_through_transformers(records, model_path, tmp_path,
                                                                                   monkeypatch):
    path = tokenizer_copy(model_path, tmp_path / "ckpt")
    assert record_of(path) is None
    load_tokenizer(path)
    record = record_of(path)
    assert record["light"] and record["class"] == "TokenizersBackend" and record["why_not_light"] is None
    assert (records.stat().st_mode & 0o777) == 0o700
    config = Path(path) / "tokenizer_config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "model_max_length": 4096}))
    assert record_of(path) is None  # the next load decides again (and sees the new limit)
    assert load_tokenizer(path).model_max_length == 4096
    (Path(path) / "model.safetensors").write_bytes(b"new weights")  # weights are not part of the key
    assert record_of(path) is not None
    monkeypatch.setattr(_tokenizer, "_package_files", lambda name: [name, "another version"])
    assert record_of(path) is None
    # A tokenizer that fails a probe keeps transformers' object; its class is recorded, and a later
    # load calls that class directly.
    monkeypatch.setattr(_tokenizer, "differs", lambda hf, light: "decode [1, 2]")
    first = load_tokenizer(path)
    assert not isinstance(first, LightTokenizer)
    record = record_of(path)
    assert not record["light"] and record["why_not_light"] == "decode [1, 2]"
    later = load_tokenizer(path)
    assert type(later) is type(first) and later("a\n\nb")["input_ids"] == first("a\n\nb")["input_ids"]


def test_a_probe_that_answers_differently_is_found(model_path, tok):
    frozen = _tokenizer_snapshot.snapshot(tok)
    assert frozen is not None
    state, backend = frozen
    assert _tokenizer_snapshot.differs(tok, LightTokenizer(state, backend, hf=tok)) is None
    other = dict(state, chat_template=state["chat_template"].replace("helpful", "unhelpful"))
    assert _tokenizer_snapshot.differs(tok, LightTokenizer(other, backend, hf=tok)).startswith("chat")
    other = dict(state, special=dict(state["special"], pad="<|endoftext|>"))
    assert _tokenizer_snapshot.differs(tok, LightTokenizer(other, backend, hf=tok)) == "special ids"


def test_a_class_with_its_own_encoding_or_decoding_rules_is_left_to_transformers(tok):
    class OwnDecode(type(tok)):
        def decode(self, *args, **kwargs):
            return "its own"

    assert _tokenizer_snapshot._overrides(type(tok)) == []
    assert _tokenizer_snapshot._overrides(OwnDecode) == ["decode"]
    assert _tokenizer_snapshot._overrides(object) == list(_tokenizer_snapshot._SERVED)  # no Rust-backed base at all


def test_a_chat_template_environment_with_parts_it_cannot_rebuild_is_left_to_transformers(tok, monkeypatch):
    import jinja2.sandbox
    from transformers.utils import chat_template_utils

    assert _tokenizer_snapshot._jinja_profile() is not None

    def compile_with_a_mystery_global(template):
        env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.filters["tojson"] = lambda x, **kw: json.dumps(x, **{"ensure_ascii": False, **kw})
        env.globals["mystery"] = lambda: "?"
        return env.from_string(template)

    monkeypatch.setattr(chat_template_utils, "_compile_jinja_template", compile_with_a_mystery_global)
    assert _tokenizer_snapshot._jinja_profile() is None
    with pytest.raises(ValueError, match="chat-template environment"):
        _tokenizer_snapshot.snapshot(tok)
