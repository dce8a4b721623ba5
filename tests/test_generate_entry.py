"""generate()'s entry point: a mistyped option fails with a short traceback, before any server use;
plain-text prompts to a chat model get one hint per Engine on how to send chats."""

from __future__ import annotations

import traceback
import warnings

import pytest

import rlgen
from rlgen.engine._generation import CallWarnings


def Stub() -> rlgen.Engine:
    """An Engine with no server at all: anything past the options check would fail differently."""
    return rlgen.Engine.__new__(rlgen.Engine)


def tok(chat_template: str | None) -> object:
    return type("Tok", (), {"chat_template": chat_template})()


def rlgen_frames(excinfo: pytest.ExceptionInfo) -> list[str]:
    return [f"{f.filename}:{f.name}" for f in traceback.extract_tb(excinfo.tb) if "/rlgen/" in f.filename]


@pytest.mark.parametrize("call", ["generate", "stream"])
def test_a_mistyped_option_fails_at_the_public_method_with_one_rlgen_frame(call):
    with pytest.raises(TypeError, match="max_new_tokn") as excinfo:
        getattr(Stub(), call)(["x"] if call == "generate" else "x", max_new_tokn=3)
    frames = rlgen_frames(excinfo)
    assert len(frames) == 1 and frames[0].endswith(f":{call}"), frames
    assert excinfo.value.__suppress_context__


def test_a_bad_option_value_also_fails_before_any_server_use():
    with pytest.raises((TypeError, ValueError)) as excinfo:
        Stub().generate(["x"], n=0)
    assert len(rlgen_frames(excinfo)) == 1


def test_agenerate_checks_its_options_first_too():
    import asyncio

    with pytest.raises(TypeError, match="max_new_tokn") as excinfo:
        asyncio.run(Stub().agenerate(["x"], max_new_tokn=3))
    assert len(rlgen_frames(excinfo)) == 1


def test_plain_text_to_a_chat_model_warns_once_per_engine_with_how_to_send_chats():
    hints = CallWarnings()  # an Engine's
    chat_model = tok("{% for m in messages %}...{% endfor %}")
    with pytest.warns(UserWarning, match=r'\[\{"role": "user", "content": text\}\]') as caught:
        hints.plain_text_to_chat_model(["What is 2+2?"], chat_model)
    assert caught[0].filename == __file__  # the caller's line
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        hints.plain_text_to_chat_model("again", chat_model)  # once per Engine
        CallWarnings().plain_text_to_chat_model([[{"role": "user", "content": "hi"}]], tok("t"))  # chats
        CallWarnings().plain_text_to_chat_model([[1, 2, 3]], tok("t"))  # token ids
        CallWarnings().plain_text_to_chat_model(["text"], tok(None))  # a base model
