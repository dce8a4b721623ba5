"""A log of multi-turn episodes (one real CPU server): appended `Episodes` read back as `Episodes`,
with their turns, loss mask and rows, and re-scored over their messages."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import rlgen

BACKEND = os.environ.get("RLGEN_TEST_BACKEND", "cpu")


def twice(messages: list[dict[str, Any]], data: Any) -> str:
    return "Are you sure?" if sum(m["role"] == "assistant" for m in messages) < 2 else "done"


@pytest.mark.timeout(300)
def test_episodes_logged_by_step_load_back_as_episodes_and_rescore_over_their_messages(tmp_path: Path,
                                                                                       model_path: str) -> None:
    with rlgen.Engine(model_path, backend=BACKEND, progress=False) as eng:
        steps = [eng.episodes(["What is 2+2?"], env=twice, n=2, max_turns=3, max_new_tokens=6, temperature=1.0,
                              sampling_seed=step, progress=False) for step in range(2)]
    log = rlgen.RolloutLog.create(tmp_path / "run")
    for step, res in enumerate(steps):
        log.append(step, res)
    back = log.load(1)
    assert isinstance(back, rlgen.Episodes) and back.df["turns"].tolist() == steps[1].df["turns"].tolist()
    assert np.array_equal(back.tensors()["loss_mask"], steps[1].tensors()["loss_mask"])
    assert back.turns.shape == steps[1].turns.shape
    both = log.load()
    assert isinstance(both, rlgen.Episodes) and len(both) == 4
    # A TRL-style function gets each episode's messages after the prompt, as add_rewards gives them.
    def assistant_turns(prompts: list[Any], completions: list[Any], **kwargs: Any) -> list[float]:
        return [float(sum(m["role"] == "assistant" for m in c)) for c in completions]

    log.rescore(assistant_turns, version="turns", mode="inline", progress=False)
    assert log.rewards("turns")["reward"].tolist() == [float(t) for t in both.df["turns"]]
