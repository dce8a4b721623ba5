"""An import's notes say what it knows and what it guessed (issue 45, defect 7): finish reasons with
their counts as they were set, the chat template's default system message the logged prompt does
not show, schema drift between files, a logged step unlike the file name, re-tokenized rows longer
than the run could sample. On TRL 1.16.0's and verl 0.9.1's own files (tests/data)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

import rlgen

DATA = Path(__file__).resolve().parents[1] / "data"
TRL = DATA / "trl-1.16.0-grpo"
VERL = DATA / "verl-0.9.1" / "rollout_data"


@pytest.fixture(scope="module")
def tokenizer(model_path: str) -> str:
    return model_path


def _note(log: rlgen.RolloutLog, start: str) -> str:
    found = [n for n in log.notes if n.startswith(start)]
    assert found, f"no note starts with {start!r}: {log.notes}"
    return found[0]


def _trl_copy(folder: Path, edit: Any = None) -> Path:
    """TRL's completions, each file through `edit(step, df)` (returning the df to write)."""
    (folder / "completions").mkdir(parents=True)
    for f in sorted((TRL / "completions").glob("*.parquet")):
        df = pd.read_parquet(f)
        (edit(int(f.stem.split("_")[1]), df) if edit else df).to_parquet(folder / "completions" / f.name)
    return folder


@pytest.mark.timeout(300)
def test_the_finish_reason_note_counts_the_stop_rows_that_logged_completion_ids_tell(tmp_path: Path,
                                                                                     tokenizer: str) -> None:
    log = rlgen.RolloutLog.from_trl(TRL, tmp_path / "run", tokenizer=tokenizer, max_completion_length=24)
    finish = log.rows(columns=["finish_reason"])["finish_reason"].value_counts().to_dict()
    assert finish == {"stop": 14, "length": 10}
    assert _note(log, "finish reasons:") == ("finish reasons: 'stop' where the logged completion_ids end with EOS "
                                             "(14 rows), 'length' where a completion has >= 24 tokens (10 rows), "
                                             "'unknown' otherwise (0 rows)")


@pytest.mark.timeout(300)
def test_the_chat_templates_default_system_message_the_logged_prompt_lacks_is_said(tmp_path: Path,
                                                                                   tokenizer: str) -> None:
    log = rlgen.RolloutLog.from_trl(TRL, tmp_path / "run", tokenizer=tokenizer)
    default = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
    note = _note(log, "system message:")
    assert "20 of 24 rows are chats without one in the log" in note and repr(default) in note
    rows = log.rows(columns=["prompt", "prompt_messages"])
    bare = [not any(m["role"] == "system" for m in messages) for messages in rows["prompt_messages"]]
    assert sum(bare) == 20
    assert all(default in p for p, b in zip(rows["prompt"], bare) if b)  # the rows hold what the note says
    verl = rlgen.RolloutLog.from_verl(VERL, tmp_path / "verl", tokenizer=tokenizer)
    assert not any(n.startswith("system message:") for n in verl.notes)  # verl's input text shows it already


def test_a_template_that_adds_no_system_message_is_told_apart() -> None:
    from rlgen.rollout_log._text_rows import default_system_message

    class Plain:  # renders each message as "<role>: <content>\n", adds nothing
        def apply_chat_template(self, messages: list[dict[str, str]], **_: Any) -> str:
            return "".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant: "

    class Default(Plain):
        def apply_chat_template(self, messages: list[dict[str, str]], **kw: Any) -> str:
            if messages[0]["role"] != "system":
                messages = [{"role": "system", "content": "Be brief."}, *messages]
            return super().apply_chat_template(messages, **kw)

    chat = [{"role": "user", "content": "Hi"}]
    assert default_system_message(Plain(), chat) is None
    assert default_system_message(Default(), chat) == "Be brief."


@pytest.mark.timeout(300)
def test_schema_drift_between_files_and_a_step_column_unlike_the_file_name_are_noted(tmp_path: Path,
                                                                                     tokenizer: str) -> None:
    def edit(step: int, df: pd.DataFrame) -> pd.DataFrame:
        if step == 20:  # a log_extra column from step 20 on
            df.insert(df.columns.get_loc("advantage"), "turns", 1)
        if step == 25:  # another reward function, completion_tokens no longer logged, the step column off by one
            df.insert(df.columns.get_loc("completion_ids"), "polite", 0.5)
            df = df.drop(columns=["completion_tokens"]).assign(step=24)
        return df

    log = rlgen.RolloutLog.from_trl(_trl_copy(tmp_path / "trl", edit), tmp_path / "run", tokenizer=tokenizer)
    assert log.notes[0].endswith("reward columns differ between files: ['correct', 'brief'], then from step 25: "
                                 "['correct', 'brief', 'polite']")
    drift = _note(log, "schema drift:")
    assert "step 20 adds ['turns']" in drift and "step 25 adds ['polite'], drops ['completion_tokens', 'turns']" in drift
    assert _note(log, "step 'step' disagrees").startswith(
        "step 'step' disagrees with the file name in 1 files (completions_00025.parquet says [24]): the file name's "
        "step is used")
    assert log.steps == [10, 20, 25]

    verl = tmp_path / "verl"
    shutil.copytree(VERL, verl)
    lines = [json.loads(line) for line in (verl / "4.jsonl").read_text().splitlines()]
    (verl / "4.jsonl").write_text("".join(json.dumps({**{k: v for k, v in r.items() if k != "pred"}, "step": 40}) + "\n"
                                          for r in lines))
    log = rlgen.RolloutLog.from_verl(verl, tmp_path / "verl-run", tokenizer=tokenizer)
    assert "step 4 drops ['pred']" in _note(log, "schema drift:") and "step 5 adds ['pred']" in _note(log, "schema drift:")
    assert "(4.jsonl says [40])" in _note(log, "step 'step' disagrees")


@pytest.mark.timeout(300)
def test_retokenized_rows_longer_than_max_completion_length_are_flagged(tmp_path: Path, tokenizer: str) -> None:
    folder = _trl_copy(tmp_path / "trl", lambda step, df: df.drop(columns=["completion_ids"]))
    log = rlgen.RolloutLog.from_trl(folder, tmp_path / "run", tokenizer=tokenizer, max_completion_length=24)
    lengths = log.rows(columns=["completion_tokens"])["completion_tokens"]
    assert (lengths > 24).sum() == 2 and lengths.max() == 25  # TRL sampled at most 24; the text re-tokenizes to 25
    assert _note(log, "2 rows have more tokens than max_completion_length=24").startswith(
        "2 rows have more tokens than max_completion_length=24 (up to 25 > 24; steps [20, 25]): the run cannot have "
        "sampled that many: re-tokenizing the decoded text gave other ids than were sampled")
    assert "'unknown' otherwise" in _note(log, "finish reasons:") and "'stop'" not in _note(log, "finish reasons:")
