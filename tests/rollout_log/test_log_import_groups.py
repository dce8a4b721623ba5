"""RolloutLog.from_trl / from_verl form GRPO groups as the framework did (issue 45, defect 2): TRL's
groups are `num_generations` consecutive rows, not rows of one prompt text (tests/data/
trl-1.16.0-grpo-repeated: TRL 1.16.0 wrote a step whose one question fills two groups); verl's are
its `uid` where the rows carry one."""

from __future__ import annotations

import json
import pickle
import shutil
import warnings
import zipfile
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import rlgen

DATA = Path(__file__).resolve().parents[1] / "data"
REPEATED = DATA / "trl-1.16.0-grpo-repeated"
TRL = DATA / "trl-1.16.0-grpo"
VERL = DATA / "verl-0.9.1" / "rollout_data"


@pytest.fixture(scope="module")
def tokenizer(model_path: str) -> str:
    return model_path


def _completions_only(src: Path, dst: Path) -> Path:
    """A copy of a TRL output_dir without its training_args.bin (a run that never saved)."""
    shutil.copytree(src / "completions", dst / "completions")
    return dst


@pytest.mark.timeout(300)
def test_a_question_twice_in_one_trl_step_stays_two_groups_with_the_advantages_trl_logged(tmp_path: Path,
                                                                                           tokenizer: str) -> None:
    log = rlgen.RolloutLog.from_trl(REPEATED, tmp_path / "run", tokenizer=tokenizer)
    raw = pd.read_parquet(REPEATED / "completions" / "completions_00001.parquet")
    assert raw["prompt"].astype(str).nunique() == 1  # one question fills the step: TRL formed two groups of it
    res = log.load(1)
    assert res.df["prompt_index"].tolist() == [0, 0, 0, 0, 1, 1, 1, 1]
    reward = (raw["correct"] + raw["brief"]).to_numpy()
    assert res.df["group_mean"].tolist() == pytest.approx([reward[:4].mean()] * 4 + [reward[4:].mean()] * 4)
    assert res.advantages("grpo").tolist() == pytest.approx(raw["advantage"].tolist(), abs=1e-3)
    # The diff groups by (part, prompt_index): its GRPO advantages are TRL's too.
    log.rescore({"correct": lambda completion: 0.0}, version="zero", mode="inline", progress=False)
    diff = log.diff("logged", "zero", steps=1)
    assert diff.advantages["grpo_logged"].tolist() == pytest.approx(raw["advantage"].tolist(), abs=1e-3)
    assert len(diff.groups) == 2
    assert any("4 consecutive rows each (num_generations from" in n and "training_args.bin" in n for n in log.notes)
    assert any("3 groups repeat a prompt" in n for n in log.notes)
    assert any("reproduces it on all 24 rows" in n for n in log.notes)
    assert any("max_completion_length=24" in n for n in log.notes)  # the run's own setting, read as data


@pytest.mark.timeout(300)
def test_without_the_runs_settings_the_group_size_is_the_one_that_reproduces_the_logged_advantage(
        tmp_path: Path, tokenizer: str) -> None:
    folder = _completions_only(REPEATED, tmp_path / "trl")
    log = rlgen.RolloutLog.from_trl(folder, tmp_path / "run", tokenizer=tokenizer)
    assert log.load(2).df["prompt_index"].tolist() == [0, 0, 0, 0, 1, 1, 1, 1]
    assert any("inferred: the size whose groups reproduce the logged advantage" in n for n in log.notes)
    plain = rlgen.RolloutLog.from_trl(_completions_only(TRL, tmp_path / "plain"), tmp_path / "run2", tokenizer=tokenizer)
    assert plain.load(10).df["prompt_index"].tolist() == [0, 0, 0, 0, 1, 1, 1, 1]


@pytest.mark.timeout(300)
def test_a_group_size_given_is_checked_against_the_prompts_and_the_logged_advantage(tmp_path: Path,
                                                                                   tokenizer: str) -> None:
    folder = _completions_only(REPEATED, tmp_path / "trl")
    with pytest.raises(rlgen.LogError, match=r"8 rows, not a multiple of num_generations=3.*pass the run's"):
        rlgen.RolloutLog.from_trl(folder, tmp_path / "a", tokenizer=tokenizer, num_generations=3)
    with pytest.raises(rlgen.LogError, match=r"num_generations=8 \(num_generations as given\) puts rows of different "
                                             r"prompts in one group at step 10"):
        rlgen.RolloutLog.from_trl(TRL, tmp_path / "b", tokenizer=tokenizer, num_generations=8)
    from rlgen.rollout_log import LogImportWarning

    # Groups of 2 share a prompt here, but TRL normalised groups of 4: the logged advantage says so.
    with pytest.warns(LogImportWarning, match=r"logged advantage: differs from GRPO's .* on \d+ of 24 rows"):
        log = rlgen.RolloutLog.from_trl(folder, tmp_path / "c", tokenizer=tokenizer, num_generations=2)
    assert log.load(1).df["prompt_index"].tolist() == [0, 0, 1, 1, 2, 2, 3, 3]
    assert any("differs from GRPO's" in n and "pass num_generations=" in n for n in log.notes)


def test_the_runs_settings_are_read_as_data_and_nothing_in_them_runs(tmp_path: Path) -> None:
    from rlgen.rollout_log._import_trl import run_settings

    settings, source, unread = run_settings(REPEATED)
    assert unread is None and source == str(REPEATED / "training_args.bin")
    assert settings["num_generations"] == 4 and settings["scale_rewards"] == "group"
    assert settings["num_iterations"] == 1 and settings["max_completion_length"] == 24

    class Planted:
        def __reduce__(self) -> tuple[object, tuple[str]]:
            return (Path.touch, (str(tmp_path / "ran"),))

    folder = tmp_path / "out"
    folder.mkdir()
    with zipfile.ZipFile(folder / "training_args.bin", "w") as z:
        z.writestr("training_args/data.pkl", pickle.dumps({"num_generations": Planted()}))
    settings, _, unread = run_settings(folder)
    assert unread is None and not (tmp_path / "ran").exists()
    (folder / "training_args.bin").write_bytes(b"not a zip")
    settings, _, unread = run_settings(folder)
    assert settings == {} and unread is not None and "cannot be read" in unread
    checkpoint = tmp_path / "ck" / "checkpoint-3"
    checkpoint.mkdir(parents=True)
    shutil.copy(REPEATED / "training_args.bin", checkpoint)
    assert run_settings(tmp_path / "ck")[0]["num_generations"] == 4


def _verl_step(folder: Path, *, uid: bool) -> None:
    """verl's step-1 dump with its first group's input given to the second group too (one prompt
    sampled twice in a step), with or without a uid per group."""
    lines = [json.loads(line) for line in (VERL / "1.jsonl").read_text().splitlines()]
    for k, line in enumerate(lines):
        line["input"] = lines[0]["input"]
        if uid:
            line["uid"] = f"group-{k // 4}"
    folder.mkdir(parents=True, exist_ok=True)
    for f in VERL.glob("*.jsonl"):
        shutil.copy(f, folder / f.name)
    (folder / "1.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))


@pytest.mark.timeout(300)
def test_verl_rows_with_a_uid_are_grouped_by_it_and_without_one_a_merged_group_is_noted(tmp_path: Path,
                                                                                          tokenizer: str) -> None:
    _verl_step(tmp_path / "uid", uid=True)
    log = rlgen.RolloutLog.from_verl(tmp_path / "uid", tmp_path / "run", tokenizer=tokenizer)
    assert log.load(1).df["prompt_index"].tolist() == [0, 0, 0, 0, 1, 1, 1, 1]
    assert any("by verl's uid" in n for n in log.notes)
    from rlgen.rollout_log import LogImportWarning

    _verl_step(tmp_path / "text", uid=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error", LogImportWarning)
        log = rlgen.RolloutLog.from_verl(tmp_path / "text", tmp_path / "run2", tokenizer=tokenizer)
    assert np.bincount(log.load(1).df["prompt_index"]).tolist() == [8]
    assert any("1 groups have more rows than the usual 4" in n for n in log.notes)
