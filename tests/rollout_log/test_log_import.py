"""RolloutLog.from_trl / from_verl on files the frameworks' own code wrote (tests/data: TRL 1.16.0's
GRPOTrainer on CPU; verl 0.9.1's rollout writer taken from its wheel), and on folders they do not know."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import pandas as pd
import pytest

import rlgen

DATA = Path(__file__).resolve().parents[1] / "data"
TRL = DATA / "trl-1.16.0-grpo"
VERL = DATA / "verl-0.9.1" / "rollout_data"


def _fixture_rows() -> list[tuple[str | None, str, str]]:
    """The dataset tests/data/make_trl_fixture.py trained on (its ROWS: system message or None,
    question, answer), read from the script (it imports nothing beyond the standard library at
    module level)."""
    spec = importlib.util.spec_from_file_location("make_trl_fixture", DATA / "make_trl_fixture.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return list(module.ROWS)


@pytest.fixture(scope="module")
def tokenizer(model_path: str) -> str:
    return model_path


def _dataset() -> pd.DataFrame:
    rows = _fixture_rows()
    chats = [([{"role": "system", "content": s}] if s else []) + [{"role": "user", "content": q}] for s, q, _ in rows]
    return pd.DataFrame({"prompt": chats, "answer": [a for _, _, a in rows]})


@pytest.mark.timeout(300)
def test_a_trl_run_imports_with_its_rewards_advantages_logged_ids_and_the_datasets_answers(tmp_path: Path,
                                                                                           tokenizer: str) -> None:
    log = rlgen.RolloutLog.from_trl(TRL, tmp_path / "run", tokenizer=tokenizer, dataset=_dataset(),
                                    max_completion_length=24)
    assert log.source == "trl" and log.steps == [10, 20, 25]
    raw = pd.read_parquet(TRL / "completions" / "completions_00020.parquet")
    res = log.load(20)
    assert res.df["reward_correct"].tolist() == raw["correct"].tolist()
    assert res.df["reward"].tolist() == (raw["correct"] + raw["brief"]).tolist()
    assert res.df["advantage"].tolist() == raw["advantage"].tolist()
    # The reward function logged the sampled ids (log_extra): they are the rows' ids, not re-tokenized.
    assert res.id_lists("response") == [list(map(int, ids)) for ids in raw["completion_ids"]]
    assert not res.df["retokenized"].any()
    stopped = [int(ids[-1]) == 2 for ids in raw["completion_ids"]]
    assert res.df["finish_reason"].tolist() == ["stop" if s else "length" for s in stopped]
    # TRL does not log the answer: joined from the dataset on the prompt, every row matched.
    assert res.df["answer"].notna().all() and any("8 of 8" in n or "24 of 24" in n for n in log.notes)
    assert set(res.df["prompt_index"]) == {0, 1} and res.df.groupby("prompt_index").size().tolist() == [4, 4]
    log.rescore({"correct": lambda completion, answer: float(str(answer).lower() in completion.lower())},
                version="again", mode="inline", progress=False)
    assert log.rewards("again")["reward"].tolist() == log.rows(columns=["reward_correct"])["reward_correct"].tolist()


@pytest.mark.timeout(300)
def test_without_logged_ids_trl_rows_are_retokenized_and_say_so(tmp_path: Path, tokenizer: str) -> None:
    folder = tmp_path / "trl" / "completions"
    folder.mkdir(parents=True)
    for f in (TRL / "completions").glob("*.parquet"):
        pd.read_parquet(f).drop(columns=["completion_ids"]).to_parquet(folder / f.name)
    log = rlgen.RolloutLog.from_trl(tmp_path / "trl", tmp_path / "run", tokenizer=tokenizer)
    res = log.load(10)
    assert res.df["retokenized"].all() and set(res.df["finish_reason"]) == {"unknown"}
    assert "logprobs" not in res.tensors() and not res.has_logprobs  # none was sampled here
    assert any("re-tokenized" in n for n in log.notes) and any("pass dataset=" in n for n in log.notes)
    assert any("one step in 10" in n for n in log.notes) and log.missing_steps() == []
    assert "re-tokenized from text" in res._repr_html_()


@pytest.mark.timeout(300)
def test_a_verl_dump_imports_with_its_score_ground_truth_and_fields(tmp_path: Path, tokenizer: str) -> None:
    log = rlgen.RolloutLog.from_verl(VERL, tmp_path / "run", tokenizer=tokenizer)
    assert log.source == "verl" and log.steps == [1, 2, 3, 4, 5, 6]
    lines = [json.loads(line) for line in (VERL / "3.jsonl").read_text().splitlines()]
    res = log.load(3)
    assert res.df["reward"].tolist() == [r["score"] for r in lines]
    assert res.df["ground_truth"].tolist() == [r["gts"] for r in lines]
    assert res.df["acc"].tolist() == [r["acc"] for r in lines] and res.df["retokenized"].all()
    assert res.df.groupby("prompt_index").size().tolist() == [4, 4]
    assert log.trend()["rows"].tolist() == [8] * 6


def test_folders_a_framework_did_not_write_or_wrote_in_another_layout_are_refused(tmp_path: Path) -> None:
    with pytest.raises(rlgen.LogError, match="does not exist"):
        rlgen.RolloutLog.from_trl(tmp_path / "nope", tmp_path / "run", tokenizer=None)
    (tmp_path / "empty").mkdir()
    with pytest.raises(rlgen.LogError, match=r"no completions_\*.parquet.*log_completions=True"):
        rlgen.RolloutLog.from_trl(tmp_path / "empty", tmp_path / "run", tokenizer=None)
    old = tmp_path / "old" / "completions"
    old.mkdir(parents=True)
    pd.DataFrame({"step": [1], "prompt": ["p"], "completion": ["c"], "reward": [1.0]}).to_parquet(old / "completions_00001.parquet")
    with pytest.raises(rlgen.LogError, match=r"not in the layout this rlgen reads \(TRL 1.16.*lacks \['advantage'\]"):
        rlgen.RolloutLog.from_trl(tmp_path / "old", tmp_path / "run", tokenizer=None)
    verl = tmp_path / "verl"
    verl.mkdir()
    (verl / "1.jsonl").write_text(json.dumps({"prompt": "p", "response": "r", "reward": 1}) + "\n")
    with pytest.raises(rlgen.LogError, match=r"verl 0.9 rollout_data_dir.*lacks \['input', 'output'"):
        rlgen.RolloutLog.from_verl(verl, tmp_path / "run", tokenizer=None)
    shutil.copy(VERL / "1.jsonl", verl / "1.jsonl")
    with open(verl / "2.jsonl", "w") as f:
        f.write((VERL / "2.jsonl").read_text()[:100])  # cut short mid-line
    with pytest.raises(rlgen.LogError, match=r"2.jsonl line 1 is not JSON.*cut short"):
        rlgen.RolloutLog.from_verl(verl, tmp_path / "run", tokenizer=None)
    assert not (tmp_path / "run").exists()


@pytest.mark.timeout(300)
def test_an_import_onto_an_existing_log_says_to_read_it_or_import_to_a_new_path(tmp_path: Path, tokenizer: str) -> None:
    first = rlgen.RolloutLog.from_verl(VERL, tmp_path / "run", tokenizer=tokenizer)
    with pytest.raises(rlgen.LogError, match=r"already at .*an import makes a new log, never adds to or replaces one; "
                                             r"read that one with rlgen.RolloutLog\(.*\), or import into a new path") as err:
        rlgen.RolloutLog.from_trl(TRL, tmp_path / "run", tokenizer=None)  # refused before any row is read for it
    assert "exist_ok" not in str(err.value)  # from_trl takes no exist_ok: the message names only what works
    assert rlgen.RolloutLog(tmp_path / "run").steps == first.steps
