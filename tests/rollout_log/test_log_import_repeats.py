"""Rows a framework logged again under another step (issue 45, defect 10): TRL 1.16.0 with
num_iterations=2 logged each generation batch under two steps (tests/data/trl-1.16.0-grpo-iterations,
written by its GRPOTrainer); the import says, in a warning and in the notes, which steps repeat which."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

import rlgen

DATA = Path(__file__).resolve().parents[1] / "data"
ITERATIONS = DATA / "trl-1.16.0-grpo-iterations"


@pytest.fixture(scope="module")
def tokenizer(model_path: str) -> str:
    return model_path


@pytest.mark.timeout(300)
def test_trl_rows_logged_again_under_later_steps_are_warned_of_and_noted(tmp_path: Path, tokenizer: str) -> None:
    with pytest.warns(UserWarning, match=r"rows repeated under several steps \(2 steps\): step 2 repeats step 1's "
                                         r"rows; step 4 repeats step 3's rows") as record:
        log = rlgen.RolloutLog.from_trl(ITERATIONS, tmp_path / "run", tokenizer=tokenizer)
    assert {w.category.__name__ for w in record if "repeated" in str(w.message)} == {"LogImportWarning"}
    assert {w.filename for w in record if "repeated" in str(w.message)} == {__file__}  # points at the call
    note = next(n for n in log.notes if n.startswith("rows repeated under several steps"))
    assert "num_iterations > 1" in note and "log.rows(steps=[1, 3])" in note
    assert log.steps == [1, 2, 3, 4]  # kept as logged: the note says how to count each batch once
    assert log.load(2).df["completion"].tolist() == log.load(1).df["completion"].tolist()


@pytest.mark.timeout(300)
def test_steps_whose_rows_are_their_own_are_not_said_to_repeat(tmp_path: Path, tokenizer: str) -> None:
    for k, folder in enumerate((DATA / "trl-1.16.0-grpo", DATA / "trl-1.16.0-grpo-repeated")):
        with warnings.catch_warnings(record=True) as record:
            warnings.simplefilter("always")
            log = rlgen.RolloutLog.from_trl(folder, tmp_path / f"run{k}", tokenizer=tokenizer)
        assert not [w for w in record if "repeated" in str(w.message)]
        assert not any(n.startswith("rows repeated") for n in log.notes)
