"""The dataset an import joins (issue 45, defects 5 and 6): a join that matches nothing, or a prompt
listed twice with different values, is warned of (LogImportWarning) and said in the notes; the
dataset is taken in the forms people hold it in, and anything else is refused saying which."""

from __future__ import annotations

import importlib.util
import json
import warnings
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

import rlgen

DATA = Path(__file__).resolve().parents[1] / "data"
TRL = DATA / "trl-1.16.0-grpo"


@pytest.fixture(scope="module")
def tokenizer(model_path: str) -> str:
    return model_path


def _records() -> list[dict[str, Any]]:
    """The dataset tests/data/make_trl_fixture.py trained on, as records {"prompt": chat, "answer"}."""
    spec = importlib.util.spec_from_file_location("make_trl_fixture", DATA / "make_trl_fixture.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return [{"prompt": ([{"role": "system", "content": s}] if s else []) + [{"role": "user", "content": q}], "answer": a}
            for s, q, a in module.ROWS]


def _logged_answers() -> list[str]:
    """The answer of each logged row of step 10, from the script's dataset by the user message."""
    raw = pd.read_parquet(TRL / "completions" / "completions_00010.parquet")
    by_question = {r["prompt"][-1]["content"]: r["answer"] for r in _records()}
    return [by_question[list(p)[-1]["content"]] for p in raw["prompt"]]


@pytest.mark.timeout(300)
def test_a_dataset_join_that_matches_no_row_warns_and_says_what_to_check(tmp_path: Path, tokenizer: str) -> None:
    other = pd.DataFrame({"prompt": ["What is 2 + 2?", "Name a colour."], "answer": ["4", "red"]})
    with pytest.warns(UserWarning, match=r"matched none of the 24 rows.*dataset_prompt=") as record:
        log = rlgen.RolloutLog.from_trl(TRL, tmp_path / "run", tokenizer=tokenizer, dataset=other)
    assert {w.category.__name__ for w in record if "matched none" in str(w.message)} == {"LogImportWarning"}
    assert {w.filename for w in record if "matched none" in str(w.message)} == {__file__}  # points at the call
    assert any("0 of 24 rows matched" in n for n in log.notes)
    assert any("matched none of the 24 rows" in n for n in log.notes)
    assert log.load(10).df["answer"].isna().all()


@pytest.mark.timeout(300)
def test_a_prompt_listed_twice_with_different_answers_is_left_unjoined_and_warned(tmp_path: Path,
                                                                                 tokenizer: str) -> None:
    records = _records()
    first = pd.read_parquet(TRL / "completions" / "completions_00010.parquet")["prompt"][0]
    question = list(first)[-1]["content"]
    records.append({"prompt": [{"role": "user", "content": question}], "answer": "not the answer"})
    with pytest.warns(UserWarning, match=r"ambiguous: 1 prompts are listed more than once .* 4 logged rows") as record:
        log = rlgen.RolloutLog.from_trl(TRL, tmp_path / "run", tokenizer=tokenizer, dataset=pd.DataFrame(records))
    assert {w.category.__name__ for w in record if "ambiguous" in str(w.message)} == {"LogImportWarning"}
    df = log.load(10).df
    questions = [m[-1]["content"] for m in df["prompt_messages"]]
    assert df["answer"][[q == question for q in questions]].isna().all()
    assert df["answer"][[q != question for q in questions]].notna().all()
    assert any("20 of 24 rows matched" in n for n in log.notes) and not any("24 of 24" in n for n in log.notes)


@pytest.mark.timeout(300)
def test_a_prompt_listed_twice_with_the_same_values_joins_without_a_warning(tmp_path: Path, tokenizer: str) -> None:
    records = _records()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        log = rlgen.RolloutLog.from_trl(TRL, tmp_path / "run", tokenizer=tokenizer,
                                        dataset=pd.DataFrame(records + records[:3]))
    assert any("24 of 24 rows matched" in n for n in log.notes)


@pytest.mark.timeout(300)
def test_a_dataset_is_taken_as_a_list_of_dicts_a_datasets_dataset_or_a_json_jsonl_or_parquet_file(
        tmp_path: Path, tokenizer: str) -> None:
    import datasets
    import pyarrow as pa
    import pyarrow.parquet as pq

    records = _records()
    (tmp_path / "rows.json").write_text(json.dumps(records))
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    pq.write_table(pa.Table.from_pylist(records), tmp_path / "rows.parquet")
    hf = datasets.Dataset.from_list(records)
    hf.to_json(str(tmp_path / "hf.json"))  # JSON lines under a .json name, as datasets writes it
    forms: dict[str, Any] = {"list": records, "datasets": hf, "json": tmp_path / "rows.json",
                             "jsonl": str(tmp_path / "rows.jsonl"), "parquet": tmp_path / "rows.parquet",
                             "hf-json": tmp_path / "hf.json"}
    for name, dataset in forms.items():
        log = rlgen.RolloutLog.from_trl(TRL, tmp_path / name, tokenizer=tokenizer, dataset=dataset)
        assert log.load(10).df["answer"].tolist() == _logged_answers(), name
        assert any("24 of 24 rows matched" in n for n in log.notes), name


def test_a_dataset_of_another_kind_is_refused_with_the_forms_accepted(tmp_path: Path) -> None:
    import datasets

    accepted = r"a pandas DataFrame, a datasets.Dataset, a list of dicts \(one per row\), or the path of a .json"
    for wrong in (42, {"prompt": ["p"]}, [], ("a", "b")):
        with pytest.raises(TypeError, match=accepted):
            rlgen.RolloutLog.from_trl(TRL, tmp_path / "run", tokenizer=None, dataset=wrong)
    with pytest.raises(ValueError, match=r"suffix must be .json, .jsonl or .parquet"):
        rlgen.RolloutLog.from_trl(TRL, tmp_path / "run", tokenizer=None, dataset="rows.csv")
    with pytest.raises(FileNotFoundError, match=r"is not a file"):
        rlgen.RolloutLog.from_trl(TRL, tmp_path / "run", tokenizer=None, dataset=tmp_path / "missing.jsonl")
    splits = datasets.DatasetDict({"train": datasets.Dataset.from_list(_records())})
    with pytest.raises(TypeError, match=r"DatasetDict of splits \['train'\]: pass the split"):
        rlgen.RolloutLog.from_verl(DATA / "verl-0.9.1" / "rollout_data", tmp_path / "run", tokenizer=None,
                                   dataset=splits)
    assert not (tmp_path / "run").exists()
